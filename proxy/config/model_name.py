"""A Hugging Face GGUF model named ``REPO[:QUANT]``, as ``[local] model`` and ``frugal models``
take it (``bartowski/Qwen2.5-7B-Instruct-GGUF:Q4_K_M``).

    ModelName.parse(text)   the repository and the quantization (Q4_K_M when none is given),
                            or ValueError saying what is wrong with the text

The repository is ``OWNER/NAME`` as the hub spells it: letters, digits, ``-``, ``_`` and ``.``,
starting with a letter or digit, 96 characters at most each, with no ``..`` or ``--`` (the hub
refuses both, and ``--`` is the cache's separator). So a name can never leave the cache folder
or reach a shell. The quantization is letters, digits and ``_`` (``Q4_K_M``, ``IQ4_XS``,
``BF16``), and is matched without regard to case.

Imports nothing of ``proxy``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

DEFAULT_QUANT = "Q4_K_M"
_PART = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}")
_QUANT = re.compile(r"[A-Za-z0-9_]{1,32}")


@dataclass(frozen=True)
class ModelName:
    repo: str
    quant: str = DEFAULT_QUANT

    @classmethod
    def parse(cls, text: str) -> ModelName:
        repo, colon, quant = text.strip().partition(":")
        if colon and not quant:
            raise ValueError(f"{text!r}: nothing after ':' (expected REPO:QUANT, e.g. :Q4_K_M)")
        parts = repo.split("/")
        if len(parts) != 2 or not all(_PART.fullmatch(p) for p in parts):
            raise ValueError(
                f"{text!r}: expected a Hugging Face repository OWNER/NAME (letters, digits, "
                "'-', '_', '.'), then optionally :QUANT, e.g. "
                f"bartowski/Qwen2.5-7B-Instruct-GGUF:{DEFAULT_QUANT}"
            )
        if ".." in repo or "--" in repo or any(p.endswith(".") for p in parts):
            raise ValueError(f"{text!r}: a repository name has no '..', '--' or final '.'")
        if quant and not _QUANT.fullmatch(quant):
            raise ValueError(
                f"{text!r}: the quantization {quant!r} is not a name like Q4_K_M, IQ4_XS or BF16"
            )
        return cls(repo, quant.upper() if quant else DEFAULT_QUANT)

    def __str__(self) -> str:
        return f"{self.repo}:{self.quant}"
