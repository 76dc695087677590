"""``POST /v1/chat/completions``'s service: a :class:`~proxy.serving.call.Call` in, an answer or a
stream of events out (the server's handler reads the request and writes the response,
:mod:`proxy.server.calls`).

The life cycle (one ledger row, written once whatever happens) and the steps are the
:class:`proxy.serving.cascade.Cascade` this service holds; this module says what chat does with
them: JSON, or a stream in one of two modes. ``verify`` (the default) scores the local answer
before the first byte and replays it as SSE, or relays the API's stream instead; ``live``
streams local tokens as they come, and only a failure before the first token can still fall
back. A client that leaves stops the work done for it in every mode: a local generation is
cancelled (``live`` streams included), an upstream stream is closed, once it has been read on
for its usage for ``[fallback] usage_wait_s`` (:mod:`proxy.serving.charges`: the API bills what it
generated, and the row says what).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import Any

from proxy.errors import LocalUnavailable, ProxyError
from proxy.protocol.answers import public_answer, public_usage
from proxy.protocol.params import LOCAL_ALIAS
from proxy.protocol.validate import chat_request
from proxy.routing.reasons import Reason
from proxy.routing.router import LocalAttempt
from proxy.serving import events
from proxy.serving.call import Answer, Call, Cleanup, Outcome
from proxy.serving.cascade import Cascade, Planned
from proxy.serving.events import aiter_of
from proxy.serving.exchange import Exchange
from proxy.serving.live import cancel, live_tokens
from proxy.serving.services import Services
from proxy.upstream.stream import UpstreamStream


class ChatService:
    """``POST /v1/chat/completions``, on its own :class:`Cascade`."""

    def __init__(self, services: Services) -> None:
        self.services = services
        self.cascade = Cascade(services, endpoint="chat.completions")

    async def __call__(self, call: Call) -> Outcome:
        return await self.cascade.serve(call, self.handle)

    async def handle(self, call: Call, ex: Exchange) -> Outcome:
        cascade = self.cascade
        body = await call.read(chat_request)
        ex.asking(body, log_content=self.services.settings.server.log_content)
        planned = cascade.begin(call, body, ex)
        await cascade.admit(call, body, ex)  # the key's models; the cache entry
        if ex.stream:
            return await self.streamed(body, planned, ex)
        hit = await cascade.cached(ex)
        if hit is not None:
            ex.keep(hit)
            return Answer(hit, ex.headers())
        answer = await cascade.local_chat(body, planned, ex)
        if answer is not None:
            ex.keep(answer)
            cascade.remember(ex, answer)
            return Answer(answer, ex.headers())
        asking = self.services.upstream.chat(body, request_id=ex.request_id)
        reply = await cascade.from_api(asking, ex)
        ex.keep(reply.body)
        cascade.remember(ex, reply.body)
        # upstream's bytes go back as they came: parsed once, not encoded again
        return Answer(headers=ex.headers(), raw=reply.raw)

    # -- streaming --------------------------------------------------------------------------

    async def streamed(self, body: dict[str, Any], planned: Planned, ex: Exchange) -> Outcome:
        cascade = self.cascade
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        hit = await cascade.cached(ex)  # a cached answer is replayed as a stream
        if hit is not None:
            return self.replay(hit, ex, include_usage, bool(body.get("logprobs")))
        tried = False  # the local model has answered already (a live stream that fell back)
        if planned.plan.route == "local" and cascade.live_mode(body):
            live = await cascade.live(
                body,
                planned,
                ex,
                replay=lambda answer: self.replayed(answer, ex, include_usage),
                chunks=lambda task, queue: _live_chunks(task, queue, ex, include_usage),
            )
            if live is not None:
                return live
            tried = True
        if planned.plan.route == "local" and not tried:
            kept = await cascade.try_local(body, planned, ex, kind="chat")
            if kept is not None:
                answer = public_answer(kept, body)
                cascade.remember(ex, answer)
                return self.replay(answer, ex, include_usage, bool(body.get("logprobs")))
        kept = await cascade.reserve_or_local(body, planned, ex, kind="chat")
        if kept is not None:  # the budget is spent: a local answer the gate accepts is free
            return self.replay(public_answer(kept, body), ex, include_usage, False)
        stream, close = await cascade.open_stream(
            self.services.upstream.chat_stream(body, request_id=ex.request_id), ex, body
        )
        return cascade.stream(_relay(stream, ex, close), ex, cleanups=(close,))

    async def replayed(self, answer: dict[str, Any], ex: Exchange, include_usage: bool) -> Outcome:
        return self.replay(answer, ex, include_usage, False)

    def replay(
        self, answer: dict[str, Any], ex: Exchange, include_usage: bool, with_logprobs: bool
    ) -> Outcome:
        """A finished, kept answer replayed as the chunks OpenAI would have streamed."""
        ex.keep(answer)
        chunks = events.replay(answer, include_usage=include_usage, with_logprobs=with_logprobs)
        return self.cascade.stream(aiter_of(chunks), ex)


async def _relay(
    stream: UpstreamStream, ex: Exchange, close: Cleanup
) -> AsyncGenerator[bytes, None]:
    """Upstream's events as they come; a stream that breaks off ends with an error event."""
    try:
        async for chunk in stream:
            ex.keep_sse(chunk)
            yield chunk
    except ProxyError as err:  # translated by the stream itself (proxy.upstream.failures)
        ex.broke(err.code or "stream_cut")
        yield events.error_event(err)
        yield events.DONE
    finally:
        await close()


async def _live_chunks(
    task: asyncio.Task[LocalAttempt],
    queue: asyncio.Queue[str],
    ex: Exchange,
    include_usage: bool,
) -> AsyncGenerator[bytes, None]:
    """The live tokens as chunks, then the finish (or the local failure) and ``[DONE]``."""
    writer = events.ChunkWriter("chatcmpl-live-" + ex.request_id[:16], ex.model or LOCAL_ALIAS)
    yield writer.role()
    try:
        async for token in live_tokens(task, queue):
            yield writer.text(token)
        attempt = task.result()
        ex.take_local(attempt)
        completion = attempt.completion
        if completion is None:
            ex.local_failed(attempt.reason)
            failed = f"the local model failed mid-answer ({attempt.reason})"
            yield events.error_event(LocalUnavailable(failed, code=attempt.reason))
            yield events.DONE
            return
        ex.take_usage(completion.get("usage"))
        ex.keep(completion)
        if attempt.reason == Reason.LOCAL_TIMEOUT:
            ex.local_timed_out()
        yield writer.finish(completion["choices"][0].get("finish_reason") or "stop")
        if include_usage:
            yield writer.usage(public_usage(completion.get("usage") or {}))
        yield events.DONE
    finally:
        await cancel(task)
