"""Two classes of engine work: interactive answers first, deferred work in the room they leave.

An interactive job (a chat request with a client waiting, the default) has a deadline of
seconds. A *deferred* job (a batch line, a background response, a flex request) has only the
deadline its caller gives it, often hours away: the CPU's strength is exactly such work, as long
as it never makes an interactive answer wait (issue 41). So the engine's ``[local] parallel``
places are handed out by class, each class waiting in turn by share as before
(:class:`~proxy.engine.fair_queue.FairQueue`):

    interactive   takes a place whenever fewer than ``parallel`` interactive jobs run, however
                  many deferred ones hold places: the worker then pauses the deferred sequences
                  (their KV kept, moved out of the batch's streams when the stream is needed) and
                  resumes them once no interactive job runs (``batch/decode.py``)
    deferred      takes a place only while no interactive job waits and fewer than ``parallel``
                  jobs of both classes run; a waiting deferred job never goes before a waiting
                  interactive one

That holds for the deferred jobs the worker can pause: plain chat on the batched path
(``parallel`` > 1). One it cannot pause (``parallel = 1``, or tools, ``n`` > 1 and legacy
completions, which run alone on the single path) is acquired with ``pausable=False`` and holds
its place like an interactive job until it ends: an interactive job then waits for it, in the
queue rather than in the worker's pipe (where its deadline would kill the worker).

So an interactive job never waits for a pausable deferred one to end, and deferred work fills
every place an interactive job does not use; once interactive traffic stops, the deferred jobs
waiting take the free places in turn (they never starve but by interactive work itself). Each
class has its own queue bound (``[local] max_queue`` and ``[local] max_deferred_queue``), counted by
:class:`~proxy.engine.local_engine.LocalEngine`: deferred jobs never fill the interactive one.
"""

from __future__ import annotations

import asyncio

from proxy.engine.fair_queue import FairQueue

__all__ = ["DEFERRED", "INTERACTIVE", "PRIORITIES", "PrioritySlots"]

INTERACTIVE = "interactive"
DEFERRED = "deferred"
PRIORITIES = (INTERACTIVE, DEFERRED)


class PrioritySlots:
    """``n`` places to run, handed to interactive jobs first; see the module docstring."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.running = {INTERACTIVE: 0, DEFERRED: 0}
        self.solid = 0  # of the deferred ones running, those the worker cannot pause
        self._queues: dict[str, FairQueue[asyncio.Future[None]]] = {
            INTERACTIVE: FairQueue(),
            DEFERRED: FairQueue(),
        }

    def waiting(self, priority: str = INTERACTIVE) -> int:
        """Jobs of ``priority`` waiting for a place."""
        return len(self._queues[priority])

    @property
    def shares(self) -> int:
        return self._queues[INTERACTIVE].shares

    def ahead(self, share: str) -> dict[str, int]:
        """The waiting interactive jobs, by share, that an interactive job of ``share`` asking
        now would follow (deferred ones never go before it)."""
        return self._queues[INTERACTIVE].ahead(share)

    def _room(self, priority: str) -> bool:
        if priority == INTERACTIVE:
            return self.running[INTERACTIVE] + self.solid < self.n
        if self._queues[INTERACTIVE]:
            return False
        return self.running[INTERACTIVE] + self.running[DEFERRED] < self.n

    async def acquire(
        self, share: str, timeout: float, priority: str = INTERACTIVE, *, pausable: bool = True
    ) -> bool:
        """Wait for a place of ``priority``, in ``share``'s turn within that class, at most
        ``timeout`` seconds: True once it holds one (to :meth:`release` with the same
        priority and ``pausable``), False when the time ran out first. ``pausable=False``: a
        deferred job the worker cannot pause (see the module docstring)."""
        queue = self._queues[priority]
        if not queue and self._room(priority):
            self.running[priority] += 1
            queue.take_turn(share)
            if priority == DEFERRED and not pausable:
                self.solid += 1
            return True
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        queue.push(share, future)
        try:
            await asyncio.wait({future}, timeout=timeout)
        except asyncio.CancelledError:
            self._leave(share, future, priority)
            raise
        if not future.done():
            self._leave(share, future, priority)
            return False
        if priority == DEFERRED and not pausable:
            self.solid += 1
        return True

    def _leave(self, share: str, future: asyncio.Future[None], priority: str) -> None:
        """Give up a place in the queue, or hand on the place it was just given."""
        if self._queues[priority].remove(share, future):
            future.cancel()
            self._hand_on()  # a deferred job may have waited behind this interactive one
        elif future.done() and not future.cancelled():
            self.release(priority)

    def release(self, priority: str = INTERACTIVE, *, pausable: bool = True) -> None:
        """A place of ``priority`` is free: to the next waiting, interactive first."""
        self.running[priority] -= 1
        if priority == DEFERRED and not pausable:
            self.solid -= 1
        self._hand_on()

    def _hand_on(self) -> None:
        for priority in PRIORITIES:
            queue = self._queues[priority]
            while queue and self._room(priority):
                self.running[priority] += 1
                queue.pop().set_result(None)
