"""Whose job takes the next free place: the waiting jobs served in turn by share, not first come.

One client key keeping many requests on the local model must not make every other key's answer
wait behind all of them: with a first-come queue, 16 long jobs of one key held another key's
short answer for 26.7 s instead of 0.5 s (issue 39). So every job waits under a *share*, a label
for the client key that sent it (keyless traffic is one share), and the shares take turns, as
their requests take the server's slots in turn (``proxy/server/shares.py``).

:class:`FairQueue` is the order, and nothing else: ``push(share, item)``, ``pop()``,
``remove(share, item)``. Each item is given a *turn* when it is pushed: one after its share's
last one, and never before the turn of the item popped last. ``pop`` takes the item of the
earliest turn, the earlier pushed first among equals; a job that finds a free place at once takes
its share's turn too (``take_turn``). So a share with twelve waiting jobs holds
turns t+1 ... t+12, and a share that arrives meanwhile gets turn t and goes next; two shares
with backlogs alternate; one share alone is served first come, first served, as before. An item
that leaves before its turn (its deadline passed, its client went away) gives its turn back to
the later items of its share. The queue keeps an entry for a share only while it has items
waiting or was served in the current turn, so it holds no state for keys that have gone.

:class:`FairSlots` is ``n`` places to run (the engine's ``[local] parallel`` slots) taken in that
order: the place a finished job frees goes to the next job in turn, never to a job of the share
that already had one this turn while another share waits. It refuses nothing: the queue's bound
stays the engine's (``[local] max_queue``). A running job is never pre-empted, so the job of a
share that had nothing waiting starts when a running job ends (the first of ``parallel`` to
end), after at most one job of each other share waiting, however many jobs those shares hold.

:func:`share_label` makes a share of a client key's identity: a short hash that names the key in
this process and says nothing of it (an environment key's identity is its key's digest).
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
from collections import deque
from typing import Generic, TypeVar

__all__ = ["KEYLESS", "FairQueue", "FairSlots", "share_label"]

T = TypeVar("T")

KEYLESS = ""
"""The share of requests that came without a client key: all of them one share."""


def share_label(identity: str | None) -> str:
    """The share of a client key, from its identity (None: :data:`KEYLESS`)."""
    if not identity:
        return KEYLESS
    return hashlib.blake2b(identity.encode(), digest_size=8, person=b"frugal-share").hexdigest()


class FairQueue(Generic[T]):
    """Items waiting by share, popped in turn; see the module docstring."""

    __slots__ = ("_count", "_last", "_order", "_queues", "_turn")

    def __init__(self) -> None:
        self._queues: dict[str, deque[tuple[int, int, T]]] = {}  # share -> (turn, order, item)
        self._last: dict[str, int] = {}  # share -> the turn of its newest item
        self._turn = 0  # the turn of the item popped last
        self._order = itertools.count()
        self._count = 0

    def __len__(self) -> int:
        return self._count

    @property
    def shares(self) -> int:
        """Shares the queue keeps an entry for (waiting, or served this turn)."""
        return len(self._queues.keys() | self._last.keys())

    def push(self, share: str, item: T) -> None:
        turn = self._next_turn(share)
        self._queues.setdefault(share, deque()).append((turn, next(self._order), item))
        self._count += 1

    def ahead(self, share: str) -> dict[str, int]:
        """How many waiting items of each share an item of ``share`` pushed now would follow
        (all of its own share's): what a forecast of its wait counts."""
        turn = max(self._turn, self._last.get(share, self._turn - 1) + 1)
        return {s: sum(1 for t, _, _ in q if t <= turn) for s, q in self._queues.items()}

    def take_turn(self, share: str) -> None:
        """``share`` is served at once, nothing waiting: its turn is taken as by a push and a
        pop (a job that found a free slot counts as its key's turn)."""
        if self._count:
            raise ValueError("take_turn while items wait: push them instead")
        self._advance(self._next_turn(share))

    def _next_turn(self, share: str) -> int:
        turn = max(self._turn, self._last.get(share, self._turn - 1) + 1)
        self._last[share] = turn
        return turn

    def _advance(self, turn: int) -> None:
        if turn > self._turn:
            self._turn = turn
            # A share with nothing waiting whose last turn is past gets a fresh one: forget it.
            for gone in [s for s, t in self._last.items() if t < turn and s not in self._queues]:
                del self._last[gone]

    def pop(self) -> T:
        """The item of the earliest turn (IndexError when none waits)."""
        if not self._count:
            raise IndexError("pop from an empty FairQueue")
        share = min(self._queues, key=lambda s: self._queues[s][0][:2])
        waiting = self._queues[share]
        turn, _, item = waiting.popleft()
        if not waiting:
            del self._queues[share]
        self._count -= 1
        self._advance(turn)
        return item

    def remove(self, share: str, item: T) -> bool:
        """Take ``item`` out before its turn; the later items of its share move up one turn.
        False when it is not waiting (it was popped already)."""
        waiting = self._queues.get(share)
        if waiting is None:
            return False
        index = next((i for i, (_, _, queued) in enumerate(waiting) if queued is item), None)
        if index is None:
            return False
        del waiting[index]
        for later in range(index, len(waiting)):
            turn, order, queued = waiting[later]
            waiting[later] = (turn - 1, order, queued)
        self._last[share] -= 1
        if not waiting:
            del self._queues[share]
        self._count -= 1
        return True


class FairSlots:
    """``n`` places to run, handed to the waiting in turn by share (:class:`FairQueue`)."""

    def __init__(self, n: int) -> None:
        self.free = n
        self._queue: FairQueue[asyncio.Future[None]] = FairQueue()

    @property
    def waiting(self) -> int:
        return len(self._queue)

    @property
    def shares(self) -> int:
        return self._queue.shares

    def ahead(self, share: str) -> dict[str, int]:
        """The waiting jobs, by share, that a job of ``share`` asking now would follow."""
        return self._queue.ahead(share)

    async def acquire(self, share: str, timeout: float) -> bool:
        """Wait for a place, in ``share``'s turn, at most ``timeout`` seconds: True once it
        holds one (to :meth:`release`), False when the time ran out first."""
        if self.free > 0 and not self._queue:
            self.free -= 1
            self._queue.take_turn(share)
            return True
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queue.push(share, future)
        try:
            await asyncio.wait({future}, timeout=timeout)
        except asyncio.CancelledError:
            self._leave(share, future)
            raise
        if not future.done():
            self._leave(share, future)
            return False
        return True

    def _leave(self, share: str, future: asyncio.Future[None]) -> None:
        """Give up a place in the queue, or hand on the place it was just given."""
        if self._queue.remove(share, future):
            future.cancel()
        elif future.done() and not future.cancelled():
            self.release()

    def release(self) -> None:
        """A place is free: to the next waiting in turn, or kept."""
        if self._queue:
            self._queue.pop().set_result(None)
        else:
            self.free += 1
