"""The response that carries a stream of Server-Sent Events, and ends exactly once.

:class:`EventStream` sends the :class:`proxy.serving.call.Events` a service returns (the chunks,
written in :mod:`proxy.serving.events`): it ends exactly once, however it ends (run to its last
event, cut by a client that left, or cancelled before its first byte), and says so to its owner,
who writes the request's ledger row then.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from proxy.serving.call import Cleanup, Events
from proxy.serving.events import DONE

__all__ = ["DONE", "EventStream", "stream_of"]


def stream_of(events: Events) -> EventStream:
    """The response that sends ``events``."""
    return EventStream(
        events.chunks, headers=events.headers, on_end=events.on_end, cleanups=events.cleanups
    )


class EventStream(StreamingResponse):
    """A ``text/event-stream`` response whose end is certain.

    Starlette's own streaming response runs its body generator in a task that a disconnect
    cancels: when the client has gone before the first byte, the generator never starts, and
    nothing in its ``finally`` ever runs. Here the end does not live in the generator:

    - the body is streamed while the response listens for ``http.disconnect``; whichever comes
      first ends the other;
    - then the body generator is closed (so its own ``finally`` runs, if it ever started), and
      each of ``cleanups`` is awaited (closing an upstream connection, stopping a generation:
      they must be idempotent, since the generator may have done the same);
    - last, ``on_end(finished)`` is called once, ``finished`` saying whether the body ran to its
      end, or at least sent ``[DONE]``. It is called even when the response itself is cancelled.
    """

    def __init__(
        self,
        chunks: AsyncGenerator[bytes, None],
        *,
        headers: dict[str, str],
        on_end: Callable[[bool], None],
        cleanups: Sequence[Cleanup] = (),
    ) -> None:
        self.finished = False
        self._chunks = chunks
        self._events = self._relay(chunks)
        self._on_end = on_end
        self._cleanups = tuple(cleanups)
        super().__init__(self._events, media_type="text/event-stream", headers=headers)

    async def _relay(self, chunks: AsyncIterator[bytes]) -> AsyncGenerator[bytes, None]:
        async for chunk in chunks:
            yield chunk
            if chunk.endswith(DONE):
                # Sent: the client has the whole answer. A client that closes at once, while
                # the body's own clean-up still runs, has not left early.
                self.finished = True
        self.finished = True

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        streaming = asyncio.ensure_future(self.stream_response(send))
        try:
            listening = asyncio.ensure_future(self.listen_for_disconnect(receive))
            try:
                await asyncio.wait((streaming, listening), return_when=asyncio.FIRST_COMPLETED)
            finally:
                await _stop(listening, streaming)
        finally:
            try:
                await self._close()
            finally:
                self._on_end(self.finished)
        failure = None if streaming.cancelled() else streaming.exception()
        if failure is not None and not isinstance(failure, OSError):  # OSError: the client left
            raise failure

    async def _close(self) -> None:
        for close in (self._events.aclose, self._chunks.aclose, *self._cleanups):
            with contextlib.suppress(Exception):
                await close()


async def _stop(*tasks: asyncio.Future[None]) -> None:
    """Cancel ``tasks`` and wait until they have ended; their failures are the caller's to read."""
    for task in tasks:
        if not task.done():
            task.cancel()
    await asyncio.wait(tasks)
    for task in tasks:
        if not task.cancelled():
            task.exception()  # marked as retrieved; the caller reads the one that matters
