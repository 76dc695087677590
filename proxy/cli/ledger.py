"""The ledger's commands: ``frugal report``, ``frugal keys`` and ``frugal migrate``.

    frugal report  [--config PATH | --db PATH|URL] [--month YYYY-MM | --from DAY [--to DAY]]
                   [--format table|json|csv|markdown] [--by model|day|key|reason|kind]
                   [--chart FILE]
    frugal keys    create NAME   [--config PATH | --db PATH|URL]   prints a new key, once
                                 [--monthly-budget-usd X] [--rpm N] [--models a,b]
                                 [--max-concurrency N] [--admin]
    frugal keys    list          [--config PATH | --db PATH|URL] [--format table|json]
    frugal keys    revoke NAME   [--config PATH | --db PATH|URL]
    frugal migrate [--config PATH | --db PATH|URL]

What they read and write is :mod:`proxy.ledger` (the report's figures in
:mod:`proxy.ledger.reports`, the keys in :mod:`proxy.ledger.tenants.keys`); this module is
their options and what they print.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from proxy import config as config_mod
from proxy.ledger.db.location import from_argument, from_settings
from proxy.ledger.tenants import keys
from proxy.models.gate_status import for_settings as gate_for_settings

DB_HELP = (
    "ledger database: a file, sqlite:///PATH or postgresql://USER@HOST/DB (its password from "
    "$FRUGAL_DB_PASSWORD, or libpq's $PGPASSWORD / ~/.pgpass)"
)


def add_parsers(sub: Any) -> None:
    _add_report(sub)
    _add_keys(sub)
    migrate = sub.add_parser(
        "migrate",
        help="create or upgrade the ledger's schema now (frugal serve also does it at start)",
    )
    source = migrate.add_mutually_exclusive_group()
    source.add_argument("--config", help="TOML config whose [ledger] to migrate")
    source.add_argument("--db", help=DB_HELP)
    migrate.set_defaults(run=_migrate)


def _add_report(sub: Any) -> None:
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
    report.set_defaults(run=_report)


REPORT_EXIT_CODES = """exit codes:
  0  the report was printed
  2  a bad option or config (e.g. --month 2026-13, --to without --from)
  3  no ledger to read: no database file at the path, or not a readable ledger
  4  the ledger has no request in the period (the zero report is printed all the same)
"""


def _report(args: argparse.Namespace) -> int:
    from datetime import UTC, datetime

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


def _migrate(args: argparse.Namespace) -> int:
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


def _add_keys(sub: Any) -> None:
    keys = sub.add_parser("keys", help="create, list and revoke client keys")
    actions = keys.add_subparsers(dest="action", required=True)
    for action, help_text in (
        ("create", "make a key and print it (once)"),
        ("list", "show the stored keys (never the keys themselves)"),
        ("revoke", "stop accepting a key"),
    ):
        cmd = actions.add_parser(action, help=help_text)
        if action != "list":
            cmd.add_argument("name", help="the key's name, as the ledger and report show it")
        if action == "create":
            cmd.add_argument(
                "--monthly-budget-usd",
                type=float,
                help="API spend allowed per UTC month, across every replica (default: none)",
            )
            cmd.add_argument("--rpm", type=int, help="requests per minute (default: no limit)")
            cmd.add_argument(
                "--models", help="the only models the key may ask for, e.g. gpt-4o-mini,local"
            )
            cmd.add_argument(
                "--max-concurrency",
                type=int,
                help="its requests in flight at most, on each server (default: [server] "
                "max_concurrency_per_key, a quarter of max_concurrency)",
            )
            cmd.add_argument(
                "--admin",
                action="store_true",
                help="an admin key: it reads every key's figures in the report and the "
                "dashboard, /metrics and the full /healthz (default: a client key, which reads "
                "only its own figures)",
            )
        else:
            cmd.add_argument("--format", choices=("table", "json"), default="table")
        cmd.set_defaults(run=_keys)
        source = cmd.add_mutually_exclusive_group()
        source.add_argument("--config", help="TOML config whose [ledger] holds the keys")
        source.add_argument(
            "--db",
            help="ledger database that holds the keys: a file, sqlite:///PATH or "
            "postgresql://USER@HOST/DB (password from $FRUGAL_DB_PASSWORD or $PGPASSWORD)",
        )


def _keys(args: argparse.Namespace) -> int:
    settings = None if args.db else config_mod.load(args.config)
    db = from_argument(args.db) if settings is None else from_settings(settings.ledger)
    if args.action == "create":
        key = keys.create(
            db,
            args.name,
            monthly_budget_pusd=None
            if args.monthly_budget_usd is None
            else keys.budget_pusd(args.monthly_budget_usd),
            rpm=args.rpm,
            models=None if args.models is None else keys.parse_models(args.models),
            max_concurrency=args.max_concurrency,
            admin=args.admin,
        )
        print(key)
        scope = "an admin key" if args.admin else "a client key"
        print(
            f"Created {scope} {args.name!r}. This is the only time it is shown: store it now. "
            f"Clients send it as 'Authorization: Bearer KEY'.",
            file=sys.stderr,
        )
    elif args.action == "revoke":
        keys.revoke(db, args.name)
        print(f"Revoked key {args.name!r}.", file=sys.stderr)
    else:
        rows = keys.listing(db)
        if args.format == "json":
            print(json.dumps(rows, indent=2))
        elif rows:
            print(_table(rows, None if settings is None else settings.server.key_concurrency()))
        else:
            print("No keys stored; create one with `frugal keys create NAME`.", file=sys.stderr)
    return 0


def _table(rows: list[dict[str, Any]], default_share: int | None = None) -> str:
    """The listing; ``default_share``: what a key without ``--max-concurrency`` may hold (known
    when the config was read, not with ``--db``)."""
    default = "default" if default_share is None else f"{default_share} (default)"
    header = (
        "NAME",
        "KEY",
        "CREATED (UTC)",
        "STATUS",
        "REQUESTS",
        "LAST USED (UTC)",
        "CONCURRENCY",
        "SCOPE",
    )
    lines = [
        (
            r["name"],
            r["hint"],
            r["created"],
            f"revoked {r['revoked']}" if r["revoked"] else "active",
            str(r["requests"]),
            r["last_used"] or "-",
            default if r["max_concurrency"] is None else str(r["max_concurrency"]),
            r["scope"],
        )
        for r in rows
    ]
    widths = [max(len(str(c)) for c in col) for col in zip(header, *lines, strict=True)]
    return "\n".join(
        "  ".join(str(c).ljust(w) for c, w in zip(line, widths, strict=True)).rstrip()
        for line in (header, *lines)
    )
