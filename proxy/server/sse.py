"""Server-sent events in OpenAI's formats: ``chat.completion.chunk`` and legacy
``text_completion`` streams.

A finished answer (the local model's, scored before the first byte, or a legacy completion the
API answered as JSON) is *replayed* as the chunks OpenAI would have streamed: for each choice a
role chunk, its text (one chunk per token when the token logprobs are known) or its tool call,
and a finish chunk; then the usage chunk when asked for, and ``[DONE]``.

:class:`EventStream` is the response that carries them: it ends exactly once, however it ends
(run to its last event, cut by a client that left, or cancelled before its first byte), and says
so to its owner, who writes the request's ledger row then. A stream that fails after its first
byte ends with the error's event (:func:`proxy.server.render.sse_event`), then ``[DONE]``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import (
    AsyncGenerator,
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Iterator,
    Sequence,
)
from typing import Any

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from proxy.engine.reasoning import ReasoningText
from proxy.protocol.answers import public_usage

DONE = b"data: [DONE]\n\n"
ARGUMENT_PIECE = 32  # characters of a tool call's arguments per chunk


Cleanup = Callable[[], Awaitable[None]]


class EventStream(StreamingResponse):
    """A ``text/event-stream`` response whose end is certain.

    Starlette's own streaming response runs its body generator in a task that a disconnect
    cancels: when the client has gone before the first byte, the generator never starts, and
    nothing in its ``finally`` ever runs. Here the end does not live in the generator:

    - the body is streamed while the response listens for ``http.disconnect``; whichever comes
      first ends the other;
    - then the body generator is closed (so its own ``finally`` runs, if it ever started), and
      each of ``cleanups`` is awaited (closing an upstream connection, stopping a generation:
      they must be idempotent, since the generator may have done the same);
    - last, ``on_end(finished)`` is called once, ``finished`` saying whether the body ran to its
      end, or at least sent ``[DONE]``. It is called even when the response itself is cancelled.
    """

    def __init__(
        self,
        chunks: AsyncGenerator[bytes, None],
        *,
        headers: dict[str, str],
        on_end: Callable[[bool], None],
        cleanups: Sequence[Cleanup] = (),
    ) -> None:
        self.finished = False
        self._chunks = chunks
        self._events = self._relay(chunks)
        self._on_end = on_end
        self._cleanups = tuple(cleanups)
        super().__init__(self._events, media_type="text/event-stream", headers=headers)

    async def _relay(self, chunks: AsyncIterator[bytes]) -> AsyncGenerator[bytes, None]:
        async for chunk in chunks:
            yield chunk
            if chunk.endswith(DONE):
                # Sent: the client has the whole answer. A client that closes at once, while
                # the body's own clean-up still runs, has not left early.
                self.finished = True
        self.finished = True

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        streaming = asyncio.ensure_future(self.stream_response(send))
        try:
            listening = asyncio.ensure_future(self.listen_for_disconnect(receive))
            try:
                await asyncio.wait((streaming, listening), return_when=asyncio.FIRST_COMPLETED)
            finally:
                await _stop(listening, streaming)
        finally:
            try:
                await self._close()
            finally:
                self._on_end(self.finished)
        failure = None if streaming.cancelled() else streaming.exception()
        if failure is not None and not isinstance(failure, OSError):  # OSError: the client left
            raise failure

    async def _close(self) -> None:
        for close in (self._events.aclose, self._chunks.aclose, *self._cleanups):
            with contextlib.suppress(Exception):
                await close()


async def _stop(*tasks: asyncio.Future[None]) -> None:
    """Cancel ``tasks`` and wait until they have ended; their failures are the caller's to read."""
    for task in tasks:
        if not task.done():
            task.cancel()
    await asyncio.wait(tasks)
    for task in tasks:
        if not task.cancelled():
            task.exception()  # marked as retrieved; the caller reads the one that matters


def event(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


class ChunkWriter:
    """Builds the chunks of one streamed chat answer."""

    def __init__(self, completion_id: str, model: str, created: int | None = None) -> None:
        self.base = {
            "id": completion_id,
            "object": "chat.completion.chunk",
            "created": created or int(time.time()),
            "model": model,
            "system_fingerprint": None,
        }

    def chunk(
        self,
        delta: dict[str, Any],
        *,
        finish_reason: str | None = None,
        logprobs: dict[str, Any] | None = None,
        index: int = 0,
    ) -> bytes:
        choice = {
            "index": index,
            "delta": delta,
            "logprobs": logprobs,
            "finish_reason": finish_reason,
        }
        return event({**self.base, "choices": [choice]})

    def role(self, index: int = 0) -> bytes:
        return self.chunk({"role": "assistant", "content": "", "refusal": None}, index=index)

    def text(self, text: str, logprobs: dict[str, Any] | None = None, index: int = 0) -> bytes:
        """A piece of the answer, or of a thinking model's thinking (a ``ReasoningText``,
        sent as ``reasoning_content``, as llama-server and vLLM send it)."""
        if isinstance(text, ReasoningText):
            return self.chunk({"reasoning_content": str(text)}, index=index)
        return self.chunk({"content": text}, logprobs=logprobs, index=index)

    def finish(self, reason: str, index: int = 0) -> bytes:
        return self.chunk({}, finish_reason=reason, index=index)

    def usage(self, usage: dict[str, Any]) -> bytes:
        return event({**self.base, "choices": [], "usage": usage})


def _pieces(text: str, size: int = ARGUMENT_PIECE) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


def _replay_call(writer: ChunkWriter, message: dict[str, Any], index: int) -> Iterator[bytes]:
    """A tool call (or a deprecated function call) as OpenAI streams it: name first, then the
    arguments in pieces."""
    if message.get("function_call"):
        call = message["function_call"]
        head = {"name": call["name"], "arguments": ""}
        yield writer.chunk(
            {"role": "assistant", "content": None, "function_call": head, "refusal": None},
            index=index,
        )
        for piece in _pieces(call.get("arguments") or ""):
            yield writer.chunk({"function_call": {"arguments": piece}}, index=index)
        return
    for k, call in enumerate(message["tool_calls"]):
        fn = call["function"]
        head = {
            "index": k,
            "id": call["id"],
            "type": "function",
            "function": {"name": fn["name"], "arguments": ""},
        }
        delta: dict[str, Any] = {"tool_calls": [head]}
        if k == 0:
            delta = {"role": "assistant", "content": None, **delta, "refusal": None}
        yield writer.chunk(delta, index=index)
        for piece in _pieces(fn.get("arguments") or ""):
            yield writer.chunk(
                {"tool_calls": [{"index": k, "function": {"arguments": piece}}]}, index=index
            )


def _replay_text(
    writer: ChunkWriter, choice: dict[str, Any], index: int, with_logprobs: bool
) -> Iterator[bytes]:
    yield writer.role(index)
    thinking = choice["message"].get("reasoning_content")
    if thinking:
        yield writer.text(ReasoningText(thinking), index=index)
    entries = ((choice.get("logprobs") or {}).get("content")) or []
    content = choice["message"].get("content") or ""
    sent = 0
    for entry in entries:
        if sent >= len(content):
            break
        piece = content[sent : sent + len(entry["token"])] if entry["token"] else ""
        if not piece:
            continue
        sent += len(piece)
        lp = {"content": [entry], "refusal": None} if with_logprobs else None
        yield writer.text(piece, lp, index)
    if sent < len(content):
        yield writer.text(content[sent:], index=index)


def replay(
    completion: dict[str, Any], *, include_usage: bool, with_logprobs: bool
) -> Iterator[bytes]:
    """A finished chat.completion as the chunks OpenAI would have streamed."""
    writer = ChunkWriter(completion["id"], completion["model"], completion.get("created"))
    for choice in completion["choices"]:
        index = int(choice.get("index") or 0)
        message = choice["message"]
        if message.get("tool_calls") or message.get("function_call"):
            yield from _replay_call(writer, message, index)
        else:
            yield from _replay_text(writer, choice, index, with_logprobs)
        yield writer.finish(choice.get("finish_reason") or "stop", index)
    if include_usage:
        yield writer.usage(public_usage(completion.get("usage") or {}))
    yield DONE


def replay_text_completion(
    completion: dict[str, Any], *, include_usage: bool, with_logprobs: bool
) -> Iterator[bytes]:
    """A finished legacy ``text_completion`` as OpenAI streams it: text chunks (one per token
    when the completion carries its tokens' logprobs, which go out ``with_logprobs``), then a
    finish chunk per choice."""
    base = {
        "id": completion["id"],
        "object": "text_completion",
        "created": completion.get("created") or int(time.time()),
        "model": completion["model"],
    }

    def chunk(index: int, text: str, logprobs: Any = None, finish: str | None = None) -> bytes:
        choice = {"text": text, "index": index, "logprobs": logprobs, "finish_reason": finish}
        return event({**base, "choices": [choice]})

    for choice in completion["choices"]:
        index = int(choice.get("index") or 0)
        text = choice.get("text") or ""
        lp = choice.get("logprobs")
        tokens = (lp or {}).get("tokens") or []
        sent = 0
        if tokens and "".join(tokens) == text:
            for k, token in enumerate(tokens):
                one = {
                    "tokens": [token],
                    "token_logprobs": [lp["token_logprobs"][k]],
                    "top_logprobs": [lp["top_logprobs"][k]] if lp.get("top_logprobs") else None,
                    "text_offset": [lp["text_offset"][k]],
                }
                yield chunk(index, token, one if with_logprobs else None)
            sent = len(text)
        if sent < len(text):
            yield chunk(index, text[sent:])
        yield chunk(index, "", None, choice.get("finish_reason") or "stop")
    if include_usage:
        yield event({**base, "choices": [], "usage": public_usage(completion.get("usage") or {})})
    yield DONE


async def aiter_of(chunks: Iterable[bytes]) -> AsyncGenerator[bytes, None]:
    """``chunks`` (made already: a replayed answer) as the async generator a stream takes."""
    for chunk in chunks:
        yield chunk
