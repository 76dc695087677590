"""What a remote llama.cpp server is sent for a chat request or a legacy completion, and how
its answer is read.

The body is the client's request less the proxy's own fields (:data:`NOT_FORWARDED`), with the
backend's model, the engine's default ``max_tokens`` when the client set none, and ``logprobs``
asked for when the backend gives them (for the quality gate), in the words of the backend's kind
(:mod:`proxy.routing.remote_kinds`). The answer's stop reason is said
in the engine's words (:func:`stop_cause`); the answer is scored by the engine's own gate
(:class:`proxy.engine.gate.Gate`, run in a thread by the caller).

One POST (:func:`post`) reads the answer chunk by chunk, never past ``max_answer_bytes``
(:mod:`proxy.routing.remote_stream`'s bounded reads), a refusal's body only up to
:data:`ERROR_BODY_BYTES`; a body (or a stream's line) over :data:`PARSE_IN_THREAD_BYTES` is
parsed in a thread, so that the event loop is not held meanwhile. What it read is a
:class:`Reply`.
"""

from __future__ import annotations

import asyncio
import json
import random
from dataclasses import dataclass
from typing import Any

import httpx

from proxy.routing.remote_kinds import KINDS, Kind
from proxy.routing.remote_stream import Relay, bounded_lines, read_bounded

__all__ = [
    "ERROR_BODY_BYTES",
    "NOT_FORWARDED",
    "PARSE_IN_THREAD_BYTES",
    "Reply",
    "Wire",
    "completion_body",
    "error_of",
    "merge_answers",
    "post",
    "request_body",
    "split_n",
    "stop_cause",
]

# Fields of a chat request a remote llama.cpp server is not sent (the proxy's own business).
NOT_FORWARDED = ("stream", "stream_options", "user", "metadata", "store", "service_tier")
PARSE_IN_THREAD_BYTES = 256 * 1024  # a JSON answer (or stream line) this big is parsed in a thread
ERROR_BODY_BYTES = 64 * 1024  # the most read of a refusal's body (for its message)
_NOT_PARSED = object()


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


@dataclass(frozen=True)
class Reply:
    """A server's answer to one POST: its ``status``, its ``body`` (a refusal's, cut to
    :data:`ERROR_BODY_BYTES`), and the JSON a 200 parsed to (or ``_NOT_PARSED``)."""

    status: int
    body: bytes = b""
    parsed: Any = _NOT_PARSED

    def json(self) -> Any:
        if self.parsed is _NOT_PARSED:
            raise ValueError("the answer is not JSON")
        return self.parsed

    def error(self) -> str:
        """A refusal's status and message, for the log (:func:`error_of`)."""
        return error_of(httpx.Response(self.status, content=self.body))


async def post(
    client: httpx.AsyncClient, path: str, body: dict[str, Any], relay: Relay, limit: int
) -> Reply:
    """POST ``body`` to ``path``, the answer read up to ``limit`` bytes (``max_answer_bytes``); a
    stream is read to its end here, its text handed to ``relay`` as it comes, and its answer
    returned as the JSON a non-streamed call would have had."""
    async with client.stream("POST", path, json=body) as response:
        if response.status_code != 200:
            refusal = await read_bounded(response.aiter_bytes(), ERROR_BODY_BYTES, cut=True)
            return Reply(response.status_code, refusal)
        if not body.get("stream"):
            raw = await read_bounded(response.aiter_bytes(), limit)
            try:
                parsed = await _parse(raw)
            except ValueError:
                return Reply(200)  # not JSON: the caller says so
            return Reply(200, parsed=parsed)
        answer = relay.start()
        async for line in bounded_lines(response.aiter_bytes(), limit):
            if line.startswith("data:"):
                data = line[5:].strip()
                if len(data) > PARSE_IN_THREAD_BYTES:
                    piece = await asyncio.to_thread(answer.feed, data)
                else:
                    piece = answer.feed(data)
                relay.say(piece)
                if answer.done:
                    break
        completion = answer.completion()  # StreamCut when it ended without a finish
    return Reply(200, parsed=completion)


async def _parse(raw: bytes) -> Any:
    """JSON of ``raw``: in a thread when it is big, so that the loop is not held meanwhile."""
    if len(raw) > PARSE_IN_THREAD_BYTES:
        return await asyncio.to_thread(json.loads, raw)
    return json.loads(raw)
