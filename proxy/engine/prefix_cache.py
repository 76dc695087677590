"""Saved KV states of recent token sequences, restored instead of prefilling a shared prefix again.

The KV cache of the live context already serves the next request when it continues the last one
(a chat growing turn by turn). This cache covers the rest: requests that share a long system
prompt or a pipeline's template but arrive between other work. Before the live sequence is cut
back by a request that diverges from it, its state (``llama_state_seq_get_data``, the K and V
rows of sequence 0) is copied into RAM; a later request whose prompt shares a longer prefix with a
saved state than with the live one restores it and trims it to the shared part.

Each state remembers how its cells were evaluated (``prefill_plan.tiled_until`` of its prompt),
and serves another prompt only as far as a cold prefill of that prompt would have evaluated them
the same way (``prefill_plan.py``): a restored prefix never changes an answer.

Memory is bounded by ``max_bytes`` (``[local] prefix_cache_mb``): the least recently used
states go first.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from proxy.engine.prefill_plan import reusable


def common_prefix(a: npt.NDArray[np.intc], b: npt.NDArray[np.intc]) -> int:
    """Length of the longest common prefix of two token arrays."""
    m = min(len(a), len(b))
    diff = np.flatnonzero(a[:m] != b[:m])
    return int(diff[0]) if diff.size else m


@dataclass(eq=False)  # entries are told apart by identity, not by their arrays
class _Entry:
    tokens: npt.NDArray[np.intc]
    state: Any  # ctypes uint8 array
    size: int
    tiled: int  # prefill_plan.tiled_until of the prompt these cells were evaluated for


class PrefixCache:
    """LRU store of sequence states of one ``Llama``; not thread-safe, like the model."""

    def __init__(self, llm: Any, *, max_bytes: int, min_tokens: int = 64) -> None:
        import llama_cpp

        self._lib = llama_cpp
        self.llm = llm
        self.max_bytes = max_bytes
        self.min_tokens = min_tokens
        self._entries: list[_Entry] = []  # least recently used first
        self.hits = 0
        self.saves = 0
        self.evictions = 0

    @property
    def bytes(self) -> int:
        return sum(e.size for e in self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def stats(self) -> dict[str, Any]:
        return {
            "entries": len(self._entries),
            "bytes": self.bytes,
            "max_bytes": self.max_bytes,
            "hits": self.hits,
            "saves": self.saves,
            "evictions": self.evictions,
        }

    def best(self, tokens: npt.NDArray[np.intc], tiled: int) -> tuple[_Entry | None, int]:
        """The saved state with the longest prefix usable by a prompt (``tokens``, whose
        ``prefill_plan.tiled_until`` is ``tiled``), and that length."""
        found: _Entry | None = None
        longest = 0
        for entry in self._entries:
            n = reusable(common_prefix(entry.tokens, tokens), entry.tiled, tiled)
            if n > longest:
                found, longest = entry, n
        return found, longest

    def save(self, tiled: int) -> bool:
        """Copy the live sequence's state in (its cells evaluated for a prompt whose
        ``tiled_until`` is ``tiled``); False if it is too short, too big or known."""
        llm = self.llm
        n = int(llm.n_tokens)
        if n < self.min_tokens:
            return False
        tokens = np.array(llm.input_ids[:n], dtype=np.intc)
        for entry in self._entries:
            same = entry.tiled == tiled or min(entry.tiled, tiled) >= n
            if same and len(entry.tokens) >= n and common_prefix(entry.tokens, tokens) == n:
                self._touch(entry)  # already held, in full or as part of a longer state
                return False
        ctx = llm._ctx.ctx
        size = int(self._lib.llama_state_seq_get_size(ctx, 0))
        if size <= 0 or size > self.max_bytes:
            return False
        # Drop the states this one supersedes, then make room.
        self._entries = [
            e
            for e in self._entries
            if not (
                len(e.tokens) < n
                and common_prefix(e.tokens, tokens) == len(e.tokens)
                and reusable(len(e.tokens), tiled, e.tiled) == len(e.tokens)
            )
        ]
        while self._entries and self.bytes + size > self.max_bytes:
            self._entries.pop(0)
            self.evictions += 1
        state = (ctypes.c_uint8 * size)()
        written = int(self._lib.llama_state_seq_get_data(ctx, state, size, 0))
        if written <= 0:
            return False
        self._entries.append(_Entry(tokens=tokens, state=state, size=written, tiled=tiled))
        self.saves += 1
        return True

    def restore(self, entry: _Entry) -> bool:
        """Make ``entry`` the live sequence. On failure the live context is left empty."""
        llm = self.llm
        llm._ctx.kv_cache_clear()
        llm.n_tokens = 0
        read = int(self._lib.llama_state_seq_set_data(llm._ctx.ctx, entry.state, entry.size, 0))
        if read <= 0:
            self._entries.remove(entry)
            llm._ctx.kv_cache_clear()
            return False
        n = len(entry.tokens)
        llm.input_ids[:n] = entry.tokens
        llm.n_tokens = n
        llm._requires_eval = True
        self.hits += 1
        self._touch(entry)
        return True

    def _touch(self, entry: _Entry) -> None:
        self._entries.remove(entry)
        self._entries.append(entry)
