"""``POST /v1/completions`` (legacy text completions) and ``POST /v1/embeddings``.

Legacy completions take the same cascade as chat: a pre-route check (:mod:`proxy.params`), a
local attempt (the raw prompt, no chat template) scored by the quality gate, and the API when the
answer is not good enough. A streamed request gets the local answer replayed as OpenAI's
``text_completion`` chunks after it was scored; on the API route the proxy asks for JSON and
replays that, so a fallback can still happen before the first byte.

Embeddings are not made locally: they pass through to the API.

Both reuse the chat handler's bookkeeping (:class:`proxy.http.chat.Exchange`): the routing headers,
the log line and exactly one ledger row, whose ``endpoint`` is ``completions`` or ``embeddings``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, Iterator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from proxy.engine import legacy
from proxy.errors import (
    BadRequest,
    LocalUnavailable,
    ProxyError,
    map_upstream_exception,
)
from proxy.http import sse
from proxy.http.chat import ChatHandler, Exchange
from proxy.http.validate import completions_request, embeddings_request, parse_json
from proxy.routing.router import LOCAL_ALIAS, ROUTE_HEADER, Router


def public_text_completion(completion: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
    """The engine's text completion as OpenAI sends it: logprobs only when asked for."""
    out = {k: v for k, v in completion.items() if k != "frugal"}
    out["usage"] = sse.public_usage(completion.get("usage") or {})
    wanted = body.get("logprobs")
    choices = []
    for choice in completion["choices"]:
        choice = dict(choice)
        lp = choice.get("logprobs")
        if wanted is None or not isinstance(lp, dict):
            choice["logprobs"] = None
        elif not wanted:
            choice["logprobs"] = {**lp, "top_logprobs": None}
        choices.append(choice)
    out["choices"] = choices
    return out


def _without_stream(body: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in body.items() if k not in ("stream", "stream_options")}


class _Handler:
    """What both endpoints share: the exchange's life cycle around one request."""

    endpoint = ""

    def __init__(self, state: Any) -> None:
        self.state = state
        self.router: Router = state.router

    @property
    def chat(self) -> ChatHandler:
        handler: ChatHandler = self.state.chat
        return handler

    async def __call__(self, request: Request) -> Response:
        ex = Exchange(
            request_id=request.state.request_id,
            key_name=getattr(request.state, "key_name", None),
        )
        ex.endpoint = self.endpoint
        streaming = False
        try:
            response = await self.handle(request, ex)
            streaming = isinstance(response, sse.EventStream)  # it writes the row itself
            return response
        except ProxyError as exc:
            ex.status = exc.status
            ex.error = exc.code or exc.type
            if isinstance(exc, BadRequest):
                ex.reason = "bad_request"
            raise
        except asyncio.CancelledError:
            # The client disconnected before its answer was ready (see proxy/http/disconnect.py).
            ex.status = 499
            ex.error = "client_gone"
            raise
        except BaseException:
            ex.status = 500
            ex.error = "internal_error"
            raise
        finally:
            if not streaming:
                self.chat._finish(ex)

    async def handle(self, request: Request, ex: Exchange) -> Response:
        raise NotImplementedError

    async def post(self, path: str, body: dict[str, Any], ex: Exchange) -> dict[str, Any]:
        """The API's JSON answer to ``body`` at ``path``, timed into the exchange."""
        ex.route = "api"
        started = time.perf_counter()
        try:
            reply = await self.state.upstream.post_json(path, body, request_id=ex.request_id)
        except Exception as exc:
            ex.upstream_attempts = getattr(exc, "attempts", None)
            raise map_upstream_exception(exc) from exc
        finally:
            ex.api_ms = (time.perf_counter() - started) * 1000
        ex.upstream_attempts = reply.attempts
        ex.take_usage(reply.body.get("usage"))
        result: dict[str, Any] = reply.body
        return result


class CompletionsHandler(_Handler):
    endpoint = "completions"

    async def handle(self, request: Request, ex: Exchange) -> Response:
        body = completions_request(parse_json(await request.body()))
        ex.model = body["model"]
        ex.stream = bool(body.get("stream"))
        plan = self.router.plan(body, request.headers.get(ROUTE_HEADER))
        threshold = self.router.threshold(
            request.headers.get("x-frugal-min-quality"), body["model"]
        )
        if plan.route == "local":
            attempt = await self.router.try_local(
                body, threshold=threshold, kind="complete", plan=plan
            )
            ex.take_local(attempt)
            try:
                kept = self.chat._local_answer(body, attempt, plan, ex)
            except BadRequest as exc:
                if exc.param == "messages":  # the chat handler's word for the prompt
                    exc.param = "prompt"
                    exc.message = exc.message.replace("the conversation", "the prompt")
                raise
            if kept is not None:
                assert attempt.completion is not None
                # The ledger counts the answer with the requested model's tokenizer: give it
                # the prompt and the text in chat form.
                ex.body, ex.local_completion = legacy.chat_view(body, attempt.completion)
                if ex.stream:  # one chunk per token, as OpenAI streams: keep them for that
                    tokens = public_text_completion(attempt.completion, {"logprobs": 5})
                    return self._stream(tokens, ex, body)
                answer = public_text_completion(attempt.completion, body)
                return JSONResponse(answer, headers=ex.headers())
        else:
            ex.reason = plan.reason
        reply = await self.post("/completions", _without_stream(body), ex)
        if ex.stream:
            return self._stream(reply, ex, body)
        return JSONResponse(reply, headers=ex.headers())

    def _stream(self, answer: dict[str, Any], ex: Exchange, body: dict[str, Any]) -> Response:
        chunks = sse.replay_text_completion(
            answer,
            include_usage=bool((body.get("stream_options") or {}).get("include_usage")),
            with_logprobs=body.get("logprobs") is not None,
        )
        return self.chat._sse(_aiter(chunks), ex)


class EmbeddingsHandler(_Handler):
    """Embeddings pass through to the API (reason ``unsupported``: no local embeddings)."""

    endpoint = "embeddings"

    async def handle(self, request: Request, ex: Exchange) -> Response:
        body = embeddings_request(parse_json(await request.body()))
        ex.model = body["model"]
        forced = (request.headers.get(ROUTE_HEADER) or "").strip().lower()
        if forced not in ("", "local", "api"):
            raise BadRequest(
                f"header '{ROUTE_HEADER}' must be 'local' or 'api', got {forced!r}",
                param=ROUTE_HEADER,
            )
        if body["model"] == LOCAL_ALIAS or forced == "local":
            raise BadRequest(
                "the local model does not make embeddings; ask for an API embedding model",
                param="model",
                code="unsupported_locally",
            )
        ex.reason = "forced" if forced == "api" else "unsupported"
        if not self.router.fallback_enabled:
            raise LocalUnavailable(
                "embeddings come from the API, and no API fallback is configured"
            )
        reply = await self.post("/embeddings", body, ex)
        ex.completion_tokens = 0
        return JSONResponse(reply, headers=ex.headers())


async def _aiter(chunks: Iterator[bytes]) -> AsyncGenerator[bytes, None]:
    for chunk in chunks:
        yield chunk
