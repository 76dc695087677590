"""Server-sent events in OpenAI's formats: ``chat.completion.chunk`` and legacy
``text_completion`` streams, and an error as a stream's last event.

A finished answer (the local model's, scored before the first byte, or a legacy completion the
API answered as JSON) is *replayed* as the chunks OpenAI would have streamed: for each choice a
role chunk, its text (one chunk per token when the token logprobs are known) or its tool call,
and a finish chunk; then the usage chunk when asked for, and ``[DONE]``.

A stream that fails after its first byte ends with the error's event (:func:`error_event`), then
``[DONE]``; an error no step expected is logged once first (:func:`unexpected`, which
:mod:`proxy.server.render` uses for the 500s it renders as JSON too). The response that carries
the events, and ends exactly once however it ends, is the server's
(:class:`proxy.server.sse.EventStream`).
"""

from __future__ import annotations

import json
import time
import traceback
from collections.abc import AsyncGenerator, Iterable, Iterator
from typing import Any

import structlog

from proxy.engine.reasoning import ReasoningText
from proxy.errors import InternalError, ProxyError
from proxy.protocol.answers import public_usage

log = structlog.get_logger("frugal.app")

DONE = b"data: [DONE]\n\n"
ARGUMENT_PIECE = 32  # characters of a tool call's arguments per chunk


def event(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


def error_event(exc: ProxyError) -> bytes:
    """``exc`` as the final ``data: {"error": ...}`` event of a stream that failed after its
    first byte went out (the caller sends ``data: [DONE]`` after it): the same object as the
    JSON error (:meth:`proxy.errors.ProxyError.body`)."""
    return event(exc.body())


def unexpected(
    exc: BaseException,
    request_id: str | None,
    *,
    method: str | None = None,
    path: str = "",
    started: bool = False,
) -> InternalError:
    """Log an exception no step took, once, and return the 500 the client gets for it: as JSON,
    or as a stream's last event (:func:`error_event`) when ``started``.

    The log line has the request id, the exception's class and where it was raised: never its
    message or a traceback's locals, which may hold request content.
    """
    frames = traceback.extract_tb(exc.__traceback__)
    where = f"{frames[-1].filename}:{frames[-1].lineno} in {frames[-1].name}" if frames else None
    log.error(
        "unhandled_error",
        request_id=request_id,
        error=type(exc).__name__,
        where=where,
        method=method,
        path=path[:100],
        response_started=started,
    )
    return InternalError(request_id)


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
