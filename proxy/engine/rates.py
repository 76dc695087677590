"""What the engine can do and what it still has to do, for routing by predicted finish time.

* :class:`Rates`: prefill and decode tok/s, measured at start-up (calibration) and then kept
  current from real requests (EWMA), as profiling-informed scheduling asks: measure first, then
  decide.
* :class:`WorkTracker`: the work queued and running, in tokens. The proxy has no tokenizer, so a
  prompt's length is estimated from its UTF-8 bytes and the bytes-per-token ratio learned from
  the engine's own answers; the answer's length is bounded by ``max_tokens`` and expected from
  the mean answer length seen so far.

Finish-time routing predicts a backend's finish time as remaining prefill / prefill rate + decode
tokens / decode rate, counting the work already running and queued; :meth:`PendingWork.seconds`
is that.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from proxy.engine.batch.forecast import Work

DEFAULT_BYTES_PER_TOKEN = 4.0
MESSAGE_OVERHEAD_TOKENS = 4  # role markers of a chat template, per message
OVERFLOW_MARGIN = 2.0  # an estimate this many times past n_ctx is taken as certain
ALPHA = 0.2  # weight of the newest value in the moving averages of rates and lengths


def ewma(old: float | None, new: float, alpha: float = ALPHA) -> float:
    """Exponentially weighted moving average: ``new`` moves ``old`` by ``alpha`` of the gap
    (``new`` itself while there is no ``old``)."""
    return new if old is None else old + alpha * (new - old)


@dataclass(frozen=True, kw_only=True)
class Rates:
    prefill_tok_s: float | None
    decode_tok_s: float | None
    source: str  # "calibration", "requests" or "none"

    def seconds(self, prefill_tokens: float, decode_tokens: float) -> float | None:
        """Predicted seconds for this much work; None while a rate is unknown."""
        if not self.prefill_tok_s or not self.decode_tok_s:
            return None
        return prefill_tokens / self.prefill_tok_s + decode_tokens / self.decode_tok_s


@dataclass(frozen=True, kw_only=True)
class PendingWork:
    """Tokens still ahead of a new request: the running job's remainder plus the queue's."""

    jobs: int
    prefill_tokens: float
    decode_tokens: float  # expected, from the mean answer length (at most max_tokens)
    decode_tokens_max: float  # if every answer ran to its max_tokens

    def seconds(self, rates: Rates) -> float | None:
        return rates.seconds(self.prefill_tokens, self.decode_tokens)

    def as_dict(self) -> dict[str, Any]:
        return {
            "jobs": self.jobs,
            "prefill_tokens": round(self.prefill_tokens),
            "decode_tokens": round(self.decode_tokens),
            "decode_tokens_max": round(self.decode_tokens_max),
        }


def text_bytes(request: dict[str, Any]) -> int:
    """UTF-8 bytes of the text a request asks the model to read (messages, or a prompt)."""
    total = 0
    prompt = request.get("prompt")
    if isinstance(prompt, str):
        total += len(prompt.encode("utf-8"))
    elif isinstance(prompt, list):
        total += sum(len(p.encode("utf-8")) for p in prompt if isinstance(p, str))
    for message in request.get("messages") or ():
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, str):
            total += len(content.encode("utf-8"))
        elif isinstance(content, list):
            for part in content:
                if isinstance(part, dict) and isinstance(part.get("text"), str):
                    total += len(part["text"].encode("utf-8"))
        if isinstance(message, dict) and message.get("tool_calls"):
            total += len(json.dumps(message["tool_calls"]).encode("utf-8"))
    if request.get("tools"):
        total += len(json.dumps(request["tools"]).encode("utf-8"))
    return total


@dataclass
class _Ticket:
    prompt_tokens: float
    max_tokens: int
    started: float | None = None
    share: str = ""  # the client key's label it waits under (fair_queue.py)


@dataclass
class WorkTracker:
    """Token estimates of the jobs in the engine's queue, and what it learns from answers."""

    bytes_per_token: float = DEFAULT_BYTES_PER_TOKEN
    mean_answer_tokens: float | None = None
    alpha: float = 0.2
    _tickets: dict[int, _Ticket] = field(default_factory=dict)
    _ids: Any = field(default_factory=lambda: itertools.count(1))

    def estimate_prompt_tokens(self, request: dict[str, Any]) -> float:
        messages = len(request.get("messages") or ())
        overhead = MESSAGE_OVERHEAD_TOKENS * messages
        return text_bytes(request) / self.bytes_per_token + overhead

    def certainly_too_long(
        self, request: dict[str, Any], n_ctx: int, max_token_bytes: int
    ) -> int | None:
        """A token count showing the prompt cannot fit ``n_ctx``, or None when it may fit.

        Two cheap tests, before the request waits in the queue: the bytes divided by the most
        bytes any one token stands for (a hard lower bound), and the learned estimate when it
        is ``OVERFLOW_MARGIN`` times past the context.
        """
        size = text_bytes(request)
        if max_token_bytes > 0 and size // max_token_bytes >= n_ctx:
            return size // max_token_bytes
        estimate = self.estimate_prompt_tokens(request)
        if estimate >= OVERFLOW_MARGIN * n_ctx:
            return int(estimate)
        return None

    def admit(self, request: dict[str, Any], max_tokens: int, share: str = "") -> int:
        ticket = next(self._ids)
        estimate = self.estimate_prompt_tokens(request)
        self._tickets[ticket] = _Ticket(estimate, max_tokens, share=share)
        return int(ticket)

    def _counted(self, ahead: Mapping[str, int] | None) -> Callable[[_Ticket], bool]:
        """Whether a job counts as work ahead: every started one; a queued one when
        ``ahead`` is None, else the first ``ahead[share]`` of its share's (oldest first)."""
        taken: dict[str, int] = {}

        def counted(t: _Ticket) -> bool:
            if t.started is not None or ahead is None:
                return True
            seen = taken.get(t.share, 0)
            taken[t.share] = seen + 1
            return seen < ahead.get(t.share, 0)

        return counted

    def start(self, ticket: int) -> None:
        if ticket in self._tickets:
            self._tickets[ticket].started = time.monotonic()

    def finish(
        self, ticket: int, request: dict[str, Any], completion: dict[str, Any] | None
    ) -> None:
        self._tickets.pop(ticket, None)
        if completion is None:
            return
        usage = completion.get("usage") or {}
        prompt_tokens = int(usage.get("prompt_tokens") or 0)
        messages = len(request.get("messages") or ())
        content_tokens = prompt_tokens - MESSAGE_OVERHEAD_TOKENS * messages
        size = text_bytes(request)
        if content_tokens >= 16 and size > 0:
            ratio = size / content_tokens
            self.bytes_per_token += self.alpha * (ratio - self.bytes_per_token)
        answer = usage.get("completion_tokens")
        if isinstance(answer, int) and answer > 0:
            self.mean_answer_tokens = ewma(self.mean_answer_tokens, float(answer), self.alpha)

    def expected_answer(self, ticket: int) -> float:
        """Answer tokens a job is expected to produce: the mean seen, capped by its max_tokens."""
        t = self._tickets[ticket]
        expected = float(t.max_tokens)
        if self.mean_answer_tokens is not None:
            expected = min(expected, self.mean_answer_tokens)
        return expected

    def batch_work(
        self, progress: Mapping[int, tuple[int, int]], ahead: Mapping[str, int] | None = None
    ) -> tuple[list[Work], list[Work]]:
        """The jobs started and those still queued, oldest first, as tokens still to prefill
        and to decode. ``progress`` is what the worker last reported of a started job, by
        ticket: prompt tokens still to prefill and answer tokens so far. With ``ahead`` (by
        share, :meth:`FairSlots.ahead <proxy.engine.fair_queue.FairSlots.ahead>`), only the
        queued jobs a new one would follow."""
        running: list[Work] = []
        queued: list[Work] = []
        counted = self._counted(ahead)
        for ticket, t in self._tickets.items():
            if not counted(t):
                continue
            expected = self.expected_answer(ticket)
            if t.started is None:
                queued.append(Work(t.prompt_tokens, expected))
                continue
            left, generated = progress.get(ticket, (t.prompt_tokens, 0))
            # A job already past the expected length still has at least a token to go.
            running.append(Work(float(left), max(expected - generated, 1.0)))
        return running, queued

    def pending(self, rates: Rates, ahead: Mapping[str, int] | None = None) -> PendingWork:
        """The work in the engine; with ``ahead``, the queued jobs a new one would follow."""
        now = time.monotonic()
        prefill = decode = decode_max = 0.0
        jobs = 0
        counted = self._counted(ahead)
        for ticket, t in self._tickets.items():
            if not counted(t):
                continue
            jobs += 1
            expected = self.expected_answer(ticket)
            left_prefill, done_decode = t.prompt_tokens, 0.0
            if t.started is not None and rates.prefill_tok_s and rates.decode_tok_s:
                elapsed = now - t.started
                prefill_time = t.prompt_tokens / rates.prefill_tok_s
                if elapsed < prefill_time:
                    left_prefill = t.prompt_tokens - elapsed * rates.prefill_tok_s
                else:
                    left_prefill = 0.0
                    done_decode = (elapsed - prefill_time) * rates.decode_tok_s
            prefill += left_prefill
            # A job already past the mean length still has at least a token to go.
            decode += max(expected - done_decode, 1.0)
            decode_max += max(t.max_tokens - done_decode, 1.0)
        return PendingWork(
            jobs=jobs,
            prefill_tokens=prefill,
            decode_tokens=decode,
            decode_tokens_max=decode_max,
        )
