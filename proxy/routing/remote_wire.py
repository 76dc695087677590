"""What a remote llama.cpp server is sent for a chat request, and how its answer is read.

The body is the client's request less the proxy's own fields (:data:`NOT_FORWARDED`), with the
backend's model, the engine's default ``max_tokens`` when the client set none, and ``logprobs``
asked for when the backend gives them (for the quality gate), in the words of the backend's kind
(:mod:`proxy.routing.remote_kinds`). The answer's stop reason is said
in the engine's words (:func:`stop_cause`), and it is scored with ``quality.score``
(:func:`score`, run in a thread by the caller).
"""

from __future__ import annotations

import json
from typing import Any

import httpx

from proxy.routing.remote_kinds import KINDS, Kind

__all__ = [
    "NOT_FORWARDED",
    "StreamCut",
    "StreamedAnswer",
    "error_of",
    "request_body",
    "score",
    "stop_cause",
]

# Fields of a chat request a remote llama.cpp server is not sent (the proxy's own business).
NOT_FORWARDED = ("stream", "stream_options", "user", "metadata", "store", "service_tier")


def request_body(
    request: dict[str, Any],
    *,
    model: str,
    cap: int,
    logprobs: bool,
    kind: Kind = KINDS["openai-compatible"],
    stream: bool = False,
) -> dict[str, Any]:
    """The JSON body sent to the server for ``request``, answering at most ``cap`` tokens, in
    the words of its ``kind``; ``stream``: asked as a stream (a ``live`` one)."""
    body = {k: v for k, v in request.items() if k not in NOT_FORWARDED}
    body["model"] = model
    if not (body.get("max_tokens") or body.get("max_completion_tokens")):
        body["max_tokens"] = cap  # [local] default_max_tokens, as the engine would
    if logprobs and not request.get("logprobs"):
        body.pop("top_logprobs", None)
    body = kind.adapt(body, gate_logprobs=logprobs)
    if stream:
        body["stream"] = True
        if kind.stream_usage:
            body["stream_options"] = {"include_usage": True}
    return body


class StreamCut(Exception):
    """A server's stream ended without a finish reason (llama-cpp-python's model lock ends a
    stream with ``[DONE]`` when another request arrives), or with an error event."""


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


def stop_cause(completion: dict[str, Any], cap: int) -> str:
    """Why the remote stopped, in the engine's words: a cut by the client's own cap is not the
    backend's fault (``max_tokens``), a cut short of it is (``context_full``)."""
    choice = completion["choices"][0]
    if choice.get("finish_reason") != "length":
        return "eos"
    tokens = int((completion.get("usage") or {}).get("completion_tokens") or 0)
    return "max_tokens" if tokens >= cap else "context_full"


def score(request: dict[str, Any], completion: dict[str, Any]) -> dict[str, Any]:
    """The quality gate's verdict on a remote answer, as the engine worker reports its own."""
    import quality

    verdict = quality.score(request, completion)
    return {"value": verdict.value, "reasons": verdict.reasons, "signals": verdict.signals}


def error_of(response: httpx.Response) -> str:
    """A refusal's status and OpenAI error message (cut to 200 characters), for the log."""
    try:
        message = response.json()["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = ""
    return f"HTTP {response.status_code} {str(message)[:200]}".strip()
