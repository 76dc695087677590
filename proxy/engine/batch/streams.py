"""The batch's KV streams: what each sequence id's stream holds, and how a prompt reuses it.

:class:`~proxy.engine.batch.decode.BatchEngine` gives every sequence id a KV stream of its own. A
sequence that leaves keeps its cells there (its prompt and its answer, up to the last token
decoded) until another sequence takes the id, so that a later prompt starting the same way (a
shared system prompt, the next turn of a chat) does not prefill that part again. A joining
prompt gets, in this order of preference (:meth:`Streams.place`):

    held     the free id whose stream holds the longest usable prefix: kept in place when
             the prompt keeps at least half of what it holds, or when no other id is free
             (as in a full batch, where each joining prompt takes the id just left). Keeping
             cells in place costs nothing, so any shared prefix is kept, however short: a
             batch of short lines shares the chat template's opening and little else (about
             25 tokens of SmolLM2's, with a system prompt of its own; under the 32 a copy
             needs), which is nearly half of a one-sentence line's prompt
    copied   a running sequence's cells, when they go further (by ``COPY_MIN_TOKENS``), or a
             held stream's that the prompt would cut back by more than half:
             ``llama_memory_seq_cp`` into the least recently used free id (an empty one
             first), which llama.cpp does as one copy of the whole stream before the next step
    follow   a running sequence still prefilling the same prefix (requests that arrive
             together): the prompt waits until that prefix is in, then copies it, instead of
             prefilling it a second time alongside

A paused deferred sequence whose id an interactive one needs is *parked* (:meth:`Streams.park`):
its cells are copied out of the context (``llama_state_seq_get_data``, about 23 KB a token for
SmolLM2-135M, well under a millisecond for a few hundred tokens) and its id freed, its cells
still held there as a leaving sequence's are, so that the interactive prompt that takes the id
keeps what it shares with them (at least the chat template's opening) as it would on an idle
engine; :meth:`Streams.unpark` writes them back into whichever id is free later (emptied first),
and the sequence goes on as if it had never left (its sampling state stayed with it).

Usable means evaluated as a cold prefill of this prompt would have evaluated it, and the rest is
prefilled in steps cut to keep it so (``prefill_plan.py``): a reused prefix never changes an
answer. llama-server also reuses a slot's cache (``--cache-reuse``, slot selection by prompt
similarity), but neither copies between slots nor cuts the rest to match a cold prefill.
"""

from __future__ import annotations

import ctypes
from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from proxy.engine.batch.sequence import BatchStats, Sequence
from proxy.engine.prefill_plan import DEFERRED_ROWS, cut_tail, plan, reusable
from proxy.engine.prefix_cache import common_prefix

__all__ = ["COPY_MIN_TOKENS", "Streams"]

COPY_MIN_TOKENS = 32  # a copy moves a whole KV stream: worth it from about this many tokens


@dataclass(frozen=True)
class _Held:
    """The tokens whose cells a free id's stream still holds, and how they were evaluated
    (``prefill_plan.tiled_until`` of the prompt they came with)."""

    tokens: npt.NDArray[np.intc]
    tiled: int


def _cells(seq: Sequence) -> npt.NDArray[np.intc]:
    return np.asarray(seq.held(), dtype=np.intc)


class Streams:
    """The sequence ids of one batch context, free and taken, and the cells they hold."""

    def __init__(self, lib: Any, mem: Any, n_seq: int, chunk: int, stats: BatchStats) -> None:
        self._lib = lib
        self._mem = mem
        self.n_seq = n_seq
        self.chunk = chunk
        self.stats = stats
        self.free: deque[int] = deque(range(n_seq))  # least recently used first
        self.held: dict[int, _Held] = {}

    def place(self, seq: Sequence, active: list[Sequence]) -> None:
        """Give a joining sequence a free id (``seq.seq_id``) and its start: the prefix it keeps
        (``seq.cached``, in place or copied), or the running ``seq.leader`` to wait for.

        A held stream is taken over in place only when the prompt keeps at least half of it
        (or no other id is free): otherwise the prompt goes to the least recently used free id
        (an empty one first), and copies what it shares with the held stream, so that a long
        held prefix is not cut back for a short match.
        """
        wanted = np.asarray(seq.prompt, dtype=np.intc)
        held_id, kept = None, 0
        for seq_id in self.free:
            held = self.held.get(seq_id)
            if held is not None:
                n = reusable(common_prefix(held.tokens, wanted), held.tiled, seq.tiled)
                if n > kept:
                    held_id, kept = seq_id, n
        if kept == 0:
            held_id = None
        others = [i for i in self.free if i != held_id]
        victim = next((i for i in others if i not in self.held), others[0] if others else None)
        source, copied = None, 0
        if held_id is not None and victim is not None and 2 * kept < len(self.held[held_id].tokens):
            source, copied = held_id, kept  # copy it (if long enough) rather than cut it back
            held_id, kept = None, 0
        leader, target = None, 0
        for other in active:
            n = reusable(common_prefix(_cells(other), wanted), other.tiled, seq.tiled)
            if n > copied:
                source, copied = other.seq_id, n
            if other.prefilling and (seq.deferred or not other.deferred):
                # (an interactive prompt never waits for a deferred one: that one may pause)
                ahead = np.asarray(other.prompt[: len(other.prompt) - 1], dtype=np.intc)
                n = reusable(common_prefix(ahead, wanted), other.tiled, seq.tiled)
                if n > target:
                    leader, target = other, n
        chosen = held_id if held_id is not None else victim
        assert chosen is not None  # a free id exists: the batch checked fits()
        if leader is not None and target >= max(kept, copied) + COPY_MIN_TOKENS:
            seq.leader, seq.lead_target = leader, target
            self.stats.followed += 1
        elif source is not None and copied >= kept + COPY_MIN_TOKENS:
            chosen = victim if victim is not None else chosen
            self._copy(source, chosen)
            kept = copied
        self.free.remove(chosen)
        self.held.pop(chosen, None)
        seq.seq_id, seq.cached = chosen, kept
        if seq.leader is None:
            self.start(seq, kept)

    def start(self, seq: Sequence, kept: int) -> None:
        """Keep ``kept`` held tokens (or fewer: see ``prefill_plan.plan``) and plan the rest."""
        start, steps = plan(kept, len(seq.prompt), self.chunk)
        if seq.deferred:  # an interactive request never waits for long (prefill_plan.py)
            steps = cut_tail(steps, start, len(seq.prompt), self.chunk, DEFERRED_ROWS)
        self._lib.llama_memory_seq_rm(self._mem, seq.seq_id, start, -1)
        seq.prefilled = seq.cached = start
        seq.plan = steps
        if start:
            self.stats.reused += 1
            self.stats.reused_tokens += start

    def waiting(self, seq: Sequence, active: list[Sequence]) -> bool:
        """Whether a following sequence must still wait for its leader. Once the leader's
        prefix is in (or the leader has left), copy what its stream holds of the prompt and go
        on; if that is no longer worth a copy, prefill from what the sequence's own id holds."""
        leader = seq.leader
        if leader is None:
            return False
        if leader in active and leader.prefilled < seq.lead_target:
            return True
        seq.leader = None
        wanted = np.asarray(seq.prompt, dtype=np.intc)
        held = self.held.get(leader.seq_id)
        if leader in active:
            cells, tiled = _cells(leader), leader.tiled
        elif held is not None:
            cells, tiled = held.tokens, held.tiled
        else:  # its id was taken again meanwhile
            cells, tiled = wanted[:0], 0
        n = reusable(common_prefix(cells, wanted), tiled, seq.tiled)
        kept = seq.cached
        if n >= kept + COPY_MIN_TOKENS:
            self._copy(leader.seq_id, seq.seq_id)
            kept = n
        self.start(seq, kept)
        return False

    def _copy(self, source: int, target: int) -> None:
        self._lib.llama_memory_seq_cp(self._mem, source, target, -1, -1)
        self.stats.copies += 1

    def release(self, seq: Sequence) -> None:
        """A sequence left: its id is free again and its stream keeps the cells of its tokens
        (up to the last one decoded)."""
        cells = _cells(seq)
        self._lib.llama_memory_seq_rm(self._mem, seq.seq_id, len(cells), -1)
        self.held[seq.seq_id] = _Held(cells, seq.tiled)
        self.free.append(seq.seq_id)

    def park(self, seq: Sequence, ctx: Any) -> None:
        """Copy a sequence's cells out of context ``ctx`` into ``seq.parked`` and free its id,
        the first to take, its cells held there (see the module docstring)."""
        lib = self._lib
        size = int(lib.llama_state_seq_get_size(ctx, seq.seq_id))
        buf = (ctypes.c_uint8 * size)()
        if int(lib.llama_state_seq_get_data(ctx, buf, size, seq.seq_id)) != size:
            raise RuntimeError(f"cannot copy out the cells of sequence {seq.seq_id}")
        cells = _cells(seq)
        lib.llama_memory_seq_rm(self._mem, seq.seq_id, len(cells), -1)
        self.held[seq.seq_id] = _Held(cells, seq.tiled)
        self.free.appendleft(seq.seq_id)
        seq.parked, seq.seq_id = buf, -1
        self.stats.parked += 1

    def unpark(self, seq: Sequence, ctx: Any) -> None:
        """Write a parked sequence's cells into a free id, preferring an empty one (the
        caller checked that one is free)."""
        seq_id = next((i for i in self.free if i not in self.held), self.free[0])
        self.free.remove(seq_id)
        self.held.pop(seq_id, None)
        buf = seq.parked
        self._lib.llama_memory_seq_rm(self._mem, seq_id, -1, -1)
        if int(self._lib.llama_state_seq_set_data(ctx, buf, len(buf), seq_id)) != len(buf):
            self.free.appendleft(seq_id)
            raise RuntimeError(f"cannot write back the cells of a sequence into {seq_id}")
        seq.parked, seq.seq_id = None, seq_id
        self.stats.resumed += 1

    def clear(self) -> None:
        """Empty the streams of the free ids (after a failed decode, whose leftovers are
        unknown, or for a cold start)."""
        for seq_id in self.free:
            self._lib.llama_memory_seq_rm(self._mem, seq_id, -1, -1)
            self.held.pop(seq_id, None)
