"""Server-sent events in OpenAI's ``chat.completion.chunk`` format."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

DONE = b"data: [DONE]\n\n"


def event(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


def error_event(message: str, *, type_: str = "upstream_error", code: str | None = None) -> bytes:
    """The final event of a stream that failed after its first byte went out."""
    return event({"error": {"message": message, "type": type_, "param": None, "code": code}})


class ChunkWriter:
    """Builds the chunks of one streamed answer."""

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
    ) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
        return event({**self.base, "choices": [choice]})

    def role(self) -> bytes:
        return self.chunk({"role": "assistant", "content": "", "refusal": None})

    def text(self, text: str, logprobs: dict[str, Any] | None = None) -> bytes:
        return self.chunk({"content": text}, logprobs=logprobs)

    def finish(self, reason: str) -> bytes:
        return self.chunk({}, finish_reason=reason)

    def usage(self, usage: dict[str, Any]) -> bytes:
        return event({**self.base, "choices": [], "usage": usage})


def replay(
    completion: dict[str, Any], *, include_usage: bool, with_logprobs: bool
) -> Iterator[bytes]:
    """A finished chat.completion as the chunks OpenAI would have streamed, one per token."""
    writer = ChunkWriter(completion["id"], completion["model"], completion.get("created"))
    choice = completion["choices"][0]
    yield writer.role()
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
        yield writer.text(piece, {"content": [entry], "refusal": None} if with_logprobs else None)
    if sent < len(content):
        yield writer.text(content[sent:])
    yield writer.finish(choice.get("finish_reason") or "stop")
    if include_usage:
        yield writer.usage(public_usage(completion.get("usage") or {}))
    yield DONE


def public_usage(usage: dict[str, Any]) -> dict[str, Any]:
    return {
        "prompt_tokens": usage.get("prompt_tokens", 0),
        "completion_tokens": usage.get("completion_tokens", 0),
        "total_tokens": usage.get("total_tokens", 0),
    }
