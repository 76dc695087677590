"""The ``frugal`` command line.

    frugal serve  [--config PATH] [--host H] [--port P]
    frugal report [--config PATH | --db PATH] [--month YYYY-MM] [--format table|json|csv|markdown]

Errors meant for the user (a bad config, a missing database) print one clean line and exit
non-zero: 2 for a usage or config error, 3 when there is no ledger to read.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import signal
import sys
from collections.abc import Sequence
from types import FrameType
from typing import Any

from proxy import config as config_mod
from proxy.engine.generate import ModelLoadError
from proxy.errors import ConfigError

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="frugal",
        description="Local-first OpenAI-compatible proxy: answer on your CPU when good enough, "
        "fall back to the API when not, and count the savings.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the proxy")
    serve.add_argument("--config", help="TOML config (default: $FRUGAL_CONFIG, ./frugal.toml)")
    serve.add_argument("--host", help="address to bind (default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port to bind (default 8080)")

    report = sub.add_parser("report", help="print the month's savings from the ledger")
    source = report.add_mutually_exclusive_group()
    source.add_argument("--config", help="TOML config whose [ledger] path to read")
    source.add_argument("--db", help="ledger database file to read")
    report.add_argument("--month", help="YYYY-MM (default: this month, UTC)")
    report.add_argument("--format", choices=("table", "json", "csv", "markdown"), default="table")
    return parser


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from proxy import logs
    from proxy.app import create_app
    from proxy.engine.generate import bundled_model_path

    settings = config_mod.load(args.config)
    server = settings.server
    if args.host or args.port:
        server = dataclasses.replace(
            server, host=args.host or server.host, port=args.port or server.port
        )
        settings = dataclasses.replace(settings, server=server)
    logs.configure(server.log_format)
    model_path = settings.local.model_path or bundled_model_path()
    if not os.path.isfile(model_path):
        raise ConfigError(f"[local] model_path = {model_path!r}: no such file")
    app = create_app(settings)
    config = uvicorn.Config(
        app,
        host=server.host,
        port=server.port,
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=max(1, round(server.drain_s)),
        timeout_keep_alive=30,
    )
    _GracefulServer(config).run()
    return 0


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

        return Server(config)


def _report(args: argparse.Namespace) -> int:
    from proxy import report

    if args.db:
        db_path, fixed = args.db, 0.0
        if os.environ.get("FRUGAL_CONFIG") or os.path.isfile("frugal.toml"):
            fixed = config_mod.load(None).costs.monthly_fixed_usd
    else:
        settings = config_mod.load(args.config)
        db_path, fixed = settings.ledger.path, settings.costs.monthly_fixed_usd
    try:
        period = report.Period.month(args.month)
        data = report.build(db_path, period, fixed)
    except report.ReportError as exc:
        print(f"frugal report: {exc}", file=sys.stderr)
        return exc.exit_code
    print(report.render(data, args.format))
    if data["requests"] == 0 and args.format == "table":
        print(f"No requests recorded in {data['month']}.", file=sys.stderr)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "serve":
            return _serve(args)
        return _report(args)
    except ConfigError as exc:
        print(f"frugal: config error: {exc}", file=sys.stderr)
        return 2
    except ModelLoadError as exc:
        print(f"frugal: model error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
