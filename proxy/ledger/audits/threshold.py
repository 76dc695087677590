"""A target precision instead of a threshold: ``[quality] target_precision``.

From audited local answers ``(score, verdict, weight)``, accepted and rejected alike, pick the
lowest threshold ``t`` such that the answers scoring ``>= t`` were correct often enough: the
lower end of the 95% Wilson interval of their weighted precision (see
:mod:`proxy.ledger.audits.estimate`) reaches the target. The lowest such ``t`` accepts the most
traffic, so it saves the most money at the precision asked for.

The candidates are the audited scores themselves: any threshold between two audited scores
accepts the same audits, and the higher end of that gap is the cautious choice. A candidate
needs at least ``min_audits`` audits with a verdict at or above it, so that its interval is
read from enough answers. Until some candidate has them, the configured threshold stays in
force. When enough audits exist and no threshold reaches the target, the answer is plainly
:data:`ACCEPT_NOTHING` (above every score), with the reason, rather than a guess.

Failed audits (no verdict) are left out: they say nothing about correctness.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from proxy.ledger.audits.estimate import Z95, wilson

ACCEPT_NOTHING = 1.01  # above every score in [0, 1]: no local answer is accepted
MIN_AUDITS = 30

Source = Literal["configured", "target", "accept_nothing"]


@dataclass(frozen=True, kw_only=True)
class ThresholdChoice:
    threshold: float
    why: str  # one plain sentence for /healthz and the report
    n: int  # the audits with a verdict the choice rests on
    source: Source
    precision_low: float | None = None  # the lower bound at the chosen threshold


def choose_threshold(
    audits: Iterable[tuple[float, bool | None, float]],
    *,
    target_precision: float | None,
    configured: float,
    min_audits: int = MIN_AUDITS,
    z: float = Z95,
) -> ThresholdChoice:
    """The threshold in force, and why. ``audits`` are ``(score, verdict, weight)``."""
    judged = sorted(
        ((s, v, w) for s, v, w in audits if v is not None), key=lambda a: a[0], reverse=True
    )
    if target_precision is None:
        return ThresholdChoice(
            threshold=configured,
            why=f"the configured threshold {configured:g} (no target precision set)",
            n=len(judged),
            source="configured",
        )
    if len(judged) < min_audits:
        return ThresholdChoice(
            threshold=configured,
            why=(
                f"the configured threshold {configured:g}: {len(judged)} of the {min_audits} "
                f"audits with a verdict needed to aim at precision {target_precision:g}"
            ),
            n=len(judged),
            source="configured",
        )
    # Walk the scores from the top: after each run of equal scores, the prefix is what that
    # score as a threshold would accept.
    best: ThresholdChoice | None = None
    best_low, best_at = -1.0, ACCEPT_NOTHING
    total = hits = squares = 0.0
    count = 0
    for i, (score, verdict, weight) in enumerate(judged):
        count += 1
        total += weight
        squares += weight * weight
        hits += weight if verdict else 0.0
        if i + 1 < len(judged) and judged[i + 1][0] == score:
            continue
        if count < min_audits or total <= 0:
            continue
        low, _ = wilson(hits / total, total * total / squares, z)
        if low > best_low:
            best_low, best_at = low, score
        if low >= target_precision:
            best = ThresholdChoice(
                threshold=score,
                why=(
                    f"target precision {target_precision:g}: at threshold {score:.3g}, "
                    f"{count} audited answers give precision of at least {low:.3f} (95%)"
                ),
                n=count,
                source="target",
                precision_low=low,
            )
    if best is not None:
        return best
    return ThresholdChoice(
        threshold=ACCEPT_NOTHING,
        why=(
            f"no threshold reaches target precision {target_precision:g} on {len(judged)} "
            f"audits (the best, at threshold {best_at:.3g}, reaches only {best_low:.3f} at the "
            "lower end of its 95% interval): accepting no local answer"
        ),
        n=len(judged),
        source="accept_nothing",
        precision_low=best_low,
    )
