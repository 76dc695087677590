"""``POST /v1/chat/completions``: the cascade as HTTP.

The life cycle (one ledger row, written once whatever happens) is :class:`proxy.server.handler.
Handler`'s; this module says what chat does inside it: JSON, or a stream in one of two modes.
``verify`` (the default) scores the local answer before the first byte and replays it as SSE,
or relays the API's stream instead; ``live`` streams local tokens as they come, and only a
failure before the first token can still fall back. A client that leaves stops the work done for
it in every mode: a local generation is cancelled (``live`` streams included), an upstream
stream is closed, once it has been read on for its usage for ``[fallback] usage_wait_s``
(:mod:`proxy.serving.charges`: the API bills what it generated, and the row says what).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from proxy.errors import LocalUnavailable, ProxyError
from proxy.protocol.params import LOCAL_ALIAS
from proxy.protocol.validate import chat_request
from proxy.routing.reasons import Reason
from proxy.routing.router import LocalAttempt, Plan
from proxy.routing.servable import live_streamable
from proxy.server import sse
from proxy.server.answers import public_answer
from proxy.server.handler import Handler, aiter_of
from proxy.server.render import sse_event
from proxy.serving import charges
from proxy.serving.exchange import Exchange
from proxy.upstream.stream import UpstreamStream

# How a finished chat completion is sent: (the answer, the exchange, upstream's bytes or None).
Send = Callable[[dict[str, Any], Exchange, bytes | None], Response]
# How a live stream's bytes are made from its local generation and the queue of its tokens.
LiveChunks = Callable[[asyncio.Task[LocalAttempt], asyncio.Queue[str]], AsyncGenerator[bytes, None]]


def _send_json(answer: dict[str, Any], ex: Exchange, raw: bytes | None) -> Response:
    if raw is not None:  # upstream's bytes go back as they came: parsed once, not encoded again
        return Response(raw, media_type="application/json", headers=ex.headers())
    return JSONResponse(answer, headers=ex.headers())


class ChatHandler(Handler):
    endpoint = "chat.completions"

    async def handle(self, request: Request, ex: Exchange) -> Response:
        log_content = self.services.settings.server.log_content
        if log_content:
            ex.content_out = []
        body = await self.services.bodies.read(request, chat_request)
        if log_content:
            ex.content_in = body.get("messages")
        ex.body = body
        plan, threshold = self.begin(request, body, ex)
        await self.admit(request, body, ex)  # the key's models; the cache entry
        if ex.stream:
            return await self._stream(body, plan, threshold, ex)
        return await self._json(body, plan, threshold, ex)

    # -- JSON -------------------------------------------------------------------------------

    async def _json(
        self,
        body: dict[str, Any],
        plan: Plan,
        threshold: float,
        ex: Exchange,
        send: Send | None = None,
        *,
        local_tried: bool = False,
    ) -> Response:
        """The cascade's answer to ``body``, sent by ``send`` (as chat's JSON by default;
        :mod:`proxy.server.responses` sends it as a Responses object); ``local_tried``: the local
        model has answered already (a ``live`` stream that fell back), so not again."""
        send = send or _send_json
        hit = await self.cached(ex)
        if hit is not None:
            ex.keep(hit)
            return send(hit, ex, None)
        if plan.route == "local" and not local_tried:
            kept = await self.try_local(body, plan, threshold, ex, kind="chat")
            if kept is not None:
                answer = self._sent_local(kept, body, ex)
                ex.keep(answer)
                return send(answer, ex, None)
        kept = await self.reserve_or_local(body, plan, threshold, ex, kind="chat")
        if kept is not None:
            return send(public_answer(kept, body), ex, None)
        upstream = self.services.upstream
        reply = await self.from_api(upstream.chat(body, request_id=ex.request_id), ex)
        ex.keep(reply.body)
        self.remember(ex, reply.body)
        return send(reply.body, ex, reply.raw)

    # -- streaming --------------------------------------------------------------------------

    async def _stream(
        self, body: dict[str, Any], plan: Plan, threshold: float, ex: Exchange
    ) -> Response:
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        hit = await self.cached(ex)  # a cached answer is replayed as a stream
        if hit is not None:
            return self._replay(hit, ex, include_usage, bool(body.get("logprobs")))
        if plan.route == "local":
            mode = self.services.settings.router.stream_mode
            if mode == "live" and live_streamable(body):
                live = await self._live(body, plan, threshold, ex, include_usage)
                if live is not None:
                    return live
            else:
                kept = await self.try_local(body, plan, threshold, ex, kind="chat")
                if kept is not None:
                    answer = self._sent_local(kept, body, ex)
                    return self._replay(answer, ex, include_usage, bool(body.get("logprobs")))
        kept = await self.reserve_or_local(body, plan, threshold, ex, kind="chat")
        if kept is not None:
            return self._replay(public_answer(kept, body), ex, include_usage, False)
        return await self._relay_api(body, ex)

    def _sent_local(
        self, kept: dict[str, Any], body: dict[str, Any], ex: Exchange
    ) -> dict[str, Any]:
        """A local completion the gate kept, as OpenAI sends it, remembered for the cache."""
        answer = public_answer(kept, body)
        self.remember(ex, answer)
        return answer

    def _replay(
        self, answer: dict[str, Any], ex: Exchange, include_usage: bool, with_logprobs: bool
    ) -> Response:
        """A finished, kept local answer replayed as the chunks OpenAI would have streamed."""
        ex.keep(answer)
        chunks = sse.replay(answer, include_usage=include_usage, with_logprobs=with_logprobs)
        return self.stream(aiter_of(chunks), ex)

    async def _relay_api(self, body: dict[str, Any], ex: Exchange) -> Response:
        """The API's own stream, relayed event by event; closed once, however it ends."""
        ex.route = "api"
        started = time.perf_counter()
        opening = asyncio.ensure_future(
            self.services.upstream.chat_stream(body, request_id=ex.request_id)
        )
        # A client that leaves before upstream's headers: the API may be generating already.
        upstream_stream = await charges.open_stream(opening, ex, self.services, body, started)
        close = charges.stream_closer(upstream_stream, ex, self.services, body, started)

        return self.stream(_relay(upstream_stream, ex, close), ex, cleanups=(close,))

    async def _live(
        self,
        body: dict[str, Any],
        plan: Plan,
        threshold: float,
        ex: Exchange,
        include_usage: bool,
        *,
        replay: Callable[[dict[str, Any]], Awaitable[Response]] | None = None,
        chunks: LiveChunks | None = None,
    ) -> Response | None:
        """Stream local tokens as they come; only a failure before the first one falls back.
        ``replay`` sends a kept answer that came without a token, ``chunks`` makes the stream
        of the tokens (chat's by default; :mod:`proxy.server.responses` sends typed events)."""
        queue: asyncio.Queue[str] = asyncio.Queue()
        task = asyncio.create_task(
            self.router.try_local(body, threshold=threshold, on_token=queue.put_nowait, plan=plan)
        )
        first = asyncio.ensure_future(queue.get())
        try:
            await asyncio.wait({task, first}, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            # The client left before the first token: stop the generation made for it.
            first.cancel()
            await cancel(task)
            raise
        if not first.done():
            first.cancel()
            attempt = task.result()
            ex.take_local(attempt)
            if attempt.completion is None or not (
                attempt.completion["choices"][0]["message"].get("content")
            ):
                # Nothing was said yet: the cascade may still fall back.
                kept = self.judge(attempt, plan, ex)
                if kept is None:
                    return None
                if replay is not None:
                    return await replay(kept)
                return self._replay(public_answer(kept, body), ex, include_usage, False)
            queue.put_nowait(attempt.completion["choices"][0]["message"]["content"])
        else:
            queue.put_nowait(first.result())
        ex.route, ex.reason = "local", Reason.FORCED if plan.forced else Reason.LIVE

        async def stop() -> None:
            await cancel(task)

        made = chunks or (lambda t, q: _live_chunks(t, q, ex, include_usage))
        return self.stream(made(task, queue), ex, cleanups=(stop,))


async def _relay(
    stream: UpstreamStream, ex: Exchange, close: sse.Cleanup
) -> AsyncGenerator[bytes, None]:
    """Upstream's events as they come; a stream that breaks off ends with an error event."""
    try:
        async for chunk in stream:
            ex.keep_sse(chunk)
            yield chunk
    except ProxyError as err:  # translated by the stream itself (proxy.upstream.failures)
        ex.error = err.code or "stream_cut"
        yield sse_event(err)
        yield sse.DONE
    finally:
        await close()


async def live_tokens(
    task: asyncio.Task[LocalAttempt], queue: asyncio.Queue[str]
) -> AsyncGenerator[str, None]:
    """The local tokens of ``task`` as they come, until it has ended."""
    while True:
        if not queue.empty():
            yield queue.get_nowait()
            continue
        if task.done():
            return
        getter = asyncio.ensure_future(queue.get())
        try:
            await asyncio.wait({task, getter}, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            getter.cancel()
            raise
        if getter.done():
            yield getter.result()
        else:
            getter.cancel()


async def _live_chunks(
    task: asyncio.Task[LocalAttempt],
    queue: asyncio.Queue[str],
    ex: Exchange,
    include_usage: bool,
) -> AsyncGenerator[bytes, None]:
    """The live tokens as chunks, then the finish (or the local failure) and ``[DONE]``."""
    writer = sse.ChunkWriter("chatcmpl-live-" + ex.request_id[:16], ex.model or LOCAL_ALIAS)
    yield writer.role()
    try:
        async for token in live_tokens(task, queue):
            yield writer.text(token)
        attempt = task.result()
        ex.take_local(attempt)
        completion = attempt.completion
        if completion is None:
            ex.error = attempt.reason
            failed = f"the local model failed mid-answer ({attempt.reason})"
            yield sse_event(LocalUnavailable(failed, code=attempt.reason))
            yield sse.DONE
            return
        ex.take_usage(completion.get("usage"))
        ex.keep(completion)
        if attempt.reason == Reason.LOCAL_TIMEOUT:
            ex.reason = Reason.LOCAL_TIMEOUT
        yield writer.finish(completion["choices"][0].get("finish_reason") or "stop")
        if include_usage:
            yield writer.usage(sse.public_usage(completion.get("usage") or {}))
        yield sse.DONE
    finally:
        await cancel(task)


async def cancel(task: asyncio.Task[Any]) -> None:
    """Cancel ``task`` (once) and wait until it has ended: a local generation stopped."""
    if task.done():
        if not task.cancelled():
            task.exception()  # retrieved; whoever needed its result has read it
        return
    task.cancel()
    with contextlib.suppress(BaseException):
        await task
