"""Background tasks a service starts with itself and stops with itself."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any


async def stop_task(task: asyncio.Task[Any] | None) -> None:
    """Cancel a service's background ``task`` (None: never started) and wait until it has
    ended; its cancellation is expected, anything else it raised goes on up."""
    if task is None:
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
