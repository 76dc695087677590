"""Fit the combiner's weights on graded local answers: ``python -m quality.dev.fit_weights``.

Reads the dev set (train split only: the held-out split is never seen here) and the cached local
answers, grades them with the checkers, turns each answer into the signals' features (with the
relevance signal's embedding model) and fits four L2-regularised logistic regressions with
Newton's method (IRLS) in numpy: ``full`` (with the confidence and task features) and
``no_logprobs`` (without), each also without ``rel_max`` for a server that has no embedder.
The L2 strength is picked by stratified k-fold cross-validation on the train split. Features
that describe a fault (a refusal, a broken instruction, a loop, a wrong sum…) may only lower the
score: a fault whose fitted weight comes out positive on this small sample is pinned to 0 and
the rest refitted.
Answers that a hard gate already rejects are left out of the fit: the gate decides those, and
they would only teach the weights about garbage.

Operating point: the fitted probability is then shifted down by an offset (subtracted from the
intercept) chosen on the cross-validated train scores: the smallest from which the default
threshold 0.6 accepts answers with at least ``TARGET_PRECISION`` precision at every stricter
offset too. A wrong local answer
reaching a client costs more than a needless API call, so the score is a cautious estimate of
the answer being right rather than a neutral one; the offsets are written in weights.json.
Writes ``quality/weights.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from quality import signals
from quality.combiner import (
    CONFIDENCE_FEATURES,
    HARD_CAP,
    MODEL_FEATURES,
    WEIGHTS_PATH,
    Combiner,
    Model,
)
from quality.dev.devset import DEV_PATH, load
from quality.dev.local_answers import ANSWERS_PATH, Graded, grade, load_answers, request_for
from quality.logistic import FAULTS as FAULTS  # re-exported: moved to quality.logistic (shipped)
from quality.logistic import fit_constrained, folds, log_loss, roc_auc, standardise
from quality.logistic import fit_logistic as fit_logistic
from quality.relevance import Embedder, RelevanceUnavailable

Array = npt.NDArray[np.float64]
LAMBDAS = (0.03, 0.1, 0.3, 1.0, 3.0, 10.0, 30.0)
FOLDS = 5
DEFAULT_THRESHOLD = 0.6
TARGET_PRECISION = 0.9
OFFSETS = tuple(round(0.1 * i, 1) for i in range(41))
MIN_ACCEPTED = 10
"""Fewest cross-validated answers a precision is read from."""


def operating_offset(cv_logits: Array, y: Array) -> float:
    """Logit offset for ``TARGET_PRECISION`` at the default threshold, on cross-validated scores.

    The smallest offset from which every stricter one still reaches the target: precision over
    a few dozen answers wobbles as single answers cross the line, and an offset that only
    reaches the target at one lucky step would not hold on new answers.
    """
    cut = math.log(DEFAULT_THRESHOLD / (1 - DEFAULT_THRESHOLD))
    steps: list[tuple[float, float]] = []
    for offset in OFFSETS:
        accepted = cv_logits - offset >= cut
        if accepted.sum() < MIN_ACCEPTED:
            break
        steps.append((offset, float(y[accepted].mean())))
    chosen = None
    for offset, precision in reversed(steps):
        if precision < TARGET_PRECISION:
            break
        chosen = offset
    if chosen is not None:
        return chosen
    if not steps:
        return OFFSETS[-1]
    return max(steps, key=lambda step: (step[1], step[0]))[0]


@dataclass(frozen=True)
class Fit:
    model: Model
    lam: float
    cv_auc: float
    offset: float


def fit_model(
    features: Sequence[str], rows: Sequence[dict[str, float]], y: Array, kinds: Sequence[str]
) -> Fit:
    """Fit one model: lambda by cross-validated log loss, then the operating offset."""
    x = np.array([[r[f] for f in features] for r in rows], dtype=float)
    fold = np.array(folds(kinds, FOLDS))
    best: tuple[float, float, float, Array] | None = None
    for lam in LAMBDAS:
        losses, cv_scores = [], np.zeros(len(y))
        for f in range(FOLDS):
            tr, te = fold != f, fold == f
            mean, scale = standardise(x[tr])
            coef, b = fit_constrained((x[tr] - mean) / scale, y[tr], lam, features)
            xs = (x[te] - mean) / scale
            losses.append(log_loss(xs, y[te], coef, b) * te.sum())
            cv_scores[te] = xs @ coef + b
        loss = sum(losses) / len(y)
        auc = roc_auc(cv_scores.tolist(), (y > 0.5).tolist())
        if best is None or loss < best[0]:
            best = (loss, lam, auc, cv_scores)
    assert best is not None
    _, lam, auc, cv_logits = best
    offset = operating_offset(cv_logits, y)
    mean, scale = standardise(x)
    coef, b = fit_constrained((x - mean) / scale, y, lam, features)
    model = Model(
        features=tuple(features),
        mean=tuple(float(v) for v in mean),
        scale=tuple(float(v) for v in scale),
        coef=tuple(float(v) for v in coef),
        intercept=b - offset,
    )
    return Fit(model, lam, auc, offset)


def feature_rows(
    graded: Sequence[Graded], embedder: Embedder | None
) -> tuple[list[dict[str, float]], list[bool]]:
    """Combiner features of each answer, and whether a hard gate rejects it."""
    placeholder = Combiner(full=Model((), (), (), (), 0.0), no_logprobs=Model((), (), (), (), 0.0))
    rows, hard = [], []
    for g in graded:
        sigs = signals(request_for(g.prompt), g.completion, embedder=embedder)
        rows.append(placeholder.features(sigs))
        hard.append(any(s.hard for s in sigs))
    return rows, hard


def calibrate(graded: Sequence[Graded], embedder: Embedder) -> tuple[dict[str, Any], list[str]]:
    rows, hard = feature_rows(graded, embedder)
    keep = [i for i, h in enumerate(hard) if not h]
    y = np.array([1.0 if graded[i].correct else 0.0 for i in keep])
    kinds = [graded[i].prompt.kind for i in keep]
    kept_rows = [rows[i] for i in keep]
    full_rows = [r for r in kept_rows if all(f in r for f in CONFIDENCE_FEATURES)]
    if len(full_rows) != len(kept_rows):
        raise ValueError("every local answer should carry logprobs")
    if any("rel_max" not in r for r in kept_rows):
        raise ValueError("every answer should have a relevance score: is the embedder loaded?")
    fits = {name: fit_model(feats, kept_rows, y, kinds) for name, feats in MODEL_FEATURES.items()}
    hard_right = sum(1 for g, h in zip(graded, hard, strict=True) if h and g.correct)
    report = [
        f"train answers: {len(graded)} ({sum(g.correct for g in graded)} right); "
        f"hard-gated: {sum(hard)} (of which right: {hard_right}); fitted on {len(keep)}",
    ]
    for name, fit in fits.items():
        report.append(
            f"{name}: lambda={fit.lam:g}  cross-validated AUC={fit.cv_auc:.3f}  "
            f"operating offset={fit.offset:.1f}"
        )
    for name, fit in fits.items():
        m = fit.model
        report.append(f"{name} standardised coefficients (intercept {m.intercept:+.2f}):")
        for f, c in sorted(zip(m.features, m.coef, strict=True), key=lambda fc: fc[1]):
            report.append(f"  {f:<18} {c:+.3f}")
    weights = {
        "version": 1,
        "note": (
            "fitted by python -m quality.dev.fit_weights on the train split; do not edit by hand"
        ),
        "trained_on": {
            "answers": len(graded),
            "fitted": len(keep),
            "right": int(sum(g.correct for g in graded)),
            "lambda": {name: fit.lam for name, fit in fits.items()},
            "cv_auc": {name: round(fit.cv_auc, 4) for name, fit in fits.items()},
            "operating_offset": {name: fit.offset for name, fit in fits.items()},
            "target_precision_at_default_threshold": TARGET_PRECISION,
        },
        "hard_cap": HARD_CAP,
        "models": {name: fit.model.to_dict() for name, fit in fits.items()},
    }
    return weights, report


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m quality.dev.fit_weights", description=__doc__)
    parser.add_argument("--dev", default=str(DEV_PATH))
    parser.add_argument("--answers", default=str(ANSWERS_PATH))
    parser.add_argument("--out", default=str(WEIGHTS_PATH))
    args = parser.parse_args(argv)
    prompts = [p for p in load(args.dev) if p.split == "train"]
    graded = grade(prompts, load_answers(args.answers))
    try:
        embedder = Embedder.load()
    except RelevanceUnavailable as exc:
        print(f"calibrate: {exc}", file=sys.stderr)
        return 1
    weights, report = calibrate(graded, embedder)
    Path(args.out).write_text(json.dumps(weights, indent=2) + "\n", encoding="utf-8")
    print("\n".join(report))
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
