"""A local generation whose tokens are sent as they come (``[router] stream_mode = "live"``).

    live_tokens(task, queue)   the tokens of a running local attempt, as the engine makes them,
                               until it has ended
    cancel(task)               a local generation stopped (once), and waited for

The cascade starts the generation and waits for its first token (:meth:`proxy.serving.cascade.
Cascade.live`); chat's chunks (:mod:`proxy.serving.chat`) and the Responses' typed events
(:mod:`proxy.serving.responses_live`) are written from these tokens.

Imports the local attempt's type from :mod:`proxy.routing`, and nothing else of ``proxy``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator
from typing import Any

from proxy.routing.router import LocalAttempt


async def live_tokens(
    task: asyncio.Task[LocalAttempt], queue: asyncio.Queue[str]
) -> AsyncGenerator[str, None]:
    """The local tokens of ``task`` as they come, until it has ended."""
    while True:
        if not queue.empty():
            yield queue.get_nowait()
            continue
        if task.done():
            return
        getter = asyncio.ensure_future(queue.get())
        try:
            await asyncio.wait({task, getter}, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            getter.cancel()
            raise
        if getter.done():
            yield getter.result()
        else:
            getter.cancel()


async def cancel(task: asyncio.Task[Any]) -> None:
    """Cancel ``task`` (once) and wait until it has ended: a local generation stopped."""
    if task.done():
        if not task.cancelled():
            task.exception()  # retrieved; whoever needed its result has read it
        return
    task.cancel()
    with contextlib.suppress(BaseException):
        await task
