"""What the audits say: precision of accepted local answers, with a 95% interval.

Each audit stands for ``weight`` local attempts (1 / the sampling rate when it was drawn). The
estimates are ratios of weighted counts, so they stay unbiased when the rate changes during a
month: 100 audits at rate 0.05 and 100 at rate 0.01 are not an even mix of the traffic, the
second half stands for five times as many attempts.

The interval is Wilson's score interval over the weighted counts, at the *effective* sample
size of Kish: ``n_eff = (Σw)² / Σw²``. A weighted share ``p = Σw·y / Σw`` has variance about
``p(1 − p) / n_eff`` (the design effect of unequal weights), so Wilson's interval for ``n_eff``
draws is the interval for ``p``. With equal weights ``n_eff`` is the number of audits and this
is the textbook Wilson interval; uneven weights shrink ``n_eff`` and widen it. Wilson (rather
than the normal approximation) stays inside [0, 1] and keeps its coverage near 0 and 1, where
precision estimates live.

Three shares, each overall, per task kind and per requested model:

* ``precision``: of the accepted answers, the share that were correct;
* ``acceptance``: of the audited attempts, the share the gate accepted;
* ``rejected_but_correct``: of the rejected answers, the share that were correct (the money
  left on the table).

A failed audit (no verdict) counts in ``audits`` and ``failed`` and in the acceptance rate,
never as correct nor as wrong.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from proxy.ledger.audits.audit_record import AuditRecord

Z95 = 1.959963984540054  # the 97.5% quantile of the standard normal


def wilson(p: float, n: float, z: float = Z95) -> tuple[float, float]:
    """Wilson's score interval for a share ``p`` seen in ``n`` (possibly effective) draws."""
    if n <= 0:
        return (0.0, 1.0)
    z2 = z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z / (1 + z2 / n) * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
    return (max(0.0, centre - half), min(1.0, centre + half))


@dataclass(frozen=True, kw_only=True)
class Share:
    """A weighted share with its 95% interval; ``value`` is None when there is nothing to
    count (then the interval is [0, 1])."""

    value: float | None
    low: float
    high: float
    n: int  # the audits counted
    n_eff: float  # Kish's effective sample size of their weights

    @property
    def interval(self) -> tuple[float, float]:
        return (self.low, self.high)


def weighted_share(pairs: Iterable[tuple[float, bool]], z: float = Z95) -> Share:
    """The share of ``(weight, success)`` pairs that succeeded, weighted, with its interval."""
    n, total, hits, squares = 0, 0.0, 0.0, 0.0
    for weight, success in pairs:
        n += 1
        total += weight
        squares += weight * weight
        hits += weight if success else 0.0
    if total <= 0:
        return Share(value=None, low=0.0, high=1.0, n=n, n_eff=0.0)
    p = hits / total
    n_eff = total * total / squares
    low, high = wilson(p, n_eff, z)
    return Share(value=p, low=low, high=high, n=n, n_eff=n_eff)


@dataclass(frozen=True, kw_only=True)
class Estimate:
    audits: int  # every audit, failed ones included
    failed: int  # audits without a verdict
    precision: Share
    acceptance: Share
    rejected_but_correct: Share


def estimate(audits: Sequence[AuditRecord]) -> Estimate:
    """The three shares over ``audits``."""
    judged = [a for a in audits if a.verdict is not None]
    return Estimate(
        audits=len(audits),
        failed=len(audits) - len(judged),
        precision=weighted_share((a.weight, bool(a.verdict)) for a in judged if a.accepted),
        acceptance=weighted_share((a.weight, a.accepted) for a in audits),
        rejected_but_correct=weighted_share(
            (a.weight, bool(a.verdict)) for a in judged if not a.accepted
        ),
    )


@dataclass(frozen=True, kw_only=True)
class Estimates:
    overall: Estimate
    by_kind: dict[str, Estimate] = field(default_factory=dict)
    by_model: dict[str, Estimate] = field(default_factory=dict)


def _grouped(
    audits: Sequence[AuditRecord], key: Callable[[AuditRecord], str]
) -> dict[str, Estimate]:
    groups: dict[str, list[AuditRecord]] = defaultdict(list)
    for audit in audits:
        groups[key(audit)].append(audit)
    return {name: estimate(group) for name, group in sorted(groups.items())}


def estimates(audits: Sequence[AuditRecord]) -> Estimates:
    """The shares overall, per task kind and per requested model (keys sorted)."""
    return Estimates(
        overall=estimate(audits),
        by_kind=_grouped(audits, lambda a: a.task_kind or "other"),
        by_model=_grouped(audits, lambda a: a.requested_model),
    )
