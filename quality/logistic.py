"""Fitting the combiner's logistic models: penalised Newton (IRLS) in numpy, and ROC AUC.

Shared by the dev-set calibration (``python -m quality.dev.fit_weights``, which fits from zero)
and by ``frugal calibrate`` (``proxy.audit.refit``, which refits on a user's audits and
pulls the coefficients toward the shipped ones: a prior). Both keep the rule that a feature
describing a fault may only lower the score (:func:`fit_constrained`).

The penalty is ``lam / 2 * |w - prior|^2`` over the coefficients (and the intercept, when a
prior intercept is given), next to the log loss summed over the examples; with standardised
features, ``lam`` reads as "this many examples' worth of belief in the prior".
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from quality.combiner import ANSWER_FEATURES

Array = npt.NDArray[np.float64]

FAULTS = frozenset(ANSWER_FEATURES) - {"len_log"}
"""Features whose weight must not be positive: every answer feature describes a fault, but the
length."""


def fit_logistic(
    x: Array,
    y: Array,
    lam: float,
    iters: int = 50,
    *,
    prior: Array | None = None,
    prior_intercept: float | None = None,
    weights: Array | None = None,
) -> tuple[Array, float]:
    """L2-penalised logistic regression by Newton's method.

    Without a prior the coefficients are pulled toward 0 and the intercept is free; with
    ``prior`` (and ``prior_intercept``) they are pulled toward those values, and the search
    starts there. ``weights`` weigh each example's log loss (default 1 each).
    """
    n, d = x.shape
    xa = np.hstack([np.ones((n, 1)), x])
    centre = np.zeros(d + 1)
    penalty = np.full(d + 1, lam)
    penalty[0] = 0.0
    if prior is not None:
        centre[1:] = prior
    if prior_intercept is not None:
        centre[0] = prior_intercept
        penalty[0] = lam
    sw = np.ones(n) if weights is None else weights
    w = centre.copy()
    for _ in range(iters):
        z = xa @ w
        p = 1.0 / (1.0 + np.exp(-z))
        grad = xa.T @ (sw * (p - y)) + penalty * (w - centre)
        hess = (xa * (sw * p * (1 - p))[:, None]).T @ xa + np.diag(penalty) + 1e-9 * np.eye(d + 1)
        step = np.linalg.solve(hess, grad)
        w -= step
        if float(np.abs(step).max()) < 1e-8:
            break
    return w[1:], float(w[0])


def fit_constrained(
    x: Array,
    y: Array,
    lam: float,
    features: Sequence[str],
    *,
    prior: Array | None = None,
    prior_intercept: float | None = None,
    weights: Array | None = None,
) -> tuple[Array, float]:
    """:func:`fit_logistic` with fault weights held at or below zero (active set: a fault
    whose weight comes out positive is pinned to 0 and the rest refitted)."""
    active = np.ones(len(features), dtype=bool)
    while True:
        coef_active, b = fit_logistic(
            x[:, active],
            y,
            lam,
            prior=None if prior is None else np.minimum(prior, _cap(features))[active],
            prior_intercept=prior_intercept,
            weights=weights,
        )
        coef = np.zeros(len(features))
        coef[active] = coef_active
        bad = [i for i, f in enumerate(features) if f in FAULTS and coef[i] > 0]
        if not bad:
            return coef, b
        active[bad] = False


def _cap(features: Sequence[str]) -> Array:
    """The highest value each coefficient may take: 0 for a fault, unbounded otherwise."""
    return np.array([0.0 if f in FAULTS else np.inf for f in features])


def log_loss(x: Array, y: Array, coef: Array, intercept: float) -> float:
    z = x @ coef + intercept
    p = np.clip(1.0 / (1.0 + np.exp(-z)), 1e-6, 1 - 1e-6)
    return float(-(y * np.log(p) + (1 - y) * np.log(1 - p)).mean())


def folds(kinds: Sequence[str], k: int) -> list[int]:
    """Fold of each example, stratified by kind (round-robin within each kind)."""
    seen: dict[str, int] = {}
    fold = []
    for kind in kinds:
        fold.append(seen.get(kind, 0) % k)
        seen[kind] = seen.get(kind, 0) + 1
    return fold


def standardise(x: Array) -> tuple[Array, Array]:
    mean = x.mean(axis=0)
    scale = x.std(axis=0)
    scale[scale < 1e-6] = 1.0
    return mean, scale


def roc_auc(scores: Sequence[float], labels: Sequence[bool]) -> float:
    """Probability that a random right answer outscores a random wrong one (ties count half);
    NaN without both kinds."""
    s = np.asarray(scores, dtype=float)
    yb = np.asarray(labels, dtype=bool)
    pos, neg = s[yb], s[~yb]
    if len(pos) == 0 or len(neg) == 0:
        return float("nan")
    greater = (pos[:, None] > neg[None, :]).sum()
    ties = (pos[:, None] == neg[None, :]).sum()
    return float((greater + 0.5 * ties) / (len(pos) * len(neg)))
