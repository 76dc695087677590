"""Predicted finish time of a local answer, and what the predictions are learned from.

Finish-time routing: each request goes to the backend where it is predicted to finish first,
and the estimate for a backend counts the work already running and queued on it::

    finish = (prefill tokens ahead + own uncached prompt tokens) / prefill rate
           + (decode tokens ahead + own expected answer tokens)  / decode rate

The rates are the backend's live, profiled ones (:class:`proxy.engine.rates.Rates`); the work
ahead is its :class:`~proxy.engine.rates.PendingWork`. The bundled engine with ``[local]
parallel`` > 1 is a batch, not a queue: its finish time is played forward from the rows ahead,
the batch's decode-step cost by number of rows and the request's own tokens
(:mod:`proxy.engine.batch.forecast`, :func:`batched`). This module adds the request's own part
(the share of its prompt a backend has cached is :mod:`proxy.routing.prefix_memory`'s):

* :class:`AnswerLengths`: how long an answer to a request is expected to be. ``max_tokens`` (or
  the engine's default) is a cap, and the expected length under that cap is learned per
  requested model from recent answers: seeded from the ledger at start-up, then kept current
  from finished requests. An answer cut short (by its own cap or a deadline) at n tokens only
  says "at least n": it counts as reaching a cap of n or less, and says nothing about a higher
  one. With nothing to go on, an answer is expected to be ``DEFAULT_ANSWER_TOKENS`` long (at
  most the cap): expecting every answer to run to a large default cap would predict even an
  idle engine too slow, and the lengths would never be learned. The client names the model,
  so the table keeps at most ``MAX_LENGTH_MODELS`` names (the busiest of the ledger's at
  start-up, then the first seen); the answers to any name past them are kept together, in one
  window of their own, as the report folds the names past its limit into ``other``: 1,500
  made-up names once cost about 2 KB each, for good (issue 39).
* :class:`PredictionErrors`: absolute percentage errors of the predictions of local answers that
  ran to their end, for ``/metrics`` (the ledger keeps every prediction for ``frugal report``).
* :class:`Ewma`: the API's observed latency, for ``[router] objective = "latency"``.
* :class:`Predictor`: the decision (``predicted_slow``) and the learning, for the router. A
  prediction is a point estimate: one that lands just under the deadline is a coin toss (the
  shared machine drifts, later arrivals take turns with an answer, bench/README.md). So a
  request is kept local only when its predicted finish, ``DEADLINE_MARGIN`` longer, still makes
  the deadline: 5% to spare, about the median error of a prediction on a quiet machine.
"""

from __future__ import annotations

import asyncio
import sqlite3
import statistics
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog
from prometheus_client.core import GaugeMetricFamily, Metric

from proxy.config import RouterSettings
from proxy.engine.batch.forecast import Forecast
from proxy.engine.rates import PendingWork, Rates, ewma
from proxy.routing.reasons import Reason

log = structlog.get_logger(__name__)

LEGACY_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
DEFAULT_ANSWER_TOKENS = 128  # expected answer length before any answer has been seen
LENGTH_WINDOW = 64  # answers remembered per model
MAX_LENGTH_MODELS = 100  # model names with answers of their own; the rest share one window
SEED_ROWS = 5000  # ledger rows read at start-up
ERROR_WINDOW = 500  # predictions the live MdAPE is taken over
DEADLINE_MARGIN = 0.05  # a local finish must be predicted this share short of the deadline


@dataclass(frozen=True, kw_only=True)
class Prediction:
    """What one backend is predicted to take for one request, from now."""

    backend: str
    seconds: float | None  # None while the backend's rates are unknown
    wait_s: float  # the work ahead of the request
    own_s: float  # the request's own prefill and decode
    prompt_tokens: float  # own uncached prompt tokens
    completion_tokens: float  # own expected answer tokens (all answers, for n > 1)
    jobs_ahead: int
    rates_source: str

    def as_dict(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "seconds": None if self.seconds is None else round(self.seconds, 3),
            "wait_s": round(self.wait_s, 3),
            "own_s": round(self.own_s, 3),
            "prompt_tokens": round(self.prompt_tokens),
            "completion_tokens": round(self.completion_tokens),
            "jobs_ahead": self.jobs_ahead,
            "rates": self.rates_source,
        }


def predict(
    backend: str,
    *,
    rates: Rates,
    pending: PendingWork,
    prompt_tokens: float,
    completion_tokens: float,
    slots: int = 1,
    overhead_s: float = 0.0,
) -> Prediction:
    """The predicted finish time on one backend. With ``slots`` requests served at once, a new one
    waits only when every slot is taken, and then for the work ahead shared among the slots."""
    own = rates.seconds(prompt_tokens, completion_tokens)
    ahead = pending.seconds(rates)
    wait = 0.0
    if ahead is not None and pending.jobs >= slots:
        wait = ahead / max(slots, 1)
    seconds = None if own is None else wait + own + overhead_s
    return Prediction(
        backend=backend,
        seconds=seconds,
        wait_s=wait,
        own_s=own or 0.0,
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        jobs_ahead=pending.jobs,
        rates_source=rates.source,
    )


def batched(
    backend: str,
    ahead: Forecast,
    *,
    pending: PendingWork,
    prompt_tokens: float,
    completion_tokens: float,
    rates_source: str,
) -> Prediction:
    """The finish time on a batched engine (``[local] parallel`` > 1): played forward by
    :func:`proxy.engine.batch.forecast.forecast` from the rows ahead, the batch's measured
    step costs and the request's own tokens. ``wait_s`` is the time until it gets a slot."""
    return Prediction(
        backend=backend,
        seconds=ahead.finish_s,
        wait_s=ahead.wait_s,
        own_s=ahead.finish_s - ahead.wait_s,
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        jobs_ahead=pending.jobs,
        rates_source=rates_source,
    )


def answer_cap(request: dict[str, Any], default_max_tokens: int, kind: str = "chat") -> int:
    """The most tokens one answer may have: the request's own cap, else the default."""
    asked = request.get("max_completion_tokens") or request.get("max_tokens")
    if isinstance(asked, int) and asked > 0:
        return asked
    return LEGACY_DEFAULT_MAX_TOKENS if kind == "complete" else default_max_tokens


def answers_per_request(request: dict[str, Any]) -> int:
    """``n`` answers, for each prompt of a legacy completion."""
    n = request.get("n")
    count = n if isinstance(n, int) and n > 0 else 1
    prompt = request.get("prompt")
    if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        count *= len(prompt)
    return count


class AnswerLengths:
    """Expected answer tokens per requested model, learned from recent answers; at most
    ``max_models`` names have answers of their own, the others share one window (``folded``)."""

    def __init__(self, window: int = LENGTH_WINDOW, max_models: int = MAX_LENGTH_MODELS) -> None:
        self.window = window
        self.max_models = max_models
        self._by_model: dict[str, deque[tuple[int, bool]]] = {}
        self._folded: deque[tuple[int, bool]] = deque(maxlen=window)  # names past max_models
        self._all: deque[tuple[int, bool]] = deque(maxlen=window)
        self.seeded = 0
        self.folded = 0  # answers kept in the shared window, for names past max_models

    def _own(self, key: str) -> deque[tuple[int, bool]] | None:
        """The window ``key``'s answers go to: its own, the shared one once the table is full
        (None: a name not seen yet while there is room)."""
        seen = self._by_model.get(key)
        if seen is None and len(self._by_model) >= self.max_models:
            return self._folded
        return seen

    def expected(self, model: str | None, cap: int) -> float:
        """Mean answer length under ``cap``, from the model's answers (else every model's):
        one that stopped on its own counts as its length (at most ``cap``), one cut short at
        ``cap`` tokens or more as ``cap``; one cut short of ``cap`` says nothing and is left
        out. A name past the table's ``max_models`` reads the answers of all of those."""
        for seen in (self._own(model or ""), self._all):
            useful = [min(n, cap) for n, cut in seen or () if not cut or n >= cap]
            if useful:
                return sum(useful) / len(useful)
        return float(min(cap, DEFAULT_ANSWER_TOKENS))

    def observe(self, model: str | None, tokens: int, *, cut: bool) -> None:
        if tokens < 0:
            return
        key = model or ""
        seen = self._own(key)
        if seen is None:
            seen = self._by_model[key] = deque(maxlen=self.window)
        elif seen is self._folded:
            self.folded += 1
        seen.append((tokens, cut))
        self._all.append((tokens, cut))

    def seed(self, rows: list[tuple[str | None, int]]) -> None:
        """Fill the models nothing has been observed for yet from ``(model, tokens)`` rows,
        oldest first (as :func:`read_ledger` returns them): the busiest first while the table
        has room, the others' answers into the shared window."""
        fresh: dict[str, deque[tuple[int, bool]]] = {}
        counts: dict[str, int] = {}
        for model, tokens in rows:
            key = model or ""
            if key in self._by_model:
                continue
            counts[key] = counts.get(key, 0) + 1
            fresh.setdefault(key, deque(maxlen=self.window)).append((int(tokens), False))
        room = max(0, self.max_models - len(self._by_model))
        kept = set(sorted(counts, key=lambda key: (-counts[key], key))[:room])
        for key, seen in fresh.items():
            if key in kept:
                self._by_model[key] = seen
        for model, tokens in rows:
            key = model or ""
            if key in fresh and key not in kept:
                self._folded.append((int(tokens), False))
                self.folded += 1
        if not self._all:
            for _, tokens in rows[-self.window :]:
                self._all.append((int(tokens), False))
        self.seeded = len(rows)

    def as_dict(self) -> dict[str, Any]:
        return {
            "models": len(self._by_model),
            "max_models": self.max_models,
            "folded_answers": self.folded,
            "seeded_from_ledger": self.seeded,
        }


def read_ledger(path: str, limit: int = SEED_ROWS) -> list[tuple[str | None, int]]:
    """``(requested_model, local answer tokens)`` of the last ``limit`` local answers that ran to
    their end, oldest first. Blocking: run it in a thread. An unreadable ledger gives []."""
    if not Path(path).is_file():
        return []
    try:
        conn = sqlite3.connect(f"file:{Path(path).resolve()}?mode=ro", uri=True, timeout=5)
    except sqlite3.Error:
        return []
    try:
        rows = conn.execute(
            "SELECT requested_model, local_completion_tokens FROM requests "
            "WHERE local_completion_tokens IS NOT NULL AND status < 400 "
            "AND reason NOT IN (?, ?) "
            "ORDER BY id DESC LIMIT ?",
            (Reason.LOCAL_TIMEOUT, Reason.LOCAL_ERROR, limit),
        ).fetchall()
    except sqlite3.Error:
        return []
    finally:
        conn.close()
    return [(model, int(tokens)) for model, tokens in reversed(rows)]


class PredictionErrors:
    """Absolute percentage errors of recent predictions; ``mdape`` is their median."""

    def __init__(self, window: int = ERROR_WINDOW) -> None:
        self._errors: deque[float] = deque(maxlen=window)
        self.count = 0

    def add(self, predicted_s: float, actual_s: float) -> None:
        if actual_s <= 0:
            return
        self._errors.append(abs(predicted_s - actual_s) / actual_s)
        self.count += 1

    @property
    def samples(self) -> int:
        return len(self._errors)

    def mdape(self) -> float | None:
        return statistics.median(self._errors) if self._errors else None


class Ewma:
    """Exponentially weighted moving average; None until the first value."""

    def __init__(self, alpha: float = 0.2) -> None:
        self.alpha = alpha
        self.value: float | None = None
        self.count = 0

    def add(self, value: float) -> None:
        self.value = ewma(self.value, value, self.alpha)
        self.count += 1


# Stop causes after which an answer's length and time say nothing about a finished answer.
_CUT_SHORT = frozenset({"deadline", "cancelled"})


class Predictor:
    """Decides whether a predicted finish is too slow, and learns from what happened.

    ``[router] predictive = false`` keeps the predictions (they are still recorded, and the
    error still measured) but never acts on them: the naive cascade.
    """

    def __init__(self, settings: RouterSettings) -> None:
        self.settings = settings
        self.lengths = AnswerLengths()
        self.errors = PredictionErrors()
        self.api_latency = Ewma()
        self._seeding: asyncio.Task[None] | None = None

    def start(self, ledger_path: str) -> None:
        """Learn answer lengths from the ledger, in a thread, without holding start-up."""
        self._seeding = asyncio.create_task(self._seed(ledger_path), name="seed-answer-lengths")

    async def _seed(self, ledger_path: str) -> None:
        rows = await asyncio.to_thread(read_ledger, ledger_path)
        self.lengths.seed(rows)
        log.info("answer_lengths_seeded", rows=len(rows))

    async def close(self) -> None:
        if self._seeding is not None and not self._seeding.done():
            self._seeding.cancel()
            try:
                await self._seeding
            except (asyncio.CancelledError, Exception):  # noqa: BLE001 - only stopping it
                pass

    def too_slow(self, seconds: float | None, timeout_s: float, *, deferred: bool = False) -> bool:
        """True when a local answer predicted to take ``seconds`` should go to the API now: past
        the local deadline once ``DEADLINE_MARGIN`` is added to it, or (objective "latency")
        slower than the API plus the margin. ``deferred`` work (``service_tier: "flex"``) said
        that slow is fine: only its deadline holds it."""
        if not self.settings.predictive or seconds is None:
            return False
        if seconds * (1.0 + DEADLINE_MARGIN) > timeout_s:
            return True
        api = self.api_latency.value
        if self.settings.objective == "latency" and api is not None and not deferred:
            return seconds > api + self.settings.latency_margin_s
        return False

    def learn(
        self,
        request: dict[str, Any],
        completion: dict[str, Any] | None,
        *,
        predicted_s: float | None,
        elapsed_s: float,
        comparable: bool,
    ) -> float | None:
        """Learn from one local attempt. Returns the actual time when it is comparable with the
        prediction (the answer ran to its end on the predicted backend), else None."""
        if completion is None:
            return None
        info = completion.get("frugal") or {}
        usage = completion.get("usage") or {}
        tokens = usage.get("completion_tokens")
        cut_short = info.get("stop_cause") in _CUT_SHORT
        if isinstance(tokens, int):
            answers = answers_per_request(request)
            finishes = {c.get("finish_reason") for c in completion.get("choices") or ()}
            model = request.get("model")
            self.lengths.observe(
                model if isinstance(model, str) else None,
                round(tokens / answers),
                cut=cut_short or "length" in finishes,
            )
        if predicted_s is None or not comparable or cut_short:
            return None
        self.errors.add(predicted_s, elapsed_s)
        return elapsed_s

    def observe(self, row: dict[str, Any]) -> None:
        """One finished request (its ledger row): the API's latency, when it answered."""
        if row.get("route") == "api" and (row.get("status") or 0) < 400:
            api_ms = row.get("api_ms") or 0.0
            if api_ms > 0:
                self.api_latency.add(api_ms / 1000)

    def health(self) -> dict[str, Any]:
        mdape = self.errors.mdape()
        return {
            "predictive": self.settings.predictive,
            "objective": self.settings.objective,
            "api_latency_s": None
            if self.api_latency.value is None
            else round(self.api_latency.value, 3),
            "prediction_mdape": None if mdape is None else round(mdape, 4),
            "prediction_samples": self.errors.samples,
            "answer_lengths": self.lengths.as_dict(),
        }

    def metrics(self) -> Iterator[Metric]:
        mdape = self.errors.mdape()
        if mdape is not None:
            yield GaugeMetricFamily(
                "frugal_prediction_error_ratio",
                "Median absolute percentage error of predicted local finish times (0.1 = 10%), "
                f"over the last {ERROR_WINDOW} local answers that ran to their end.",
                value=mdape,
            )
        yield GaugeMetricFamily(
            "frugal_prediction_samples",
            "Local answers the prediction error is measured on.",
            value=float(self.errors.samples),
        )
        if self.api_latency.value is not None:
            yield GaugeMetricFamily(
                "frugal_api_latency_seconds",
                "Moving average of the API's observed latency.",
                value=self.api_latency.value,
            )
