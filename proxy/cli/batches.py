"""The batches' commands: ``frugal batches list``, ``show ID`` and ``cancel ID``.

    frugal batches list   [--config PATH | --db PATH|URL] [--key NAME] [--limit N]
                          [--format table|json]
    frugal batches show   ID [--config PATH | --db PATH|URL] [--format table|json]
    frugal batches cancel ID [--config PATH | --db PATH|URL]

They read the ledger database a running proxy keeps its batches in (SQLite, or the PostgreSQL
every replica shares), through the store of :mod:`proxy.ledger.batches.store`, so a batch
cancelled here stops on every replica at its next claim, as one cancelled through
``POST /v1/batches/{id}/cancel`` does. ``list`` shows the newest batches first with their
progress: lines done of the total, answered locally, answered by the API (``2+1``: two, and one
waiting in the API's batch), failed. ``show`` prints
one batch as OpenAI's object, its lines by state and by route, its files, and its money: the
API cost and the counterfactual of its lines' ledger rows, at the tier they were billed at
(:mod:`proxy.ledger.batches.tally`). ``cancel`` is the store's cancel.

Exit codes: 0 done; 1 a batch or key that is not there, or a batch that has ended and cannot
be cancelled; 2 a bad option or config; 3 no ledger database to read.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

from proxy import config as config_mod
from proxy.errors import BadRequest, NotFound, UserError
from proxy.ledger.batches.files import FileStore
from proxy.ledger.batches.objects import Batch
from proxy.ledger.batches.store import MAX_LIST, BatchStore
from proxy.ledger.batches.tally import batch_money, identities_of, owner_names
from proxy.ledger.db.connections import Pool, Unavailable
from proxy.ledger.db.location import Database, from_argument, from_settings
from proxy.ledger.pricing import PUSD_PER_USD

EXIT_NOT_FOUND = 1  # no such batch or key
EXIT_REFUSED = 1  # a batch that has ended cannot be cancelled
EXIT_NO_DATABASE = 3
DB_HELP = (
    "ledger database: a file, sqlite:///PATH or postgresql://USER@HOST/DB (its password from "
    "$FRUGAL_DB_PASSWORD, or libpq's $PGPASSWORD / ~/.pgpass)"
)


class BatchCommandError(UserError):
    """A ``frugal batches`` request that cannot be done; one line, exit status 1 unless set."""

    label = "frugal batches"


def add_parsers(sub: Any) -> None:
    batches = sub.add_parser("batches", help="list, show and cancel the batches of the Batch API")
    actions = batches.add_subparsers(dest="action", required=True)
    listing = actions.add_parser("list", help="the newest batches, with their progress")
    listing.add_argument(
        "--key", metavar="NAME", help="only the batches of the stored key NAME (frugal keys list)"
    )
    listing.add_argument(
        "--limit", type=_limit, default=20, help=f"batches shown, 1 to {MAX_LIST} (default 20)"
    )
    listing.add_argument("--format", choices=("table", "json"), default="table")
    listing.set_defaults(run=_list)
    show = actions.add_parser("show", help="one batch: progress, files and money")
    show.add_argument("batch_id", metavar="ID", help="the batch's id, batch_...")
    show.add_argument("--format", choices=("table", "json"), default="table")
    show.set_defaults(run=_show)
    cancel = actions.add_parser("cancel", help="cancel a batch that has not ended")
    cancel.add_argument("batch_id", metavar="ID", help="the batch's id, batch_...")
    cancel.set_defaults(run=_cancel)
    for cmd in (listing, show, cancel):
        source = cmd.add_mutually_exclusive_group()
        source.add_argument("--config", help="TOML config whose [ledger] holds the batches")
        source.add_argument("--db", help=DB_HELP)


def _limit(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= MAX_LIST:
        raise argparse.ArgumentTypeError(f"expected a whole number from 1 to {MAX_LIST}")
    return value


def _database(args: argparse.Namespace) -> Database:
    if args.db:
        return from_argument(args.db)
    return from_settings(config_mod.load(args.config).ledger)


@contextmanager
def _pool(args: argparse.Namespace) -> Iterator[Pool]:
    """A small pool on the ledger the options name, its schema brought up to date; no
    database (a SQLite file that is not there, a server that does not answer) is exit 3."""
    from proxy.ledger.db.migrate import open_database

    db = _database(args)
    if (missing := db.missing("run there")) is not None:
        raise BatchCommandError(missing, EXIT_NO_DATABASE)
    try:
        open_database(db)  # a ledger from before the batches gets their tables (none in them)
    except (UserError, OSError) as exc:
        raise BatchCommandError(
            f"cannot read the ledger at {db.label}: {exc}", EXIT_NO_DATABASE
        ) from exc
    except sqlite3.DatabaseError as exc:  # a file that is not a ledger
        raise BatchCommandError(
            f"cannot read the ledger at {db.label}: {type(exc).__name__}: {exc}", EXIT_NO_DATABASE
        ) from exc
    pool = Pool(db, size=1)
    try:
        yield pool
    except Unavailable as exc:
        raise BatchCommandError(
            f"cannot read the ledger at {db.label}: {exc}", EXIT_NO_DATABASE
        ) from exc
    finally:
        pool.close()


def _list(args: argparse.Namespace) -> int:
    with _pool(args) as pool:
        store = BatchStore(pool)
        names = owner_names(pool)
        if args.key is None:
            found, _ = store.list_batches(None, anyone=True, limit=args.limit)
        else:
            owners = identities_of(pool, args.key)
            if not owners:
                raise BatchCommandError(
                    f"no stored key named {args.key!r}; see `frugal keys list`", EXIT_NOT_FOUND
                )
            found = []
            for owner in owners:
                found += store.list_batches(owner, limit=args.limit)[0]
            found.sort(key=lambda b: (b.times["created_at"] or 0, b.id), reverse=True)
            found = found[: args.limit]
        rows = [_summary(batch, store.progress(batch.id), names) for batch in found]
    if args.format == "json":
        print(json.dumps(rows, indent=2))
    elif rows:
        print(_table(rows))
    else:
        print("No batches stored.", file=sys.stderr)
    return 0


def _summary(batch: Batch, progress: dict[str, int], names: dict[str, str]) -> dict[str, Any]:
    return {
        "id": batch.id,
        "status": batch.status,
        "endpoint": batch.endpoint,
        "key": _owner(batch.owner, names),
        "created": _iso(batch.times["created_at"]),
        "total": batch.total,
        "done": batch.completed + batch.failed,
        "local": progress.get("local", 0),
        "api": progress.get("api", 0),
        "deferred": progress.get("deferred", 0),
        "failed": batch.failed,
    }


def _owner(owner: str | None, names: dict[str, str]) -> str | None:
    """The key's name as ``frugal keys list`` shows it; an environment key's identity is
    shown shortened; None for the keyless proxy."""
    if owner is None:
        return None
    if owner in names:
        return names[owner]
    return owner[:16] + "…" if len(owner) > 16 else owner


def _table(rows: list[dict[str, Any]]) -> str:
    header = ("ID", "STATUS", "ENDPOINT", "KEY", "CREATED (UTC)", "DONE", "LOCAL", "API", "FAILED")
    lines = [
        (
            r["id"],
            r["status"],
            r["endpoint"],
            r["key"] or "-",
            r["created"] or "-",
            f"{r['done']}/{r['total']}",
            str(r["local"]),
            str(r["api"]) + (f"+{r['deferred']}" if r["deferred"] else ""),
            str(r["failed"]),
        )
        for r in rows
    ]
    widths = [max(len(str(c)) for c in col) for col in zip(header, *lines, strict=True)]
    return "\n".join(
        "  ".join(str(c).ljust(w) for c, w in zip(line, widths, strict=True)).rstrip()
        for line in (header, *lines)
    )


def _show(args: argparse.Namespace) -> int:
    with _pool(args) as pool:
        store = BatchStore(pool)
        batch = store.get(args.batch_id)
        if batch is None:
            raise BatchCommandError(f"no batch {args.batch_id!r}", EXIT_NOT_FOUND)
        progress = store.progress(batch.id)
        files = FileStore(pool, quota_bytes=0)
        stored = {
            role: files.get(file_id)
            for role, file_id in (
                ("input", batch.input_file_id),
                ("output", batch.output_file_id),
                ("error", batch.error_file_id),
            )
            if file_id is not None
        }
        money = batch_money(pool, batch.id, batch.times["created_at"] or 0)
        key = _owner(batch.owner, owner_names(pool))
    data = {
        "batch": batch.as_openai(),
        "key": key,
        "lines": {
            state: progress.get(state, 0)
            for state in ("pending", "claimed", "deferred", "done", "cancelled")
        },
        "routes": {"local": progress.get("local", 0), "api": progress.get("api", 0)},
        "files": {
            role: None if f is None else {"id": f.id, "bytes": f.bytes, "filename": f.filename}
            for role, f in stored.items()
        },
        "money": {
            "ledger_rows": money.rows,
            "api_cost_usd": _usd(money.api_cost_pusd),
            "counterfactual_usd": _usd(money.counterfactual_pusd),
            "saved_usd": _usd(money.saved_pusd),
        },
    }
    print(json.dumps(data, indent=2) if args.format == "json" else _details(data))
    return 0


def _usd(pusd: int) -> str:
    """Exact decimal dollars, as the ledger stores them (pico-dollars), never a float."""
    from decimal import Decimal

    return format((Decimal(pusd) / PUSD_PER_USD).normalize(), "f")


def _details(data: dict[str, Any]) -> str:
    batch = data["batch"]
    counts = batch["request_counts"]
    lines = data["lines"]
    out = [
        f"{batch['id']}  {batch['status']}  {batch['endpoint']}",
        f"key: {data['key'] or '-'}   created: {_iso(batch['created_at'])} UTC   "
        f"expires: {_iso(batch['expires_at'])} UTC",
        f"requests: {counts['total']} total, {counts['completed']} completed, "
        f"{counts['failed']} failed",
        "lines: " + ", ".join(f"{n} {state}" for state, n in lines.items()),
        f"answered: {data['routes']['local']} local, {data['routes']['api']} by the API "
        f"({lines['deferred']} waiting in the API's batch)",
    ]
    for role, f in data["files"].items():
        out.append(
            f"{role} file: {batch[f'{role}_file_id']}"
            + ("  (deleted)" if f is None else f"  {f['bytes']} bytes  {f['filename']}")
        )
    money = data["money"]
    out.append(
        f"money ({money['ledger_rows']} ledger rows, at the tier billed): API cost "
        f"${money['api_cost_usd']}, counterfactual ${money['counterfactual_usd']}, "
        f"saved ${money['saved_usd']}"
    )
    if batch["errors"]:
        for error in batch["errors"]["data"]:
            out.append(
                f"error: line {error.get('line')}: {error.get('code')}: {error.get('message')}"
            )
    return "\n".join(out)


def _cancel(args: argparse.Namespace) -> int:
    with _pool(args) as pool:
        try:
            batch = BatchStore(pool).cancel(args.batch_id)
        except NotFound:
            raise BatchCommandError(f"no batch {args.batch_id!r}", EXIT_NOT_FOUND) from None
        except BadRequest as exc:
            raise BatchCommandError(f"{args.batch_id}: {exc}", EXIT_REFUSED) from None
    if batch.status == "cancelled":
        print(f"Cancelled batch {batch.id}.", file=sys.stderr)
    else:
        print(
            f"Cancelling batch {batch.id}: lines being answered now finish first, then it is "
            "cancelled.",
            file=sys.stderr,
        )
    return 0


def _iso(ts: int | None) -> str | None:
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S")
