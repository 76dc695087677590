"""Whether the quality gate was fitted for the model it scores.

The gate's weights ship fitted to SmolLM2-135M's answers (``quality/weights.json``, the prior).
A weights file written by ``frugal calibrate`` or ``auto_calibrate`` is tagged with the SHA-256
of the model file it was fitted for (``quality.combiner.MODEL_TAG``); the gate is calibrated for
a model exactly when ``[quality] weights_path`` holds a file with that model's tag. Until then
``frugal check``, ``frugal models list``, ``/healthz`` and ``frugal report`` say that the gate
uses the shipped prior.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from proxy.config import Settings

PRIOR = "the shipped prior, fitted to SmolLM2"


@dataclass(frozen=True)
class Gate:
    calibrated: bool
    detail: str  # one sentence: "the gate uses the shipped prior, fitted to SmolLM2 (...)"
    bundled: bool = False  # the model is SmolLM2 itself, the prior's own model

    def as_dict(self) -> dict[str, Any]:
        return {
            "weights": "calibrated" if self.calibrated else "shipped_prior",
            "calibrated": self.calibrated,
            "detail": self.detail,
        }


def weights_tag(weights_path: str) -> str | None:
    """The model SHA-256 a weights file was fitted for; None when there is no such file."""
    from quality.combiner import MODEL_TAG

    try:
        with open(weights_path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    tag = data.get(MODEL_TAG) if isinstance(data, dict) else None
    return tag.lower() if isinstance(tag, str) and tag else None


def described(calibrated: bool, weights_path: str, *, bundled: bool = False) -> Gate:
    """The sentence for a gate whose state is known (the engine's ``weights`` at start)."""
    if calibrated:
        return Gate(True, f"the gate is calibrated for this model ({weights_path})")
    why = "the bundled model itself" if bundled else "not calibrated for this model yet"
    if weights_path:
        why += f"; {weights_path} holds no weights fitted for it"
    else:
        why += "; [quality] weights_path is not set"
    return Gate(False, f"the gate uses {PRIOR} ({why})", bundled=bundled)


def state(weights_path: str, model_sha256: Callable[[], str], *, bundled: bool = False) -> Gate:
    """The gate for a model file, read from the weights file's tag. ``model_sha256`` is called
    only when there is a tag to compare (hashing a model file takes seconds)."""
    tag = weights_tag(weights_path) if weights_path else None
    calibrated = tag is not None and tag == model_sha256().lower()
    return described(calibrated, weights_path, bundled=bundled)


def for_settings(settings: Settings, model_sha256: Callable[[str], str] | None = None) -> Gate:
    """The gate for the model ``settings`` serve (``[local] model`` found in the cache, else
    ``model_path``, else the bundled one), for ``frugal report`` (which says it for any model
    but the bundled SmolLM2, whose own prior it is). ``model_sha256(path)``
    hashes the file (a caller that asks often memoizes it); a cached model's is its blob's name.
    """
    from proxy.config.model_name import ModelName
    from proxy.engine.model_files import ModelLoadError, bundled_model_path
    from proxy.models.cache import find
    from quality.combiner import file_sha256

    hash_file = model_sha256 or file_sha256
    local = settings.local
    try:
        bundled = bundled_model_path()
    except ModelLoadError:
        bundled = ""
    if local.model and not local.model_path:
        cached = find(ModelName.parse(local.model))
        if cached is None:
            return Gate(False, f"the gate uses {PRIOR} ([local] model is not in the cache)")
        return state(settings.quality.weights_path, cached.sha256)
    path = local.model_path or bundled
    return state(settings.quality.weights_path, lambda: hash_file(path), bundled=path == bundled)
