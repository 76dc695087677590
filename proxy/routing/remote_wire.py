"""What a remote llama.cpp server is sent for a chat request or a legacy completion, and how
its answer is read.

The body is the client's request less the proxy's own fields (:data:`NOT_FORWARDED`), with the
backend's model, the engine's default ``max_tokens`` when the client set none, and ``logprobs``
asked for when the backend gives them (for the quality gate), in the words of the backend's kind
(:mod:`proxy.routing.remote_kinds`). The answer's stop reason is said
in the engine's words (:func:`stop_cause`); the answer is scored by the engine's own gate
(:class:`proxy.engine.gate.Gate`, run in a thread by the caller).
"""

from __future__ import annotations

from typing import Any

import httpx

from proxy.routing.remote_kinds import KINDS, Kind

__all__ = [
    "NOT_FORWARDED",
    "completion_body",
    "error_of",
    "request_body",
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


def completion_body(
    request: dict[str, Any],
    *,
    model: str,
    cap: int,
    logprobs: bool,
    kind: Kind = KINDS["openai-compatible"],
) -> dict[str, Any]:
    """The JSON body sent to the server's ``/completions`` for a legacy completion ``request``
    (never streamed: it is scored whole, then replayed, as the engine's), answering at most
    ``cap`` tokens, in the words of its ``kind``."""
    body = {k: v for k, v in request.items() if k not in NOT_FORWARDED}
    body["model"] = model
    if not body.get("max_tokens"):
        body["max_tokens"] = cap  # OpenAI's legacy default (16), as the engine would
    return kind.adapt_completion(body, gate_logprobs=logprobs)


def stop_cause(completion: dict[str, Any], cap: int) -> str:
    """Why the remote stopped, in the engine's words: a cut by the client's own cap is not the
    backend's fault (``max_tokens``), a cut short of it is (``context_full``)."""
    choice = completion["choices"][0]
    if choice.get("finish_reason") != "length":
        return "eos"
    tokens = int((completion.get("usage") or {}).get("completion_tokens") or 0)
    return "max_tokens" if tokens >= cap else "context_full"


def error_of(response: httpx.Response) -> str:
    """A refusal's status and OpenAI error message (cut to 200 characters), for the log."""
    try:
        message = response.json()["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = ""
    return f"HTTP {response.status_code} {str(message)[:200]}".strip()
