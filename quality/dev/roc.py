"""Gate metrics: ROC AUC, and what a threshold does (acceptance, precision, recall)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from quality.logistic import roc_auc

__all__ = ["AtThreshold", "at_threshold", "roc_auc", "threshold_for_precision"]


@dataclass(frozen=True)
class AtThreshold:
    threshold: float
    n: int
    accepted: int
    acceptance: float
    precision: float
    recall: float


def at_threshold(scores: Sequence[float], labels: Sequence[bool], threshold: float) -> AtThreshold:
    s = np.asarray(scores, dtype=float)
    y = np.asarray(labels, dtype=bool)
    accept = s >= threshold
    n_acc = int(accept.sum())
    n_pos = int(y.sum())
    tp = int((accept & y).sum())
    return AtThreshold(
        threshold=threshold,
        n=len(s),
        accepted=n_acc,
        acceptance=n_acc / len(s) if len(s) else float("nan"),
        precision=tp / n_acc if n_acc else float("nan"),
        recall=tp / n_pos if n_pos else float("nan"),
    )


def threshold_for_precision(
    scores: Sequence[float], labels: Sequence[bool], target: float
) -> AtThreshold | None:
    """The lowest threshold whose accepted answers reach ``target`` precision (None if none)."""
    for t in sorted(set(float(x) for x in scores)):
        result = at_threshold(scores, labels, t)
        if result.accepted and result.precision >= target:
            return result
    return None
