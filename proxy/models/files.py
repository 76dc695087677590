"""Which files of a repository hold a quantization.

A GGUF repository holds one file per quantization (``Qwen2.5-7B-Instruct-Q4_K_M.gguf``), or one
split into parts (``…-Q8_0-00001-of-00003.gguf``, every part needed, llama.cpp opening the first).
The quantization is the last name like ``Q4_K_M``, ``IQ4_XS``, ``Q8_0``, ``BF16`` or ``F16`` in the
file's name, matched without regard to case. Projector files (``mmproj``) are not models.

The same rules pick a file on the hub (``pull``) and in the cache (``cache``), so a pulled
model is found again by the name it was pulled with.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from proxy.logs import shown
from proxy.models import ModelsError

SPLIT = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)
_QUANT = re.compile(
    r"(?<![A-Za-z0-9])(I?Q[1-8](?:_[A-Z0-9]{1,2})*|BF16|F16|F32)(?![A-Za-z0-9])", re.IGNORECASE
)


@dataclass(frozen=True)
class RepoFile:
    name: str  # its path in the repository
    size: int
    sha256: str | None = None  # the hub's LFS SHA-256 of its content, when known


@dataclass(frozen=True)
class Pick:
    """The file(s) of one quantization, split parts in order."""

    quant: str
    files: tuple[RepoFile, ...]

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def first(self) -> RepoFile:
        return self.files[0]


def quant_of(name: str) -> str | None:
    """The quantization a GGUF's name says (upper case), or None for no model file."""
    base = name.rsplit("/", 1)[-1]
    if not base.lower().endswith(".gguf") or "mmproj" in base.lower():
        return None
    stem = SPLIT.sub("", base)
    stem = stem[: -len(".gguf")] if stem.lower().endswith(".gguf") else stem
    found = _QUANT.findall(stem)
    return found[-1].upper() if found else None


def quants(files: Iterable[RepoFile]) -> list[str]:
    """The quantizations present, sorted."""
    return sorted({q for f in files if (q := quant_of(f.name)) is not None})


def pick(repo: str, files: Iterable[RepoFile], quant: str) -> Pick:
    """The file(s) holding ``quant``; ModelsError naming the quantizations there are."""
    files = list(files)
    groups: dict[str, list[RepoFile]] = {}
    for f in files:
        if (quant_of(f.name) or "") != quant.upper():
            continue
        groups.setdefault(SPLIT.sub(".gguf", f.name), []).append(f)
    if not groups:
        there = quants(files)
        listed = ", ".join(there) if there else "none: it holds no GGUF model file"
        raise ModelsError(f"{repo} has no {quant} GGUF; the quantizations there: {listed}")
    key = sorted(groups)[0]  # several files of one quantization: the first name, always
    parts = sorted(groups[key], key=lambda f: f.name)
    split = SPLIT.search(parts[0].name)
    if split is None:
        return Pick(quant.upper(), (parts[0],))
    total = int(split.group(2))
    numbers = [int(m.group(1)) for p in parts if (m := SPLIT.search(p.name))]
    if numbers != list(range(1, total + 1)):
        raise ModelsError(
            f"{repo}: {shown(key)} is split in {total} parts, and only parts "
            f"{', '.join(map(str, numbers))} are there"
        )
    return Pick(quant.upper(), tuple(parts))
