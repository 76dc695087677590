"""Stop the work of a client that has gone away before its answer was ready.

Starlette cancels a streaming response when its client disconnects, but not a plain handler: a
client that gives up on a non-streaming request (or on a stream still being prepared, as in
``verify`` mode) would leave its request waiting in the engine's queue, or generating, for
nobody. This ASGI middleware watches for ``http.disconnect`` once the request body has been
read, and cancels the handler if the client leaves before the response has started. The engine
client turns that cancellation into "out of the queue" or "stop generating" (see
``proxy/engine/local_engine.py``), and the request's ledger row says ``client_gone``.

After the body, the only message an HTTP/1.1 server still sends is ``http.disconnect``; the
middleware takes it and hands it on to the application too, when the application asks. Once a
response has started, that is how the rest is stopped: a streaming response
(:class:`proxy.server.sse.EventStream`) listens for it, stops its body, closes what the body held
(an upstream stream, a live generation), and writes the row, even when no byte of it went out.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

DISCONNECT: Message = {"type": "http.disconnect"}


class CancelOnDisconnect:
    def __init__(self, app: ASGIApp, *, paths: Iterable[str]) -> None:
        self.app = app
        self.paths = frozenset(paths)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path") not in self.paths:
            await self.app(scope, receive, send)
            return
        loop = asyncio.get_running_loop()
        body_read = asyncio.Event()
        gone: asyncio.Future[None] = loop.create_future()
        started = False

        def mark_gone() -> None:
            if not gone.done():
                gone.set_result(None)

        async def app_receive() -> Message:
            if gone.done():
                return DISCONNECT
            if body_read.is_set():
                await asyncio.shield(gone)  # the watcher owns the server's receive now
                return DISCONNECT
            message = await receive()
            if message["type"] == "http.disconnect":
                mark_gone()
            elif message["type"] == "http.request" and not message.get("more_body", False):
                body_read.set()
            return message

        async def app_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        work = asyncio.ensure_future(self.app(scope, app_receive, app_send))

        async def watch() -> None:
            await body_read.wait()
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    break
            mark_gone()
            if not started and not work.done():
                work.cancel()

        watcher = asyncio.ensure_future(watch())
        try:
            await asyncio.shield(work)
        except asyncio.CancelledError:
            if not work.done():  # we ourselves were cancelled (server shutting down)
                work.cancel()
                with contextlib.suppress(BaseException):
                    await work
                raise
            if not gone.done():
                raise
            # The client left and its handler was cancelled: nothing is left to send.
        finally:
            watcher.cancel()
            with contextlib.suppress(BaseException):
                await watcher
