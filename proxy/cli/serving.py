"""``frugal serve``: the proxy on a port, until SIGTERM or Ctrl-C.

frugal serve [--config PATH] [--host H] [--port P] [--insecure-public]
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import signal
from types import FrameType
from typing import Any

from proxy import config as config_mod
from proxy.errors import ConfigError
from proxy.models.cache import resolve as resolve_model


def add_parsers(sub: Any) -> None:
    serve = sub.add_parser("serve", help="run the proxy")
    serve.add_argument("--config", help="TOML config (default: $FRUGAL_CONFIG, ./frugal.toml)")
    serve.add_argument("--host", help="address to bind (default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port to bind (default 8080)")
    serve.add_argument(
        "--insecure-public",
        action="store_true",
        help="listen on a public address even with no client keys (see [server] "
        "allow_public_without_keys)",
    )
    serve.set_defaults(run=_serve)


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from proxy import logs
    from proxy.engine.generate import bundled_model_path
    from proxy.http.app import create_app
    from proxy.http.auth import check_bind
    from proxy.http.limits import guarded_protocol
    from proxy.ledger.db.location import from_settings
    from proxy.ledger.db.migrate import open_database

    settings = resolve_model(config_mod.load(args.config))  # [local] model: the cache, no network
    server = settings.server
    if args.host or args.port:
        server = dataclasses.replace(
            server, host=args.host or server.host, port=args.port or server.port
        )
        settings = dataclasses.replace(settings, server=server)
    logs.configure(server.log_format, logging.DEBUG if server.log_content else logging.INFO)
    # A corrupt or locked ledger, or a PostgreSQL server that cannot be reached, is a clear
    # error now (exit 2), not a failed start-up later.
    open_database(from_settings(settings.ledger), busy_timeout_s=settings.ledger.busy_timeout_s)
    check_bind(settings, insecure_public=args.insecure_public)
    model_path = settings.local.model_path or bundled_model_path()
    if not os.path.isfile(model_path):
        raise ConfigError(f"[local] model_path = {model_path!r}: no such file")
    _check_weights(settings, model_path)
    app = create_app(settings)
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
    _GracefulServer(config).run()
    return 0


def _check_weights(settings: config_mod.Settings, model_path: str) -> None:
    """[quality] weights_path: a file for another model, or a corrupt one, is a clear error
    now (exit 2); the engine worker loads it again, and follows its later changes."""
    from quality.combiner import Combiner, WeightsError

    path = settings.quality.weights_path
    if not path or (settings.quality.auto_calibrate and not os.path.exists(path)):
        return
    try:
        Combiner.load_for_model(path, model_path)
    except WeightsError as exc:
        raise ConfigError(f"[quality] weights_path: {exc}") from exc


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
