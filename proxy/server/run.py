"""The server on its port: uvicorn running the app until SIGTERM or Ctrl-C (``frugal serve``).

:func:`serve` builds the app (:func:`proxy.server.app.create_app`), runs it under uvicorn with
the ``[server]`` settings (the guarded HTTP/1.1 protocol of :mod:`proxy.server.limits`, the
drain time, the keep-alive), and returns after a clean stop; when the app's start-up raised, it
returns that exception, which the CLI prints on one line. This module is why ``proxy.cli``
imports no server library of its own.
"""

from __future__ import annotations

import signal
from types import FrameType
from typing import Any

import uvicorn

from proxy.config import Settings
from proxy.server.app import create_app
from proxy.server.limits import guarded_protocol


def serve(settings: Settings) -> BaseException | None:
    """Serves until SIGTERM (exit status 0) or Ctrl-C. Returns None after a clean stop, or the
    exception the app's start-up raised (uvicorn then exits with status 3)."""
    server = settings.server
    app = _StartupWatch(create_app(settings))
    config = uvicorn.Config(
        app,
        host=server.host,
        port=server.port,
        log_level="warning",
        log_config=None,  # its records go to the root handler: JSON lines (proxy/logs.py)
        access_log=False,
        timeout_graceful_shutdown=max(1, round(server.drain_s)),
        timeout_keep_alive=server.keep_alive_s,
        http=guarded_protocol(server.header_timeout_s),
    )
    try:
        _GracefulServer(config).run()
    except SystemExit:
        if app.failure is not None:
            return app.failure
        raise
    return None


class _StartupWatch:
    """The app, as uvicorn runs it, keeping the exception its lifespan's start-up raised
    (``failure``). Starlette reports it to uvicorn as traceback text, which the log cuts."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.failure: BaseException | None = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "lifespan":
            return await self.app(scope, receive, send)  # type: ignore[no-any-return]
        started = False

        async def watched_send(message: Any) -> None:
            nonlocal started
            started = started or message.get("type") == "lifespan.startup.complete"
            await send(message)

        try:
            await self.app(scope, receive, watched_send)
        except Exception as exc:
            if not started:
                self.failure = exc
            raise


class _GracefulServer:
    """uvicorn's server, ending with exit status 0 after a SIGTERM.

    On SIGTERM uvicorn stops accepting connections, waits up to ``drain_s`` for requests in
    flight, runs the lifespan shutdown (which flushes the ledger), and then raises the signal
    again, so that the process would end "killed by SIGTERM". A clean stop is what happened, so
    the re-raise is dropped for SIGTERM; SIGINT keeps uvicorn's behaviour.
    """

    def __new__(cls, config: Any) -> Any:
        import uvicorn

        class Server(uvicorn.Server):
            def handle_exit(self, sig: int, frame: FrameType | None) -> None:
                super().handle_exit(sig, frame)
                if sig == signal.SIGTERM and sig in self._captured_signals:
                    self._captured_signals.remove(sig)

            async def startup(self, sockets: Any = None) -> None:
                await super().startup(sockets)
                _freeze_heap()

        return Server(config)


def _freeze_heap() -> None:
    """Put what start-up made out of the cyclic garbage collector's reach.

    After start-up the process holds about 400,000 objects that live as long as it does
    (litellm, llama.cpp's bindings, the app). Every full collection walked all of them, about
    200 ms of CPU with the event loop standing still, and under load one came every few seconds:
    that was the p99 of the API path (bench/README.md, "API pass-through overhead"). Collect
    once, then freeze (``gc.freeze``): later collections only look at newer objects.
    """
    import gc

    gc.collect()
    gc.freeze()
