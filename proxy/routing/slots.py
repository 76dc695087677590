"""A remote backend's places to run: ``n`` slots and the FIFO of requests waiting for one.

A waiter gives up at its deadline (``EngineTimeout``) or when it is cancelled, handing on a slot
it was just given; :meth:`Slots.fail_all` fails every waiter at once, when the backend goes down.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Callable

from proxy.errors import EngineTimeout
from proxy.routing.base import left

__all__ = ["Slots"]


class Slots:
    """``n`` places to run, and a FIFO of those waiting for one; the waiters can all be failed
    at once (the backend went down)."""

    def __init__(self, n: int) -> None:
        self.free = n
        self._waiters: deque[asyncio.Future[None]] = deque()

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    async def acquire(self, deadline: float, what: str) -> None:
        if self.free > 0 and not self._waiters:
            self.free -= 1
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(future)
        try:
            await asyncio.wait({future}, timeout=left(deadline))
        except asyncio.CancelledError:
            self._leave(future)
            raise
        if not future.done():
            self._leave(future)
            raise EngineTimeout(f"the deadline passed while waiting for {what}")
        future.result()  # BackendDown when the backend went down meanwhile

    def _leave(self, future: asyncio.Future[None]) -> None:
        """Give up a place in the queue, or the slot it was just handed."""
        with contextlib.suppress(ValueError):
            self._waiters.remove(future)
        if not future.done():
            future.cancel()
        elif not future.cancelled() and future.exception() is None:
            self.release()

    def release(self) -> None:
        while self._waiters:
            future = self._waiters.popleft()
            if not future.done():
                future.set_result(None)
                return
        self.free += 1

    def fail_all(self, make: Callable[[], BaseException]) -> None:
        while self._waiters:
            future = self._waiters.popleft()
            if not future.done():
                future.set_exception(make())
