"""``frugal calibrate``: refit the gate's combiner on the audits of the configured model.

The audits (``proxy.ledger.audits.audit_record``) hold the gate's features of each audited local
answer and its verdict. The refit keeps the shipped weights' features and standardisation, and fits
the coefficients and intercept of the models that score local answers (``full_no_relevance``, and
``full`` when the audits carry the relevance feature; otherwise ``full`` gets the same refit
without it) by penalised logistic regression pulled toward the shipped values:

    loss = Σ w_i · logloss_i  +  PRIOR_STRENGTH / 2 · |θ − θ_shipped|²

with the audits' sampling weights ``w_i`` scaled to average 1. One audit is worth p(1 − p) of
the prior per standardised coefficient (the Fisher information of a logistic example): at most
0.25, about 0.13 on average over the dev set's answers. So with ``PRIOR_STRENGTH = 30`` thirty
audits move the weights an eighth to a fifth of the way to what they say alone, three hundred
a half to two thirds, a thousand most of it (less along directions that few audits vary, such
as rare faults). On 288 content-graded audits of the bundled model, 30 ranks unseen answers
better than 10, 60 or 100 (``bench/audit_loop.py --prior-strength``, ``quality/README.md``).
Fault features stay at or below zero, as in the shipped fit.

Audits without a verdict are left out. Every other audit counts, whatever its score: an audit
does not record whether a hard gate capped its answer, and a score at or below ``HARD_CAP``
does not tell, since the shipped weights alone score two dev-set answers in five that low.
Leaving those out, as this refit once did, hid from it exactly the answers the shipped weights
under-rate (on content-graded traffic, the right answers in the wrong form), so it could not
learn to lift them. The few capped answers it keeps cost little: the gate caps them again
whatever the weights. The threshold, though, reads such an answer at its stored score
(:func:`_in_force`): a refit cannot lift what a hard gate capped.

It reports the AUC before (the shipped weights on these audits) and after (5-fold
cross-validated: each fold scored by a refit that never saw it), the threshold the target
precision needs on the cross-validated scores (``proxy.ledger.audits.threshold``), and writes a copy
of the weights with the refitted models, tagged with the model file's SHA-256
(``quality.combiner.MODEL_TAG``), plus the pre-router (``proxy.routing.prerouter``) fitted on
the same audits. :class:`AutoCalibrator` does the same in the background every
:data:`AUTO_EVERY` new audits when ``[quality] auto_calibrate`` is on.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sqlite3
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from proxy.errors import UserError
from proxy.ledger.audits.audit_record import COLUMNS, AuditRecord
from proxy.ledger.audits.threshold import ThresholdChoice, choose_threshold
from proxy.ledger.db.location import Database
from proxy.routing import prerouter
from quality.combiner import HARD_CAP, MODEL_TAG, WEIGHTS_PATH, Model, file_sha256
from quality.logistic import fit_constrained, folds, roc_auc

PRIOR_STRENGTH = 30.0
FOLDS = 5
MIN_AUDITS = 20
"""Fewest usable audits (with both verdicts, at least 5 each) a refit is made from."""
AUTO_EVERY = 100
"""``auto_calibrate``: refit after this many new audits of the model."""
AUTO_POLL_S = 60.0
REFIT = ("full_no_relevance", "full")
DEFAULT_TARGET = 0.9


class CalibrationError(UserError):
    """Why no refit could be made (too few audits, no ledger): a plain sentence."""

    label = "frugal calibrate"


@dataclass(frozen=True, kw_only=True)
class ModelFit:
    name: str
    n: int
    right: int
    auc_before: float
    auc_after: float
    model: Model
    cv_scores: list[float] = field(default_factory=list)


@dataclass(frozen=True, kw_only=True)
class Calibration:
    weights: dict[str, Any]
    fits: dict[str, ModelFit]
    threshold: ThresholdChoice
    target: float
    audits: int

    def report(self) -> list[str]:
        lines = [f"audits of this model: {self.audits}"]
        for fit in self.fits.values():
            lines.append(
                f"{fit.name}: {fit.n} audits ({fit.right} right); AUC shipped "
                f"{fit.auc_before:.3f} -> calibrated {fit.auc_after:.3f} (5-fold cross-validated)"
            )
        lines.append(f"threshold for target precision {self.target:g}: {self.threshold.why}")
        pre = self.weights.get("prerouter")
        if pre:
            state = "ready" if prerouter.PreRouterModel.from_dict(pre).ready else "not ready"
            lines.append(
                f"pre-router: fitted on {pre['audits']} audits ({pre['accepted']} accepted), "
                f"{state} (acts from {prerouter.MIN_AUDITS} audits)"
            )
        return lines


def model_ids(model_path: str) -> tuple[str, set[str]]:
    """The model file's SHA-256, and every name an audit's ``local_model`` may give it."""
    sha = file_sha256(model_path)
    name = Path(model_path).name
    return sha, {sha, name, Path(model_path).stem, model_path}


def read_audits(db: Database, names: set[str]) -> list[AuditRecord]:
    """The audits whose ``local_model`` is one of ``names``, oldest first."""
    marks = ", ".join("?" for _ in names)
    sql = f"SELECT {', '.join(COLUMNS)} FROM audits WHERE local_model IN ({marks}) ORDER BY ts, id"
    if db.is_postgres:
        import psycopg

        with psycopg.connect(**db.connect_kwargs()) as pg:
            rows = list(pg.execute(sql.replace("?", "%s"), list(names)))
    else:
        if not os.path.isfile(db.path):
            raise CalibrationError(f"no ledger at {db.path}")
        conn = sqlite3.connect(f"file:{db.path}?mode=ro", uri=True)
        try:
            rows = list(conn.execute(sql, list(names)))
        except sqlite3.OperationalError as exc:
            raise CalibrationError(f"{db.path}: no audits table ({exc})") from exc
        finally:
            conn.close()
    out = []
    for values in rows:
        raw = dict(zip(COLUMNS, values, strict=True))
        raw["accepted"] = bool(raw["accepted"])
        raw["verdict"] = None if raw["verdict"] is None else bool(raw["verdict"])
        feats = raw["features"]
        raw["features"] = json.loads(feats) if isinstance(feats, str) and feats else {}
        for name in ("requested_model", "task_kind", "local_model"):
            raw[name] = raw[name] or ""
        out.append(AuditRecord(**raw))
    return out


def _usable(audits: Sequence[AuditRecord], features: Sequence[str]) -> list[AuditRecord]:
    return [a for a in audits if a.verdict is not None and all(f in a.features for f in features)]


def _in_force(cv_score: float, audit: AuditRecord) -> float:
    """The score the threshold reads for an audit: its cross-validated score, but an answer
    scored at or below the hard cap keeps its score. It may have been capped by a hard gate,
    which the refitted weights do not lift, and the audit does not say."""
    if audit.score is not None and audit.score <= HARD_CAP:
        return min(cv_score, audit.score)
    return cv_score


def _refit_one(name: str, shipped: Model, audits: Sequence[AuditRecord], lam: float) -> ModelFit:
    feats = shipped.features
    x = np.array([[a.features[f] for f in feats] for a in audits], dtype=float)
    x = (x - np.array(shipped.mean)) / np.array(shipped.scale)
    y = np.array([1.0 if a.verdict else 0.0 for a in audits])
    w = np.array([a.weight for a in audits], dtype=float)
    w = w / w.mean()
    prior, b0 = np.array(shipped.coef), shipped.intercept

    def refit(mask: Any) -> tuple[Any, float]:
        return fit_constrained(
            x[mask], y[mask], lam, feats, prior=prior, prior_intercept=b0, weights=w[mask]
        )

    k = max(2, min(FOLDS, int(y.sum()), int(len(y) - y.sum())))
    fold = np.array(folds([a.task_kind for a in audits], k))
    cv = np.zeros(len(y))
    for f in range(k):
        coef, b = refit(fold != f)
        cv[fold == f] = x[fold == f] @ coef + b
    coef, b = refit(np.ones(len(y), dtype=bool))
    model = Model(
        features=feats,
        mean=shipped.mean,
        scale=shipped.scale,
        coef=tuple(float(c) for c in coef),
        intercept=b,
    )
    labels = (y > 0.5).tolist()
    return ModelFit(
        name=name,
        n=len(y),
        right=int(y.sum()),
        auc_before=roc_auc((x @ prior + b0).tolist(), labels),
        auc_after=roc_auc(cv.tolist(), labels),
        model=model,
        cv_scores=(1.0 / (1.0 + np.exp(-cv))).tolist(),
    )


def calibrate(
    audits: Sequence[AuditRecord],
    *,
    base: Mapping[str, Any],
    model_sha256: str,
    model_file: str,
    target: float | None = None,
    configured_threshold: float = 0.6,
    prior_strength: float = PRIOR_STRENGTH,
) -> Calibration:
    """Refit ``base`` (a weights file's contents) on ``audits``; raises CalibrationError."""
    models = base["models"]
    fits: dict[str, ModelFit] = {}
    for name in REFIT:
        if name not in models:
            continue
        shipped = Model.from_dict(models[name])
        usable = _usable(audits, shipped.features)
        right = sum(1 for a in usable if a.verdict)
        if len(usable) < MIN_AUDITS or min(right, len(usable) - right) < 5:
            continue
        fits[name] = _refit_one(name, shipped, usable, prior_strength)
    if not fits:
        judged = sum(1 for a in audits if a.verdict is not None)
        raise CalibrationError(
            f"{len(audits)} audits of this model ({judged} with a verdict): a refit needs at "
            f"least {MIN_AUDITS} usable ones, with at least 5 right and 5 wrong"
        )
    weights = json.loads(json.dumps(base))
    for name, fit in fits.items():
        weights["models"][name] = fit.model.to_dict()
    serving = fits.get("full") or fits["full_no_relevance"]
    if "full" not in fits and "full" in weights["models"]:
        weights["models"]["full"] = serving.model.to_dict()  # the audits carry no relevance
    chosen_target = target or DEFAULT_TARGET
    usable = _usable(audits, serving.model.features)
    pairs = [
        (_in_force(s, a), a.verdict, a.weight)
        for s, a in zip(serving.cv_scores, usable, strict=True)
    ]
    choice = choose_threshold(
        pairs, target_precision=chosen_target, configured=configured_threshold
    )
    pre = prerouter.fit([a.features for a in audits], [a.accepted for a in audits])
    weights[MODEL_TAG] = model_sha256
    weights["model_file"] = model_file
    weights["note"] = "fitted by frugal calibrate on this model's audits; do not edit by hand"
    weights["calibrated_on"] = {
        "audits": len(audits),
        "prior_strength": prior_strength,
        "models": {
            n: {
                "audits": f.n,
                "right": f.right,
                "auc_shipped": round(f.auc_before, 4),
                "auc_calibrated": round(f.auc_after, 4),
            }
            for n, f in fits.items()
        },
        "target_precision": chosen_target,
        "threshold": choice.threshold,
        "threshold_why": choice.why,
    }
    if pre is not None:
        weights["prerouter"] = pre.to_dict()
    return Calibration(
        weights=weights, fits=fits, threshold=choice, target=chosen_target, audits=len(audits)
    )


def base_weights(path: str | Path = WEIGHTS_PATH) -> dict[str, Any]:
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


def write_weights(path: str | Path, weights: Mapping[str, Any]) -> None:
    """Write atomically (a temporary file, then a rename): the engine never reads half."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(json.dumps(weights, indent=2) + "\n")
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def run_once(
    db: Database,
    model_path: str,
    *,
    target: float | None,
    configured_threshold: float,
) -> Calibration:
    """Read the audits of ``model_path`` and refit (the shipped weights as the prior)."""
    sha, names = model_ids(model_path)
    return calibrate(
        read_audits(db, names),
        base=base_weights(),
        model_sha256=sha,
        model_file=Path(model_path).name,
        target=target,
        configured_threshold=configured_threshold,
    )


class AutoCalibrator:
    """``[quality] auto_calibrate``: refit ``weights_path`` every :data:`AUTO_EVERY` new audits
    of the model (looked at every :data:`AUTO_POLL_S` seconds, the refit in a thread)."""

    def __init__(
        self,
        db: Database,
        model_path: str,
        out: str,
        *,
        target: float | None,
        configured_threshold: float,
        every: int = AUTO_EVERY,
        poll_s: float = AUTO_POLL_S,
    ) -> None:
        self.db, self.model_path, self.out = db, model_path, out
        self.target, self.configured = target, configured_threshold
        self.every, self.poll_s = every, poll_s
        self.fitted_on = 0
        self.last_error: str | None = None
        self._ids: tuple[str, set[str]] | None = None  # the model file is hashed once
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def step(self) -> bool:
        """Refit if enough new audits came; True when a file was written."""
        if self._ids is None:
            self._ids = await asyncio.to_thread(model_ids, self.model_path)
        sha, names = self._ids
        audits = await asyncio.to_thread(read_audits, self.db, names)
        if len(audits) - self.fitted_on < self.every:
            return False
        try:
            result = await asyncio.to_thread(
                calibrate,
                audits,
                base=base_weights(),
                model_sha256=sha,
                model_file=Path(self.model_path).name,
                target=self.target,
                configured_threshold=self.configured,
            )
        except CalibrationError as exc:
            self.last_error = str(exc)
            self.fitted_on = len(audits)
            return False
        await asyncio.to_thread(write_weights, self.out, result.weights)
        self.fitted_on = len(audits)
        self.last_error = None
        return True

    async def _loop(self) -> None:
        while True:
            try:
                await self.step()
            except (CalibrationError, OSError, sqlite3.Error) as exc:
                self.last_error = f"{type(exc).__name__}: {exc}"
            await asyncio.sleep(self.poll_s)
