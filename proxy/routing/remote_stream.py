"""A live stream from a remote server: read, handed on token by token, and put together.

    StreamedAnswer   the chat answer read from a server's SSE events, as the completion its
                     non-streamed answer would have been
    StreamCut        the stream ended without a finish reason, or with an error event
    Relay            the tokens on their way to the client (``on_token``), and whether any has
                     gone yet: after the first one, a failure may no longer move the request
    read_bounded     a body read chunk by chunk, never past its byte limit
    bounded_lines    a stream's lines, its bytes (one unfinished line included) never past
                     its byte limit
    AnswerTooLarge   what both raise past the limit (``[[local.backends]] max_answer_bytes``):
                     a failure of the backend, and the request goes on to the API

Imports :mod:`proxy.routing.base` and :mod:`proxy.errors` only.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

from proxy.errors import EngineCrashed
from proxy.routing.base import BackendDown

__all__ = [
    "AnswerTooLarge",
    "Counters",
    "Relay",
    "StreamCut",
    "StreamedAnswer",
    "bounded_lines",
    "read_bounded",
]


class Counters(Protocol):
    """The backend's counts of live streams and of the pieces they handed on."""

    streamed: int
    streamed_pieces: int


class StreamCut(Exception):
    """A server's stream ended without a finish reason (llama-cpp-python's model lock ends a
    stream with ``[DONE]`` when another request arrives), or with an error event."""


class AnswerTooLarge(Exception):
    """A server's answer (its body, or its stream so far) passed the backend's byte limit."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"more than {limit} bytes ([[local.backends]] max_answer_bytes)")
        self.limit = limit


async def read_bounded(chunks: AsyncIterator[bytes], limit: int, *, cut: bool = False) -> bytes:
    """The bytes of ``chunks`` up to ``limit``: past it, :class:`AnswerTooLarge`, or with
    ``cut`` the first ``limit`` bytes (an error's body, read for its message only). The caller
    closes the response, which drops a connection left unread."""
    parts: list[bytes] = []
    size = 0
    async for chunk in chunks:
        size += len(chunk)
        if size > limit:
            if not cut:
                raise AnswerTooLarge(limit)
            parts.append(chunk[: len(chunk) - (size - limit)])
            break
        parts.append(chunk)
    return b"".join(parts)


async def bounded_lines(chunks: AsyncIterator[bytes], limit: int) -> AsyncIterator[str]:
    """The lines of a stream (without their ends), as they come; once ``limit`` bytes have
    come (a line that never ends included), :class:`AnswerTooLarge`. An unfinished line is
    kept as its pieces and joined once, when its end comes."""
    held: list[bytes] = []
    size = 0
    async for chunk in chunks:
        size += len(chunk)
        if size > limit:
            raise AnswerTooLarge(limit)
        if b"\n" not in chunk:
            held.append(chunk)
            continue
        data = b"".join((*held, chunk)) if held else chunk
        *lines, rest = data.split(b"\n")
        held = [rest] if rest else []
        for line in lines:
            yield line.removesuffix(b"\r").decode("utf-8", "replace")
    if held:
        yield b"".join(held).removesuffix(b"\r").decode("utf-8", "replace")


class StreamedAnswer:
    """A chat answer read from a server's SSE stream (one choice), put together as the
    completion its non-streamed answer would have been.

    :meth:`feed` takes one ``data:`` line's text and returns the content it adds (``""`` for
    none); :meth:`completion` is the whole answer once the stream has ended. A server that sends
    no usage chunk (llama-cpp-python) is counted here: one token per content chunk, and the
    prompt as ``prompt_tokens`` estimates it (:attr:`usage` stays None).
    """

    def __init__(self, prompt_tokens: int) -> None:
        self.prompt_tokens = prompt_tokens
        self.parts: list[str] = []
        self.logprobs: list[Any] = []
        self.finish_reason: str | None = None
        self.usage: dict[str, Any] | None = None
        self.head: dict[str, Any] = {}
        self.done = False

    def feed(self, data: str) -> str:
        if not data.strip():
            return ""
        if data.strip() == "[DONE]":
            self.done = True
            return ""
        event = json.loads(data)
        if not isinstance(event, dict):
            raise StreamCut("a stream event that is not an object")
        if event.get("error"):
            raise StreamCut(f"an error event: {str(event['error'])[:200]}")
        if not self.head:
            self.head = {k: event[k] for k in ("id", "created", "model") if k in event}
        if event.get("usage"):
            self.usage = event["usage"]
        text = ""
        for choice in event.get("choices") or ():
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            piece = delta.get("content")
            if isinstance(piece, str) and piece:
                self.parts.append(piece)
                text += piece
            entries = (choice.get("logprobs") or {}).get("content")
            if isinstance(entries, list):
                self.logprobs.extend(entries)
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
        return text

    def completion(self) -> dict[str, Any]:
        if self.finish_reason is None:
            raise StreamCut("the stream ended without a finish reason")
        usage = self.usage
        if usage is None:
            decoded = sum(1 for part in self.parts if part)
            usage = {
                "prompt_tokens": self.prompt_tokens,
                "completion_tokens": decoded,
                "total_tokens": self.prompt_tokens + decoded,
            }
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": "".join(self.parts)},
            "logprobs": {"content": self.logprobs} if self.logprobs else None,
            "finish_reason": self.finish_reason,
        }
        completion = {**self.head, "object": "chat.completion", "choices": [choice]}
        completion["usage"] = usage
        return completion


class Relay:
    """A live stream's tokens on their way to ``on_token``, and whether any has gone yet."""

    def __init__(
        self, on_token: Callable[[str], None] | None, prompt_tokens: int, stats: Counters
    ) -> None:
        self.on_token = on_token
        self.prompt_tokens = prompt_tokens
        self.stats = stats
        self.answer: StreamedAnswer | None = None
        self.said = False

    def start(self) -> StreamedAnswer:
        self.answer = StreamedAnswer(self.prompt_tokens)
        self.stats.streamed += 1
        return self.answer

    def say(self, text: str) -> None:
        if text and self.on_token is not None:
            self.said = True
            self.stats.streamed_pieces += 1
            self.on_token(text)

    def after_first_token(self, failure: EngineCrashed) -> EngineCrashed:
        """``failure`` as the router must see it: once a token is out, the request stays here
        (its stream ends with an error event), so never BackendDown."""
        if self.said and isinstance(failure, BackendDown):
            return EngineCrashed(f"{failure} after the first token")
        return failure
