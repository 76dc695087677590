"""The ``frugal`` command line.

    frugal serve  [--config PATH] [--host H] [--port P] [--insecure-public]
    frugal report [--config PATH | --db PATH|URL] [--month YYYY-MM | --from DAY [--to DAY]]
                  [--format table|json|csv|markdown] [--by model|day|key|reason] [--chart FILE]
    frugal keys   create NAME | list | revoke NAME  [--config PATH | --db PATH|URL]
    frugal migrate [--config PATH | --db PATH|URL]
    frugal check  [--config PATH]
    frugal calibrate [--config PATH] [--db PATH|URL] [--out PATH]
    frugal quantize IN.gguf OUT.gguf [--type Q4_K_M] [--force]
    frugal models pull REPO[:QUANT] [--force] | list [--format table|json] | rm REPO[:QUANT]

Errors meant for the user (a bad config, a missing database) print one clean line and exit
non-zero: 2 for a usage or config error, 3 when there is no ledger to read, 4 when the ledger
has no request in the period asked for (``frugal report``; the zero report is still printed),
1 when a ``frugal keys`` or ``frugal models`` request cannot be done (a name taken, no such
key, a model that does not fit or whose download is corrupt).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import signal
import sys
from collections.abc import Sequence
from types import FrameType
from typing import Any

from proxy import check as check_mod
from proxy import config as config_mod
from proxy.errors import ConfigError, UserError
from proxy.ledger.tenants import keys
from proxy.models import cli as models_cli
from proxy.models.cache import resolve as resolve_model
from proxy.models.gate import for_settings as gate_for_settings

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="frugal",
        description="Local-first OpenAI-compatible proxy: answer on your CPU when good enough, "
        "fall back to the API when not, and count the savings.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    check_mod.add_parser(sub)
    quantize = sub.add_parser(
        "quantize", help="requantize a GGUF with llama.cpp (Q4_K_M is recommended on a CPU)"
    )
    quantize.add_argument("source", metavar="IN.gguf")
    quantize.add_argument("target", metavar="OUT.gguf")
    quantize.add_argument("--type", default="Q4_K_M", help="target format (default Q4_K_M)")
    quantize.add_argument("--force", action="store_true", help="overwrite OUT.gguf")

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

    report = sub.add_parser(
        "report",
        help="print the savings of a month (or any range of days) from the ledger",
        epilog=REPORT_EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    source = report.add_mutually_exclusive_group()
    source.add_argument("--config", help="TOML config whose [ledger] to read")
    source.add_argument("--db", help=DB_HELP)
    when = report.add_mutually_exclusive_group()
    when.add_argument("--month", help="YYYY-MM (default: this month, UTC)")
    when.add_argument(
        "--from", dest="first", metavar="YYYY-MM-DD", help="first day of a range (UTC)"
    )
    report.add_argument(
        "--to",
        dest="last",
        metavar="YYYY-MM-DD",
        help="last day of the range, included (default: today); needs --from",
    )
    report.add_argument("--format", choices=("table", "json", "csv", "markdown"), default="table")
    report.add_argument(
        "--by",
        choices=("model", "day", "key", "reason", "kind"),
        help="one row per requested model, UTC day, client key name or routing reason; "
        "kind: the quality section (shadow audits) per task kind",
    )
    report.add_argument(
        "--chart",
        metavar="FILE",
        help="also draw the daily savings and local share to FILE.png or FILE.svg "
        "(needs matplotlib: pip install 'frugal-proxy[chart]')",
    )
    keys.add_parser(sub)
    models_cli.add_parser(sub)
    migrate = sub.add_parser(
        "migrate",
        help="create or upgrade the ledger's schema now (frugal serve also does it at start)",
    )
    source = migrate.add_mutually_exclusive_group()
    source.add_argument("--config", help="TOML config whose [ledger] to migrate")
    source.add_argument("--db", help=DB_HELP)
    calibrate = sub.add_parser(
        "calibrate",
        help="refit the quality gate on the audits of the configured model; write a weights "
        "file for [quality] weights_path",
    )
    calibrate.add_argument("--config", help="TOML config: its model, [ledger] and [quality]")
    calibrate.add_argument("--db", help=DB_HELP + " (default: the config's [ledger])")
    calibrate.add_argument(
        "--out",
        help="weights file to write (default: [quality] weights_path, else frugal-weights.json)",
    )
    return parser


def _calibrate(args: argparse.Namespace) -> int:
    from proxy.audit.refit import run_once, write_weights
    from proxy.engine.generate import bundled_model_path
    from proxy.ledger.db.location import from_argument, from_settings

    settings = resolve_model(config_mod.load(args.config))
    db = from_argument(args.db) if args.db else from_settings(settings.ledger)
    model_path = settings.local.model_path or bundled_model_path()
    if not os.path.isfile(model_path):
        raise ConfigError(f"[local] model_path = {model_path!r}: no such file")
    out = args.out or settings.quality.weights_path or "frugal-weights.json"
    target = getattr(settings.quality, "target_precision", 0.0) or None
    result = run_once(
        db, model_path, target=target, configured_threshold=settings.quality.threshold
    )
    write_weights(out, result.weights)
    print("\n".join(result.report()))
    print(
        f"frugal calibrate: wrote {out} (for {os.path.basename(model_path)}); set [quality] "
        "weights_path to it",
        file=sys.stderr,
    )
    return 0


DB_HELP = (
    "ledger database: a file, sqlite:///PATH or postgresql://USER@HOST/DB (its password from "
    "$FRUGAL_DB_PASSWORD, or libpq's $PGPASSWORD / ~/.pgpass)"
)


def _migrate(args: argparse.Namespace) -> int:
    from proxy.ledger.db.location import from_argument, from_settings
    from proxy.ledger.db.migrate import open_database

    if args.db:
        db = from_argument(args.db)
    else:
        settings = config_mod.load(args.config)
        db = from_settings(settings.ledger)
    applied = open_database(db)
    if applied:
        print(f"frugal migrate: applied {', '.join(applied)} to {db.label}", file=sys.stderr)
    else:
        print(f"frugal migrate: {db.label} is up to date", file=sys.stderr)
    return 0


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


REPORT_EXIT_CODES = """exit codes:
  0  the report was printed
  2  a bad option or config (e.g. --month 2026-13, --to without --from)
  3  no ledger to read: no database file at the path, or not a readable ledger
  4  the ledger has no request in the period (the zero report is printed all the same)
"""


def _report(args: argparse.Namespace) -> int:
    from datetime import UTC, datetime

    from proxy.ledger.db.location import from_argument, from_settings
    from proxy.ledger.reports import build as report
    from proxy.ledger.reports import chart

    quality = config_mod.QualitySettings()
    settings: config_mod.Settings | None = None
    if args.db:
        db, fixed = from_argument(args.db), 0.0
        if os.environ.get("FRUGAL_CONFIG") or os.path.isfile("frugal.toml"):
            settings = config_mod.load(None)
            fixed, quality = settings.costs.monthly_fixed_usd, settings.quality
    else:
        settings = config_mod.load(args.config)
        db, fixed = from_settings(settings.ledger), settings.costs.monthly_fixed_usd
        quality = settings.quality
    now = datetime.now(UTC)
    if args.last and not args.first:
        raise report.ReportError("--to needs --from", report.EXIT_USAGE)
    if args.chart:
        chart.check_path(args.chart)
    period = (
        report.Period.between(args.first, args.last, now)
        if args.first
        else report.Period.month(args.month, now)
    )
    data = report.build(
        db,
        period,
        fixed,
        by=args.by,
        daily=bool(args.chart),
        now=now,
        target_precision=quality.target_precision or None,
        threshold=quality.threshold,
    )
    gate = gate_for_settings(settings) if settings is not None else None
    if gate is not None and not gate.bundled:  # a pulled model: calibrated, or the prior
        data["gate"] = gate.as_dict()
    print(report.render(data, args.format))
    if data["requests"] == 0:
        print(
            f"frugal report: no requests recorded from {data['from']} to {data['to']} "
            f"in {db.label}",
            file=sys.stderr,
        )
        return report.EXIT_EMPTY
    if args.chart:
        chart.draw(data, args.chart)
        print(f"frugal report: chart written to {args.chart}", file=sys.stderr)
    return report.EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    """Run one ``frugal`` command; its exit status.

    A :class:`UserError` from any command is printed here, and only here, as one line with no
    traceback, and its ``exit_code`` returned.
    """
    args = _parser().parse_args(argv)
    try:
        status = _run(args)
        # Output to a pipe is buffered: flush it here, so that a reader that has gone shows up
        # below and not in the interpreter's own flush at exit (a message and status 120).
        sys.stdout.flush()
        return status
    except UserError as exc:
        print(f"{exc.label}: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `frugal report | head`: the reader has gone, so the rest of the output has nowhere
        # to go. End quietly, and point stdout at /dev/null so the interpreter's own flush at
        # exit does not raise again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141


def _run(args: argparse.Namespace) -> int:
    if args.command == "serve":
        return _serve(args)
    if args.command == "keys":
        return keys.run(args)
    if args.command == "models":
        return models_cli.run(args)
    if args.command == "check":
        return check_mod.run(args)
    if args.command == "migrate":
        return _migrate(args)
    if args.command == "calibrate":
        return _calibrate(args)
    if args.command == "quantize":
        from proxy.engine import quantize

        return quantize.run(args.source, args.target, args.type, args.force)
    return _report(args)


if __name__ == "__main__":
    sys.exit(main())
