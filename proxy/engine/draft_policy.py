"""How long each speculative draft should be, from what drafts and decode steps have cost.

Speculation pays only when enough drafted tokens are accepted. :class:`DraftPolicy` predicts the
speed-up of each draft length from the acceptance rate seen so far and the cost of a verify batch
of that many rows, and drafts nothing when no length pays. The costs are :class:`StepCosts`:
moving averages of the steps the decoding loop really ran, by number of rows, not a start-up fit
(a calibration taken while the machine was busy, or a linear fit from 1 and 8 rows, mispredicts
the small batches that matter); :class:`VerifyCost` is that start-up calibration, which only
seeds them. Where a cost or an acceptance rate is still uncertain, the policy tries a short
draft when an optimistic estimate says it would pay, so that it learns both. Used by the single
path's :class:`~proxy.engine.speculative.Speculator` and by the batch, which also carries the
acceptance of each kind of draft from one request to the next (:class:`Priors`): without it,
every free-chat request explored from the same hopeful start and paid for drafts that fail.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["DraftPolicy", "Priors", "StepCosts", "VerifyCost"]


@dataclass(frozen=True, kw_only=True)
class VerifyCost:
    """Measured seconds of one verify batch of n rows: ``fixed + per_row * n``."""

    fixed: float
    per_row: float

    def __call__(self, rows: int) -> float:
        return self.fixed + self.per_row * rows


class StepCosts:
    """Seconds of one decode step of ``rows`` rows, learned from the steps really run.

    Each size keeps a moving average of its measured wall time (a sample more than twice the
    average, a step the shared machine preempted, counts as twice the average). A size not
    measured yet is estimated from the nearest measured smaller one plus ``row_prior`` of a
    one-row step per extra row, and never above a measured larger one: optimistic on purpose, so
    that the policy tries it and then knows. ``prior`` (the start-up calibration) only seeds the
    one-row cost until the first real step.
    """

    def __init__(
        self,
        max_rows: int,
        *,
        prior: VerifyCost | None = None,
        alpha: float = 0.15,
        row_prior: float = 0.35,
    ) -> None:
        self.max_rows = max(1, max_rows)
        self.alpha = alpha
        self.row_prior = row_prior
        self.mean: list[float | None] = [None] * (self.max_rows + 1)
        self.count: list[int] = [0] * (self.max_rows + 1)
        self._seed = prior(1) if prior is not None else 0.02

    def observe(self, rows: int, seconds: float) -> None:
        if not 1 <= rows <= self.max_rows or seconds <= 0:
            return
        old = self.mean[rows]
        if old is None:
            self.mean[rows] = seconds
        else:
            sample = min(seconds, 2.0 * old) if self.count[rows] >= 3 else seconds
            self.mean[rows] = old + self.alpha * (sample - old)
        self.count[rows] += 1

    def __call__(self, rows: int) -> float:
        rows = max(1, min(rows, self.max_rows))
        known = self.mean[rows]
        if known is not None:
            return known
        one = self.mean[1] if self.mean[1] is not None else self._seed
        below = next((r for r in range(rows - 1, 0, -1) if self.mean[r] is not None), 0)
        base = self.mean[below] if below else 0.0
        estimate = (base or one) + self.row_prior * one * (rows - max(below, 1))
        above = next(
            (m for r in range(rows + 1, self.max_rows + 1) if (m := self.mean[r]) is not None),
            None,
        )
        return estimate if above is None else min(estimate, above)

    def as_dict(self) -> dict[str, Any]:
        """Measured milliseconds by number of rows, and how many steps each is from."""
        return {
            str(r): {"ms": round(m * 1000, 2), "steps": self.count[r]}
            for r, m in enumerate(self.mean)
            if m is not None
        }


@dataclass(kw_only=True)
class DraftPolicy:
    """Chooses each step's draft length from the acceptance seen so far and the step costs.

    Acceptance is modelled as geometric: each drafted token is accepted with probability ``p``
    while all before it were, so a draft of k tokens yields (1 - p^(k+1)) / (1 - p) tokens for
    one verify batch of k + 1 rows plus k drafted tokens. ``p`` is the measured rate (accepted
    tokens over accepted tokens plus rejections), starting from ``prior`` weighted as
    ``prior_weight`` tokens. The length with the best predicted speed-up over a plain one-row
    step wins; none (k = 0) when no length beats ``min_gain``. While ``p`` is uncertain, a
    draft of at most ``explore_max`` tokens is still tried when ``p`` one standard error higher
    would pay: an exploration that stops by itself once enough drafts have failed.
    """

    max_draft: int
    cost: Callable[[int], float]
    draft_cost_s: float = 0.0
    prior: float = 0.6
    prior_weight: float = 4.0
    adaptive: bool = True
    min_gain: float = 1.02
    explore_max: int = 2
    others: int = 0  # rows of other sequences in the same step (the batch)
    accepted: int = 0
    rejected: int = 0
    explored: int = field(default=0, repr=False)

    @property
    def p(self) -> float:
        return (self.accepted + self.prior * self.prior_weight) / (
            self.accepted + self.rejected + self.prior_weight
        )

    @property
    def p_high(self) -> float:
        p = self.p
        trials = self.accepted + self.rejected + self.prior_weight
        return min(0.99, p + math.sqrt(p * (1.0 - p) / trials))

    def gain(self, k: int, p: float | None = None) -> float:
        p = self.p if p is None else p
        expected = float(k + 1) if p >= 1.0 else (1.0 - p ** (k + 1)) / (1.0 - p)
        # In a batch the step also decodes ``others`` rows of other sequences, which the draft
        # slows down too: what counts is the tokens of the whole step per second.
        tokens = (self.others + expected) / (self.others + 1)
        return tokens * self.cost(1) / (self.cost(k + 1) + k * self.draft_cost_s)

    def _best(self, limit: int, p: float) -> tuple[int, float]:
        best_k, best = 0, 1.0
        for k in range(1, limit + 1):
            g = self.gain(k, p)
            if g > best:
                best_k, best = k, g
        return best_k, best

    def choose(self, room: int) -> int:
        limit = max(0, min(self.max_draft, room))
        if not self.adaptive or limit == 0:
            return limit
        best_k, best = self._best(limit, self.p)
        if best >= self.min_gain:
            return best_k
        hopeful_k, hopeful = self._best(min(limit, self.explore_max), self.p_high)
        if hopeful >= self.min_gain:
            self.explored += 1
            return hopeful_k
        return 0

    def update(self, drafted: int, accepted: int) -> None:
        if drafted <= 0:
            return
        self.accepted += accepted
        if accepted < drafted:
            self.rejected += 1


class Priors:
    """The acceptance a new request's draft policies start from, by kind of draft (n-gram
    length), learned from the requests that ended before it.

    A request's policy for one kind starts at ``self[kind]``, weighted as ``prior_weight``
    tokens, and ends with that prior updated by its own drafts (:attr:`DraftPolicy.p`); that
    estimate is the next request's prior. So a run of free-chat requests, where drafts fail,
    lowers it request by request until the policy's optimistic estimate no longer pays for a
    draft, and the next requests decode as plain ones do; copy-heavy requests raise it. It
    never goes below ``floor``: at the floor a request still tries one short draft of each kind
    (its optimistic estimate pays; one failure turns it off), so that copy-heavy work after a
    long stretch of chat finds its drafts again.
    """

    def __init__(
        self,
        start: dict[int, float],
        *,
        default: float,
        floor: float = 0.35,
        ceiling: float = 0.95,
    ) -> None:
        self.values = dict(start)
        self.default = default
        self.floor = floor
        self.ceiling = ceiling

    def __getitem__(self, kind: int) -> float:
        return self.values.get(kind, self.default)

    def learn(self, policies: dict[int, DraftPolicy]) -> None:
        """Take one finished request's policies: each kind it drafted moves to its estimate."""
        for kind, policy in policies.items():
            if policy.accepted + policy.rejected:
                self.values[kind] = min(self.ceiling, max(self.floor, policy.p))

    def as_dict(self) -> dict[str, float]:
        return {str(kind): round(p, 3) for kind, p in sorted(self.values.items())}
