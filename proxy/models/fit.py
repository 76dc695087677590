"""Will a model fit this machine's RAM? Asked before any byte of it is downloaded.

Only the size of its file(s) is known then (the hub's listing), so the memory guard's estimate
(``proxy/engine/memory.py``) runs on a :class:`~proxy.engine.memory.SizeOnly` shape: the
weights, the KV cache at ``[local] n_ctx`` for ``parallel`` sequences, the compute buffers, the
prefix cache, the draft model and the runtime, against the memory available, exactly as the
guard plans at start (``shrink`` lowers ``parallel``, then ``n_ctx``). At start, and in
``frugal check``, the same guard runs again on the header's real figures.
"""

from __future__ import annotations

import os

from proxy.config import LocalSettings
from proxy.engine import memory
from proxy.engine.gguf import GGUFError, GGUFHeader, read_header


def plan(
    size: int, local: LocalSettings, *, available: tuple[int | None, str] | None = None
) -> memory.MemoryPlan:
    """The guard's plan for a model of ``size`` bytes under ``[local]``'s settings."""
    draft: GGUFHeader | None = None
    if local.speculative == "draft" and os.path.isfile(local.draft_model_path):
        try:
            draft = read_header(local.draft_model_path)
        except (GGUFError, OSError):
            draft = None  # frugal check says what is wrong with it
    return memory.plan(
        memory.SizeOnly(size),
        local.n_ctx,
        mode="shrink" if local.memory_guard == "off" else local.memory_guard,
        draft=draft,
        prefix_cache_mb=local.prefix_cache_mb,
        parallel=max(1, local.parallel),
        available=available,
    )


def line(p: memory.MemoryPlan) -> str:
    """``fits: about … MiB at n_ctx=…``, with the headroom left, or ``does not fit: …``, with
    the guard's notes."""
    verdict = "fits" if p.fits else "does not fit"
    notes = "".join(f"; {n}" for n in p.notes)
    if p.fits and p.available is not None:
        spare = (p.available - p.estimate.total) / (1 << 20)
        notes = f"; headroom about {spare:.0f} MiB" + notes
    return f"{verdict}: {memory.summary(p)} (estimated from the file size){notes}"
