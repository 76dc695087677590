"""When a request would finish on the batched engine (``[local] parallel`` > 1), for routing.

The finish-time estimate (work ahead / rate + own work / rate) treats the engine as one queue.
A batch is not one: up to ``slots`` sequences run at once, a decode step gives each running answer a
token (more when a drafted token is accepted) and costs more the more sequences it has, and a
joining prompt is prefilled in steps of its own that take turns with the decode steps
(``batch/turns.py``: a prefill step of t seconds, of ``CHUNK`` tokens at most, is followed by up
to 4t seconds of decode steps). :func:`forecast` plays that schedule forward from what is in the
engine now, step kind by step kind, in the batch's measured costs, until the new request is done:

    running   each job's prompt tokens still to prefill and answer tokens still to come (the
              worker reports its sequences' progress; the expected answer length is the
              tracker's: the mean answer length seen, capped by the job's max_tokens)
    queued    the jobs waiting for a slot, in order, then the new request
    costs     :class:`BatchCosts`: the batch's raw prefill rate, and its decode steps by width
              (the number of sequences in the step): seconds a step and tokens a sequence gets
              from it (``/healthz`` ``engine.batch.step_ms_by_width``, drafted rows included),
              else by rows (``step_ms_by_rows``), measured

Every prompt ahead of the new one is read first, one at a time in arrival order (the worker
reads one joining prompt at a time), each prefill step pausing the answers that run, and a
decode step of k sequences costs the measured k-wide step. A width not measured yet is
estimated from the measured ones, never cheaper than a row per step's worth of a one-row step
beyond the widest measured (the batch's gain on this CPU is small: a four-row step cost 3.5-3.9
one-row steps, bench/README.md, (6)), so an early burst is not predicted as if batching were
free.

It jumps from event to event (a prefill step, an answer done, the prompts' turn). What it leaves
out: prefix reuse among the jobs ahead (their prompts count in full; the new request's own
cached share is the caller's), the decode steps an answer gets when it is due (batch/turns.py),
and the requests that arrive after the new one (their first prompt step can come before its
answer's turn). The router admits a prediction only with a margin under the deadline
(``proxy.routing.estimator.DEADLINE_MARGIN``) for these and for the machine's drift.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["CHUNK", "SHARE_RATIO", "BatchCosts", "Forecast", "Work", "forecast"]

SHARE_RATIO = 4.0  # decode seconds owed per prefill second while answers run (batch/turns.py)
CHUNK = 512  # prompt tokens a prefill step takes at most (n_batch)


@dataclass(eq=False)  # told apart by identity
class Work:
    """One job's tokens still to do."""

    prefill: float
    decode: float


@dataclass(frozen=True, kw_only=True)
class BatchCosts:
    """The batch's measured costs: raw prefill tok/s, decode-step seconds by width (sequences
    in the step), and the answer tokens each sequence gets from a step of that width."""

    prefill_tok_s: float
    step_s: Mapping[int, float]  # measured sizes only; at least one
    tokens: Mapping[int, float] = field(default_factory=dict)  # per sequence a step; 1 if absent

    @classmethod
    def from_health(
        cls,
        batch: Mapping[str, Any] | None,
        *,
        prefill_tok_s: float | None,
        decode_tok_s: float | None,
    ) -> BatchCosts | None:
        """From the batch's ``health()`` when it has measured them (by width, else by rows),
        else from the engine's single-path rates (one row = one decode step at
        ``decode_tok_s``); None when neither."""
        batch = batch or {}
        steps: dict[int, float] = {}
        tokens: dict[int, float] = {}
        for width, cost in (batch.get("step_ms_by_width") or {}).items():
            if cost.get("ms"):
                steps[int(width)] = float(cost["ms"]) / 1000.0
                tokens[int(width)] = max(1.0, float(cost.get("tokens_per_sequence") or 1.0))
        if not steps:
            steps = {
                int(rows): float(cost["ms"]) / 1000.0
                for rows, cost in (batch.get("step_ms_by_rows") or {}).items()
                if cost.get("ms")
            }
        prefill = batch.get("prefill_tok_s") or prefill_tok_s
        if not steps and decode_tok_s:
            steps = {1: 1.0 / decode_tok_s}
        if not prefill or not steps:
            return None
        return cls(prefill_tok_s=float(prefill), step_s=steps, tokens=tokens)

    def step(self, rows: int) -> float:
        """Seconds of a decode step of ``rows`` sequences: measured, else interpolated between
        the nearest measured sizes, else extended from the largest at a one-row step's worth
        per extra row (a one-row step: the smallest size's cost per row), or along the last
        measured slope where that is steeper: an unmeasured width is never predicted cheaper
        than the batch has shown it to be."""
        sizes = sorted(self.step_s)
        if rows in self.step_s:
            return self.step_s[rows]
        below = [r for r in sizes if r < rows]
        above = [r for r in sizes if r > rows]
        if below and above:
            lo, hi = below[-1], above[0]
            frac = (rows - lo) / (hi - lo)
            return self.step_s[lo] + frac * (self.step_s[hi] - self.step_s[lo])
        if above:  # fewer rows than any measured size
            return self.step_s[above[0]] * rows / above[0]
        top = sizes[-1]
        slope = self.step_s[sizes[0]] / sizes[0]
        if len(sizes) >= 2:
            slope = max(slope, (self.step_s[top] - self.step_s[sizes[-2]]) / (top - sizes[-2]))
        return self.step_s[top] + slope * (rows - top)

    def per_step(self, rows: int) -> float:
        """Answer tokens each of ``rows`` sequences gets from one decode step (at least 1):
        measured at that width, else at the nearest measured width below it, else 1."""
        below = [r for r in self.tokens if r <= rows]
        return max(1.0, self.tokens[max(below)]) if below else 1.0


@dataclass(frozen=True)
class Forecast:
    """Seconds from now until the new request gets a slot, and until it is done."""

    wait_s: float
    finish_s: float


def forecast(
    running: list[Work],
    queued: list[Work],
    new: Work | None,
    *,
    slots: int,
    costs: BatchCosts,
    chunk: int = CHUNK,
    limit_s: float = 3600.0,
) -> Forecast:
    """Play the batch's schedule forward, step kind by step kind; see the module docstring.
    With ``new`` None, the time until everything in the engine now is done."""
    active = [Work(w.prefill, w.decode) for w in running]
    waiting = [Work(w.prefill, w.decode) for w in queued]
    mine = Work(new.prefill, new.decode) if new is not None else None
    if mine is not None:
        waiting.append(mine)
    now, admitted, credit = 0.0, None, 0.0
    while now < limit_s:
        while waiting and len(active) < max(1, slots):
            job = waiting.pop(0)
            if job is mine:
                admitted = now
            active.append(job)
        if mine is not None and admitted is not None and mine not in active:
            return Forecast(admitted, now)
        if not active:
            return Forecast(admitted or 0.0, now)
        filler = next((w for w in active if w.prefill > 0), None)
        decoders = [w for w in active if w.prefill <= 0]
        if filler is not None and (credit >= 0.0 or not decoders):
            take = min(filler.prefill, float(chunk))  # one prefill step
            dt = take / costs.prefill_tok_s
            filler.prefill -= take
            if decoders:
                credit -= SHARE_RATIO * dt
        else:  # decode steps until an answer is done, or the next prompt's turn
            step = costs.step(len(decoders))
            gain = costs.per_step(len(decoders))
            steps = math.ceil(min(w.decode for w in decoders) / gain - 1e-9)
            if filler is not None:
                steps = min(steps, math.ceil(-credit / step - 1e-9))
            steps = max(1, steps)
            dt = steps * step
            for w in decoders:
                w.decode -= steps * gain
            credit = min(credit + dt, 0.0) if filler is not None else 0.0
        now += dt
        active = [w for w in active if w.prefill > 1e-9 or w.decode > 1e-9]
    return Forecast(admitted if admitted is not None else limit_s, limit_s)
