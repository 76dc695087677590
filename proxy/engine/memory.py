"""The memory guard: will the engine fit in RAM, and at which context size?

The production account this project started from saw a Q8_0 8B model swap and crawl on a
7.8 GB VPS. Before the worker starts, the engine estimates what it will hold resident and
compares it with what the machine (or its cgroup) can give; it then lowers ``parallel``, then
shrinks ``n_ctx``, or refuses to start, rather than swap.

    weights         the GGUF file size (it is mmap'd, and every page is read for each token)
    KV cache        n_ctx x n_layer x n_head_kv x (head_dim_k + head_dim_v) x 2 bytes (f16)
    compute         llama.cpp's work buffers, roughly 16 MiB + 128 bytes per vocabulary entry +
                    32 bytes per embedding value per batch token (fitted on SmolLM2 and Gemma 3)
    draft model     its weights, KV cache and compute buffers, likewise
    batch           with [local] parallel = N > 1, a second context: N KV streams of n_ctx
                    cells each and its own compute buffers (see ``batch/decode.py``)
    prefix cache    [local] prefix_cache_mb
    runtime         64 MiB for the worker's Python and libraries

The KV estimate is an upper bound for sliding-window models, which may keep less.

Before a model is downloaded (``frugal models pull``) only its file size is known: a
:class:`SizeOnly` stands in for the header, with the shape of a typical grouped-query model of
that size (below), and goes through the same :func:`estimate` and :func:`plan`. The header's own
figures are used again at start, and by ``frugal check``.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any, Protocol

MIB = 1024 * 1024
RUNTIME_BYTES = 64 * MIB
MIN_CTX = 512
N_UBATCH = 512


class ModelShape(Protocol):
    """What the estimate reads of a model: a :class:`GGUFHeader`, or a :class:`SizeOnly`."""

    @property
    def file_size(self) -> int: ...

    @property
    def n_vocab(self) -> int: ...

    @property
    def n_embd(self) -> int: ...

    def kv_bytes_per_token(self, bytes_per_value: int = 2) -> int: ...


# A GGUF's shape from its size alone, for grouped-query models at any quantization: the KV
# bytes per token (f16) and the embedding width both grow as the square root of the file size.
# Fitted by hand on published configs: Llama 3.1 8B (4.9 GB in Q4_K_M, 131,072 bytes per token,
# width 4096: 1.9 and 0.058), Mistral 7B (2.0, 0.062), Qwen2.5 14B (2.1, 0.046), Llama 3.1 70B
# (1.6, 0.040), SmolLM2-135M (2.2, 0.056). Qwen2.5 7B keeps less (0.8); models without grouped
# queries (Llama 2, Phi-3) and Gemma 2 keep up to 4x more, which the check at start catches.
SIZE_KV_FACTOR = 2.0
SIZE_EMBD_FACTOR = 0.06
SIZE_VOCAB = 152_064  # the largest common vocabulary (Qwen2.5); Llama 3's is 128,256


@dataclass(frozen=True)
class SizeOnly:
    """A model known only by the size of its file(s): a typical shape for that size."""

    file_size: int
    n_vocab: int = SIZE_VOCAB

    @property
    def n_embd(self) -> int:
        return int(SIZE_EMBD_FACTOR * math.sqrt(self.file_size))

    def kv_bytes_per_token(self, bytes_per_value: int = 2) -> int:
        return int(SIZE_KV_FACTOR * math.sqrt(self.file_size) * bytes_per_value / 2)


@dataclass(frozen=True, kw_only=True)
class MemoryEstimate:
    n_ctx: int
    weights: int
    kv_cache: int
    compute: int
    draft_weights: int = 0
    draft_kv_cache: int = 0
    draft_compute: int = 0
    prefix_cache: int = 0
    parallel: int = 1
    batch_kv_cache: int = 0
    batch_compute: int = 0
    runtime: int = RUNTIME_BYTES

    @property
    def total(self) -> int:
        return (
            self.weights
            + self.kv_cache
            + self.compute
            + self.draft_weights
            + self.draft_kv_cache
            + self.draft_compute
            + self.prefix_cache
            + self.batch_kv_cache
            + self.batch_compute
            + self.runtime
        )

    def as_dict(self) -> dict[str, Any]:
        parts = {
            "weights": self.weights,
            "kv_cache": self.kv_cache,
            "compute": self.compute,
            "draft_weights": self.draft_weights,
            "draft_kv_cache": self.draft_kv_cache,
            "draft_compute": self.draft_compute,
            "prefix_cache": self.prefix_cache,
            "batch_kv_cache": self.batch_kv_cache,
            "batch_compute": self.batch_compute,
            "runtime": self.runtime,
        }
        out: dict[str, Any] = {
            "n_ctx": self.n_ctx,
            "parallel": self.parallel,
            "total_mib": _mib(self.total),
        }
        out.update({f"{k}_mib": _mib(v) for k, v in parts.items() if v})
        return out


@dataclass(frozen=True, kw_only=True)
class MemoryPlan:
    """The guard's decision: the context to use, or why the engine must not start."""

    requested_ctx: int
    n_ctx: int
    estimate: MemoryEstimate
    requested_parallel: int = 1
    parallel: int = 1
    available: int | None  # bytes, None when unknown
    available_source: str
    fits: bool
    notes: list[str] = field(default_factory=list)

    @property
    def shrunk(self) -> bool:
        return self.n_ctx < self.requested_ctx

    def as_dict(self) -> dict[str, Any]:
        return {
            "requested_n_ctx": self.requested_ctx,
            "n_ctx": self.n_ctx,
            "requested_parallel": self.requested_parallel,
            "parallel": self.parallel,
            "estimate": self.estimate.as_dict(),
            "available_mib": None if self.available is None else _mib(self.available),
            "available_source": self.available_source,
            "fits": self.fits,
            "notes": list(self.notes),
        }


def _mib(n: int) -> float:
    return round(n / MIB, 1)


def compute_bytes(header: ModelShape) -> int:
    return 16 * MIB + header.n_vocab * 128 + header.n_embd * N_UBATCH * 32


def estimate(
    header: ModelShape,
    n_ctx: int,
    *,
    draft: ModelShape | None = None,
    prefix_cache_mb: int = 0,
    parallel: int = 1,
) -> MemoryEstimate:
    batched = parallel > 1
    return MemoryEstimate(
        n_ctx=n_ctx,
        weights=header.file_size,
        kv_cache=n_ctx * header.kv_bytes_per_token(),
        compute=compute_bytes(header),
        draft_weights=draft.file_size if draft else 0,
        draft_kv_cache=n_ctx * draft.kv_bytes_per_token() if draft else 0,
        draft_compute=compute_bytes(draft) if draft else 0,
        prefix_cache=prefix_cache_mb * MIB,
        parallel=parallel,
        batch_kv_cache=parallel * n_ctx * header.kv_bytes_per_token() if batched else 0,
        batch_compute=compute_bytes(header) if batched else 0,
    )


def available_memory(
    meminfo: str = "/proc/meminfo", cgroup: str = "/sys/fs/cgroup"
) -> tuple[int | None, str]:
    """Bytes this process can still use, and where the figure came from.

    The smaller of MemAvailable and the cgroup v2 limit (memory.max - memory.current) when a
    limit is set; None when neither can be read.
    """
    best: int | None = None
    source = "unknown"
    try:
        with open(meminfo, encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    best = int(line.split()[1]) * 1024
                    source = "MemAvailable"
                    break
    except (OSError, ValueError):
        pass
    try:
        with open(os.path.join(cgroup, "memory.max"), encoding="ascii") as f:
            limit_text = f.read().strip()
        if limit_text != "max":
            limit = int(limit_text)
            used = 0
            try:
                with open(os.path.join(cgroup, "memory.current"), encoding="ascii") as f:
                    used = int(f.read().strip())
            except (OSError, ValueError):
                pass
            room = max(0, limit - used)
            if best is None or room < best:
                best, source = room, "cgroup memory.max"
    except (OSError, ValueError):
        pass
    return best, source


def plan(
    header: ModelShape,
    n_ctx: int,
    *,
    mode: str = "shrink",
    draft: ModelShape | None = None,
    prefix_cache_mb: int = 0,
    available: tuple[int | None, str] | None = None,
    parallel: int = 1,
) -> MemoryPlan:
    """Choose the sequences in parallel and the context size that fit: ``mode`` is "shrink",
    "refuse" or "off". Shrinking lowers ``parallel`` first (down to 1), then ``n_ctx``."""
    room, source = available if available is not None else available_memory()

    def sized(ctx: int, par: int) -> MemoryEstimate:
        return estimate(header, ctx, draft=draft, prefix_cache_mb=prefix_cache_mb, parallel=par)

    wanted = sized(n_ctx, parallel)
    if mode == "off" or room is None:
        note = "memory guard off" if mode == "off" else "available memory unknown: not checked"
        return MemoryPlan(
            requested_ctx=n_ctx,
            n_ctx=n_ctx,
            estimate=wanted,
            requested_parallel=parallel,
            parallel=parallel,
            available=room,
            available_source=source,
            fits=True,
            notes=[note],
        )
    notes: list[str] = []
    chosen = n_ctx
    par = parallel
    current = wanted
    if mode == "shrink":
        while current.total > room and par > 1:
            par -= 1
            current = sized(chosen, par)
        if par < parallel:
            notes.append(
                f"parallel lowered from {parallel} to {par}: {_mib(wanted.total)} MiB were "
                f"needed and {_mib(room)} MiB are available ({source})"
            )
        while current.total > room and chosen > MIN_CTX:
            chosen = max(MIN_CTX, chosen // 2)
            current = sized(chosen, par)
        if chosen < n_ctx:
            notes.append(
                f"n_ctx stepped down from {n_ctx} to {chosen}: {_mib(wanted.total)} MiB were "
                f"needed and {_mib(room)} MiB are available ({source})"
            )
    fits = current.total <= room
    if not fits:
        notes.append(
            f"the model needs about {_mib(current.total)} MiB at n_ctx={chosen} and only "
            f"{_mib(room)} MiB are available ({source})"
        )
    return MemoryPlan(
        requested_ctx=n_ctx,
        n_ctx=chosen,
        estimate=current,
        requested_parallel=parallel,
        parallel=par,
        available=room,
        available_source=source,
        fits=fits,
        notes=notes,
    )


def summary(p: MemoryPlan) -> str:
    """One line: the estimate at the plan's context, its parts, and the memory available."""
    est = p.estimate
    parts = ", ".join(
        f"{k.removesuffix('_mib')} {v:.0f}"
        for k, v in est.as_dict().items()
        if k.endswith("_mib") and k != "total_mib"
    )
    room = "unknown" if p.available is None else f"{p.available / MIB:.0f} MiB"
    return (
        f"about {est.total / MIB:.0f} MiB at n_ctx={p.n_ctx}, parallel {p.parallel} "
        f"({parts} MiB); available {room} ({p.available_source})"
    )


def advice(p: MemoryPlan, *, has_draft: bool, prefix_cache_mb: int) -> str:
    """How to make a plan that does not fit, fit."""
    tips = ["use a smaller or more quantized model (Q4_K_M: `frugal quantize`)"]
    if p.parallel > 1:
        tips.append("lower [local] parallel")
    if p.n_ctx > MIN_CTX:
        tips.append("lower [local] n_ctx")
    if prefix_cache_mb:
        tips.append("lower [local] prefix_cache_mb")
    if has_draft:
        tips.append('set [local] speculative = "prompt-lookup" (no draft model)')
    tips.append("free memory on this machine")
    return "; ".join(tips)
