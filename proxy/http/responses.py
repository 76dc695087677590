"""``POST /v1/responses``: OpenAI's Responses API, answered by the chat cascade.

The request is checked (:func:`proxy.http.validate.responses_request`), translated to a chat
request (:func:`proxy.http.responses_translate.chat_of`) and answered as chat answers it: local
first, the gate, budgets (the worst case of the whole translated body), the response cache, the
API's Chat Completions as the fallback, the ``x-frugal-*`` headers. The finished completion is
sent as a ``response`` object, or, with ``stream: true``, replayed as the Responses' typed events
(built from the finished answer: the API is asked for JSON, as a ``verify`` chat stream would
judge a local answer before its first byte).

The ledger row's ``endpoint`` is ``responses``. Nothing is stored yet: ``store`` is accepted and
ignored, ``previous_response_id`` is a 400.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from proxy.http.chat import ChatHandler, Send
from proxy.http.exchange import Exchange
from proxy.http.handler import aiter_of
from proxy.http.responses_translate import chat_of, events, response_of
from proxy.http.validate import responses_request


class ResponsesHandler(ChatHandler):
    endpoint = "responses"
    prompt_param = "input"
    prompt_noun = "the input"

    async def handle(self, request: Request, ex: Exchange) -> Response:
        asked = await self.services.bodies.read(request, responses_request)
        body = chat_of(asked)
        if self.services.settings.server.log_content:
            ex.content_out = []
            ex.content_in = body["messages"]
        ex.body = body
        plan, threshold = self.begin(request, body, ex)
        ex.stream = bool(asked.get("stream"))  # the chat request itself is asked for JSON
        await self.admit(request, body, ex)  # the key's models; the cache entry
        return await self._json(body, plan, threshold, ex, self._sender(asked))

    def _sender(self, asked: dict[str, Any]) -> Send:
        def send(answer: dict[str, Any], ex: Exchange, _raw: bytes | None) -> Response:
            response = response_of(answer, asked)
            if ex.stream:
                return self.stream(aiter_of(events(response)), ex)
            return JSONResponse(response, headers=ex.headers())

        return send
