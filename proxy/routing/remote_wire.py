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

import random
from dataclasses import dataclass
from typing import Any

import httpx

from proxy.routing.remote_kinds import KINDS, Kind

__all__ = [
    "NOT_FORWARDED",
    "Wire",
    "completion_body",
    "error_of",
    "merge_answers",
    "request_body",
    "split_n",
    "stop_cause",
]

# Fields of a chat request a remote llama.cpp server is not sent (the proxy's own business).
NOT_FORWARDED = ("stream", "stream_options", "user", "metadata", "store", "service_tier")


@dataclass(frozen=True, kw_only=True)
class Wire:
    """What shapes every body a server is sent: the ``model`` it is asked for, the token
    ``cap`` when the client set none, whether ``logprobs`` are asked for the gate, and the
    server's ``kind``."""

    model: str
    cap: int
    logprobs: bool
    kind: Kind = KINDS["openai-compatible"]


def request_body(request: dict[str, Any], wire: Wire, *, stream: bool = False) -> dict[str, Any]:
    """The JSON body sent to the server for ``request``, answering at most ``wire.cap`` tokens,
    in the words of its kind; ``stream``: asked as a stream (a ``live`` one)."""
    body = {k: v for k, v in request.items() if k not in NOT_FORWARDED}
    body["model"] = wire.model
    if not (body.get("max_tokens") or body.get("max_completion_tokens")):
        body["max_tokens"] = wire.cap  # [local] default_max_tokens, as the engine would
    if wire.logprobs and not request.get("logprobs"):
        body.pop("top_logprobs", None)
    kind = wire.kind
    body = kind.adapt(body, gate_logprobs=wire.logprobs)
    if stream:
        body["stream"] = True
        if kind.stream_usage:
            body["stream_options"] = {"include_usage": True}
    return body


def completion_body(request: dict[str, Any], wire: Wire) -> dict[str, Any]:
    """The JSON body sent to the server's ``/completions`` for a legacy completion ``request``
    (never streamed: it is scored whole, then replayed, as the engine's), answering at most
    ``wire.cap`` tokens, in the words of its kind."""
    body = {k: v for k, v in request.items() if k not in NOT_FORWARDED}
    body["model"] = wire.model
    if not body.get("max_tokens"):
        body["max_tokens"] = wire.cap  # OpenAI's legacy default (16), as the engine would
    return wire.kind.adapt_completion(body, gate_logprobs=wire.logprobs)


def split_n(request: dict[str, Any], calls: int) -> list[dict[str, Any]]:
    """``request`` as ``calls`` requests of one answer each (``n`` above what the server
    answers at once), as the engine makes its ``n`` answers: seeds ``seed``, ``seed + 1``, ...
    when the client gave one, else random ones, and OpenAI's default temperature (1) when none
    was given, so that the answers are not ``calls`` copies of one greedy answer."""
    if calls <= 1:
        return [request]
    one = {**request, "n": 1}
    if one.get("temperature") is None:
        one["temperature"] = 1.0
    seed = request.get("seed")
    seeds = (
        [int(seed) + i for i in range(calls)]
        if seed is not None
        else [random.getrandbits(31) for _ in range(calls)]
    )
    return [{**one, "seed": s} for s in seeds]


def merge_answers(answers: list[dict[str, Any]]) -> dict[str, Any]:
    """The answers to :func:`split_n`'s requests, each scored (``frugal.quality``), as one
    completion: every answer a choice, the usage added up (the prompt counted once), and the
    request's verdict and stop cause the worst answer's, as the engine's ``tasks.merge``."""
    first = answers[0]
    if len(answers) == 1:
        return first
    choices = [{**a["choices"][0], "index": i} for i, a in enumerate(answers)]
    usages = [a.get("usage") or {} for a in answers]
    prompt = int(usages[0].get("prompt_tokens") or 0)
    completion = sum(int(u.get("completion_tokens") or 0) for u in usages)
    worst = min(answers, key=lambda a: _value(a["frugal"]["quality"]))
    info = dict(first["frugal"])
    info.update(
        stop_cause=worst["frugal"]["stop_cause"],
        prefill_s=sum(float(a["frugal"].get("prefill_s") or 0.0) for a in answers),
        decode_s=sum(float(a["frugal"].get("decode_s") or 0.0) for a in answers),
        quality=worst["frugal"]["quality"],
        answers=len(answers),
    )
    usage = {"prompt_tokens": prompt, "completion_tokens": completion}
    usage["total_tokens"] = prompt + completion
    return {**first, "choices": choices, "usage": usage, "frugal": info}


def _value(verdict: dict[str, Any]) -> float:
    value = verdict.get("value")
    return float(value) if value is not None else -1.0


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
