"""``frugal serve``: the proxy on a port, until SIGTERM or Ctrl-C.

frugal serve [--config PATH] [--host H] [--port P] [--insecure-public]

A start-up that fails (the app's lifespan raised: a model with no chat template, a worker that
would not load) ends with one plain line that says why, ``frugal serve: could not start: …``,
and exit status 3 (uvicorn's own for a failed start-up). uvicorn logs the traceback first, and
the log cuts a library's message at :data:`proxy.logs.MAX_LIBRARY_MESSAGE` characters, often
before the line that holds the reason; so the server keeps the exception itself and hands it
back (:func:`proxy.server.run.serve`).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
from typing import Any

from proxy import config as config_mod
from proxy.errors import ConfigError, UserError
from proxy.logs import shown
from proxy.models.cache import resolve as resolve_model

MAX_REASON = 1000  # characters of a start-up failure's reason, on its one line


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
    from proxy import logs
    from proxy.engine.generate import bundled_model_path
    from proxy.ledger.db.location import from_settings
    from proxy.ledger.db.migrate import open_database
    from proxy.server import run
    from proxy.server.auth import check_bind

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
    failure = run.serve(settings)
    if failure is not None:
        raise _StartupFailed(f"could not start: {reason(failure)}", 3)
    return 0


class _StartupFailed(UserError):
    """The app's start-up raised: the CLI prints its reason on one line."""

    label = "frugal serve"


def reason(exc: BaseException) -> str:
    """Why ``exc`` happened, on one readable line: the message of an error of ours, else the
    exception's type and message; whitespace folded, escapes shown, at most
    :data:`MAX_REASON` characters."""
    text = " ".join(str(exc).split())
    if not isinstance(exc, UserError):
        text = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    text = shown(text or type(exc).__name__)
    return text if len(text) <= MAX_REASON else text[:MAX_REASON] + "…"


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
