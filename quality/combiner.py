"""The combiner: signals in, one :class:`Score` out.

A logistic regression over the signals' features, with weights fitted on graded answers by
``python -m quality.dev.fit_weights`` and read from ``weights.json``. Four models are fitted on the
same answers, with and without the confidence (logprob) features and with and without the
relevance feature, so an answer that lacks either (the API's has no logprobs; a server without
the embedder has no relevance) is judged by the signals that apply, on the same scale.

A user's own weights (``frugal calibrate``, refitted on audits of their traffic) are a copy of
that file tagged with the SHA-256 of the model file they were fitted for;
:meth:`Combiner.load_for_model` refuses a file tagged for another model, or a corrupt one, with
:class:`WeightsError`.

Hard failures (``Signal.hard``) make an answer unusable whatever its other features say: the
value is then scaled into ``[0, HARD_CAP]``, below any sensible threshold, keeping the order.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from quality._types import Score, Signal
from quality.task import KINDS

WEIGHTS_PATH = Path(__file__).with_name("weights.json")
HARD_CAP = 0.1
MODEL_TAG = "model_sha256"
"""The key of a calibrated weights file that names the model file it was fitted for."""


class WeightsError(ValueError):
    """A weights file that cannot be used: unreadable, not weights, or for another model."""


def file_sha256(path: str | Path) -> str:
    """The SHA-256 of a file, read in 1 MiB blocks (a model file is gigabytes)."""
    digest = hashlib.sha256()
    with Path(path).open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


CONFIDENCE_FEATURES = (
    "conf_mean",
    "conf_worst_window",
    "conf_low_share",
    "conf_head",
    "conf_head_min",
    "conf_novel_min",
)
ANSWER_FEATURES = (
    "rep_ratio",
    "cut_mid",
    "wrong_language",
    "len_log",
    "refusal",
    "restate_ratio",
    "copy_share",
    "quote_copy",
    "fmt_fail",
    "arith_wrong",
    "arith_mismatch",
    "code_broken",
    "code_mismatch",
    "code_unchanged",
)
TASK_FEATURES = tuple(f"task_{k}" for k in KINDS)
FULL_CONFIDENCE = ("conf_head", "conf_head_min", "conf_worst_window")
"""The confidence features the full model weighs: of the six the signal reports, this subset
has the better cross-validated AUC on the train split (0.797 against 0.789 with all six); the
others add nothing the combiner can use on this model, and are kept for inspection."""
RELEVANCE_FEATURES = ("rel_max",)
FULL_NO_RELEVANCE_FEATURES = FULL_CONFIDENCE + ANSWER_FEATURES + TASK_FEATURES
NO_LOGPROBS_NO_RELEVANCE_FEATURES = ANSWER_FEATURES
FULL_FEATURES = FULL_NO_RELEVANCE_FEATURES + RELEVANCE_FEATURES
NO_LOGPROBS_FEATURES = NO_LOGPROBS_NO_RELEVANCE_FEATURES + RELEVANCE_FEATURES
MODEL_FEATURES: dict[str, tuple[str, ...]] = {
    "full": FULL_FEATURES,
    "no_logprobs": NO_LOGPROBS_FEATURES,
    "full_no_relevance": FULL_NO_RELEVANCE_FEATURES,
    "no_logprobs_no_relevance": NO_LOGPROBS_NO_RELEVANCE_FEATURES,
}
"""The four models ``weights.json`` holds: with or without logprobs, with or without the
relevance signal (which needs the embedding model)."""

FEATURE_DEFAULTS: dict[str, float] = dict.fromkeys(ANSWER_FEATURES + TASK_FEATURES, 0.0)
"""Value of a feature whose signal did not apply (no instruction to check means none broken)."""


@dataclass(frozen=True)
class Model:
    features: tuple[str, ...]
    mean: tuple[float, ...]
    scale: tuple[float, ...]
    coef: tuple[float, ...]
    intercept: float

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Model:
        model = cls(
            features=tuple(data["features"]),
            mean=tuple(float(x) for x in data["mean"]),
            scale=tuple(float(x) for x in data["scale"]),
            coef=tuple(float(x) for x in data["coef"]),
            intercept=float(data["intercept"]),
        )
        n = len(model.features)
        if not (len(model.mean) == len(model.scale) == len(model.coef) == n):
            raise ValueError("weights: features, mean, scale and coef differ in length")
        return model

    def to_dict(self) -> dict[str, Any]:
        return {
            "features": list(self.features),
            "mean": list(self.mean),
            "scale": list(self.scale),
            "coef": list(self.coef),
            "intercept": self.intercept,
        }

    def contributions(self, x: Mapping[str, float]) -> dict[str, float]:
        return {
            name: c * (x[name] - m) / s
            for name, m, s, c in zip(self.features, self.mean, self.scale, self.coef, strict=True)
        }

    def probability(self, x: Mapping[str, float]) -> float:
        z = self.intercept + sum(self.contributions(x).values())
        if z >= 0:
            return 1.0 / (1.0 + math.exp(-z))
        e = math.exp(z)
        return e / (1.0 + e)


@dataclass(frozen=True)
class Combiner:
    full: Model
    no_logprobs: Model
    hard_cap: float = HARD_CAP
    full_no_relevance: Model | None = None
    no_logprobs_no_relevance: Model | None = None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Combiner:
        models = data["models"]

        def optional(name: str) -> Model | None:
            return Model.from_dict(models[name]) if name in models else None

        return cls(
            full=Model.from_dict(models["full"]),
            no_logprobs=Model.from_dict(models["no_logprobs"]),
            hard_cap=float(data.get("hard_cap", HARD_CAP)),
            full_no_relevance=optional("full_no_relevance"),
            no_logprobs_no_relevance=optional("no_logprobs_no_relevance"),
        )

    @classmethod
    def load(cls, path: str | Path = WEIGHTS_PATH) -> Combiner:
        return cls.from_dict(json.loads(Path(path).read_text(encoding="utf-8")))

    @classmethod
    def load_for_model(
        cls, path: str | Path, model_path: str | Path, *, model_sha256: str | None = None
    ) -> Combiner:
        """A calibrated weights file, after checking its tag against the model file's SHA-256
        (``model_sha256`` when the caller has it already). Raises :class:`WeightsError`."""
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except OSError as exc:
            raise WeightsError(f"{path}: cannot be read ({exc.strerror or exc})") from exc
        except (ValueError, UnicodeDecodeError) as exc:
            raise WeightsError(f"{path}: not a weights file (not JSON: {exc})") from exc
        try:
            combiner = cls.from_dict(data)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise WeightsError(f"{path}: not a weights file ({type(exc).__name__}: {exc})") from exc
        tag = data.get(MODEL_TAG)
        if not isinstance(tag, str) or not tag:
            raise WeightsError(
                f"{path}: has no {MODEL_TAG} tag, so it cannot be checked against the model; "
                "make one with `frugal calibrate`"
            )
        actual = model_sha256 or file_sha256(model_path)
        if tag.lower() != actual.lower():
            fitted_for = data.get("model_file") or "another model file"
            raise WeightsError(
                f"{path} was calibrated for {fitted_for} (SHA-256 {tag[:12]}…), not for "
                f"{Path(model_path).name} (SHA-256 {actual[:12]}…): run `frugal calibrate` "
                "for this model, or unset [quality] weights_path"
            )
        return combiner

    def features(self, signals: Sequence[Signal]) -> dict[str, float]:
        x = dict(FEATURE_DEFAULTS)
        for signal in signals:
            if signal.applied:
                x.update(signal.features)
        return x

    def model_for(self, signals: Sequence[Signal]) -> Model:
        applied = {s.name for s in signals if s.applied}
        has_confidence = "confidence" in applied
        if "relevance" not in applied:
            fallback = self.full_no_relevance if has_confidence else self.no_logprobs_no_relevance
            if fallback is not None:
                return fallback
        return self.full if has_confidence else self.no_logprobs

    def combine(self, signals: Sequence[Signal]) -> Score:
        x = self.features(signals)
        model = self.model_for(signals)
        value = model.probability(x)
        contributions = model.contributions(x)
        hard: list[str] = []
        soft: list[tuple[float, str]] = []
        for signal in signals:
            hard.extend(r for r in signal.hard if r not in hard)
            for reason, feature in signal.soft.items():
                soft.append((contributions.get(feature, 0.0), reason))
        if hard:
            value *= self.hard_cap
        soft.sort(key=lambda cr: cr[0])
        reasons = hard + [r for _, r in soft if r not in hard]
        value = min(1.0, max(0.0, value))
        return Score(value=value, reasons=reasons, signals=[s.name for s in signals if s.applied])


@lru_cache(maxsize=1)
def default_combiner() -> Combiner:
    """The combiner fitted by ``python -m quality.dev.fit_weights`` (read once, never mutated)."""
    return Combiner.load()
