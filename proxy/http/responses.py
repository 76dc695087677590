"""``POST /v1/responses``: OpenAI's Responses API, answered by the chat cascade.

The request is checked (:func:`proxy.http.validate.responses_request`), translated to a chat
request (:func:`proxy.http.responses_translate.chat_of`) and answered as chat answers it: local
first, the gate, budgets (the worst case of the whole translated body), the response cache, the
API's Chat Completions as the fallback, the ``x-frugal-*`` headers. The finished completion is
sent as a ``response`` object, or, with ``stream: true``, replayed as the Responses' typed events
(built from the finished answer: the API is asked for JSON, as a ``verify`` chat stream would
judge a local answer before its first byte).

State (:mod:`proxy.http.responses_state`): with ``previous_response_id`` the stored conversation
it ended (every earlier turn's input and output items, whichever route answered each) comes
before this turn's input, so the chat request, local or sent upstream, carries the whole
conversation and never one of our ids. With ``store`` (the default) the finished response and
its input items are kept, before the first byte is sent, so that the next turn can name it.

The ledger row's ``endpoint`` is ``responses``.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from proxy.http.chat import ChatHandler
from proxy.http.exchange import Exchange
from proxy.http.handler import aiter_of
from proxy.http.responses_state import ResponsesState, input_items
from proxy.http.responses_translate import chat_of, events, response_of
from proxy.http.validate import responses_request


class ResponsesHandler(ChatHandler):
    endpoint = "responses"
    prompt_param = "input"
    prompt_noun = "the input"

    async def handle(self, request: Request, ex: Exchange) -> Response:
        asked = await self.services.bodies.read(request, responses_request)
        state = self._state()
        previous = asked.get("previous_response_id")
        items = input_items(asked["input"])
        if previous is not None:
            earlier = await state.history(request, previous)
            body = chat_of({**asked, "input": [*earlier, *items]})
        else:
            body = chat_of(asked)
        if self.services.settings.server.log_content:
            ex.content_out = []
            ex.content_in = body["messages"]
        ex.body = body
        plan, threshold = self.begin(request, body, ex)
        ex.stream = bool(asked.get("stream"))  # the chat request itself is asked for JSON
        await self.admit(request, body, ex)  # the key's models; the cache entry
        answers: list[dict[str, Any]] = []

        def take(answer: dict[str, Any], _ex: Exchange, _raw: bytes | None) -> Response:
            answers.append(answer)
            return Response()  # not sent: the answer is stored first, then sent below

        await self._json(body, plan, threshold, ex, take)
        response = response_of(answers[0], asked)
        response["previous_response_id"] = previous
        if asked.get("store") is not False:
            response["store"] = await state.keep(request, response, items, ex.route)
        if ex.stream:
            return self.stream(aiter_of(events(response)), ex)
        return JSONResponse(response, headers=ex.headers())

    def _state(self) -> ResponsesState:
        state = self.services.responses
        if state is None:
            raise RuntimeError("the app was built without stored responses")
        return state
