"""The ledger: migrations, bad database files, batched writes that survive failures, and (marked
``serve``) a real ``frugal serve`` under load and after ``kill -9``."""

from __future__ import annotations

import asyncio
import json
import math
import os
import random
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from proxy.errors import ConfigError
from proxy.ledger.db.migrate import migrate, migration_files, open_database
from proxy.ledger.writing.tokens import CountJob, TokenCounter, _import_litellm
from proxy.ledger.writing.usage import check_money, check_usage
from proxy.ledger.writing.writer import COLUMNS, Ledger, LedgerRow
from proxy.serving.metrics import Metrics
from tests.conftest import settings_for
from tests.fake_api import FakeAPI
from tests.faults_support import ledger_rows
from tests.ledger.load import Load
from tests.load_factor import CEILING_S, scaled
from tests.loopback import outlived

FRUGAL = str(Path(sys.executable).with_name("frugal"))
NAMES = [name for name, _ in migration_files()]
QUESTION = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]


def connect(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(path, isolation_level=None)


@contextmanager
def locked(db: Path) -> Iterator[None]:
    """Another connection holds the database with BEGIN EXCLUSIVE until the block ends."""
    holder = connect(db)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        yield
    finally:
        holder.execute("ROLLBACK")
        holder.close()


def schema(conn: sqlite3.Connection) -> dict[str, Any]:
    """Tables, their columns (name, type, not null, default) and indexes, order-free."""
    tables = sorted(
        r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
    )
    return {
        "tables": tables,
        "columns": {
            t: sorted(tuple(c[1:5]) for c in conn.execute(f"PRAGMA table_info({t})"))
            for t in tables
        },
        "indexes and triggers": sorted(
            (r[0], " ".join(r[1].split()))
            for r in conn.execute(
                "SELECT name, sql FROM sqlite_master WHERE type IN ('index', 'trigger')"
            )
            if r[1]
        ),
    }


def fresh_schema(tmp_path: Path) -> dict[str, Any]:
    conn = connect(tmp_path / "fresh.db")
    try:
        migrate(conn)
        return schema(conn)
    finally:
        conn.close()


def api_row(request_id: str, **extra: Any) -> LedgerRow:
    fields: dict[str, Any] = {
        "request_id": request_id,
        "ts": time.time(),
        "requested_model": "gpt-4o-mini",
        "api_model": "gpt-4o-mini",
        "route": "api",
        "reason": "forced",
        "status": 200,
        "prompt_tokens": 10,
        "completion_tokens": 5,
        "latency_ms": 12.5,
        "api_ms": 12.0,
        **extra,
    }
    return LedgerRow(**fields)


async def until(check: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.01)


# -- migrations ---------------------------------------------------------------------------------


def test_migrating_from_empty_applies_every_migration_in_order(tmp_path: Path) -> None:
    conn = connect(tmp_path / "ledger.db")
    assert migrate(conn) == NAMES
    assert NAMES == sorted(NAMES) and NAMES[:2] == ["0001_ledger.sql", "0002_costs.sql"]
    recorded = [r[0] for r in conn.execute("SELECT name FROM _migrations ORDER BY applied_at")]
    assert recorded == NAMES
    columns = {r[1] for r in conn.execute("PRAGMA table_info(requests)")}
    assert set(COLUMNS) <= columns
    indexes = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='index'")}
    assert {"requests_ts", "requests_tax"} <= indexes
    triggers = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='trigger'")}
    assert triggers == {"requests_daily_insert", "requests_daily_update", "requests_daily_delete"}
    assert migrate(conn) == []  # a second run applies nothing
    conn.close()


@pytest.mark.parametrize("version", NAMES)
def test_migrating_from_every_earlier_version_reaches_the_same_schema(
    tmp_path: Path, version: str
) -> None:
    conn = connect(tmp_path / "old.db")
    migrate(conn, upto=version)
    present = [r[1] for r in conn.execute("PRAGMA table_info(requests)")]
    sample = {
        "request_id": "old-1",
        "ts": 1_790_000_000.0,
        "endpoint": "chat.completions",
        "requested_model": "gpt-4o-mini",
        "route": "api",
        "reason": "low_quality",
        "status": 200,
        "prompt_tokens": 10,
        "completion_tokens": 5,
        "latency_ms": 1500.0,
        "local_ms": 1200.0,
        "api_ms": 300.0,
        "api_cost_pusd": 4_500_000,
        "counterfactual_cost_pusd": 4_500_000,
    }
    names = [c for c in sample if c in present]
    conn.execute(
        f"INSERT INTO requests ({', '.join(names)}) VALUES ({', '.join('?' for _ in names)})",
        [sample[c] for c in names],
    )
    later = NAMES[NAMES.index(version) + 1 :]
    assert migrate(conn) == later
    assert schema(conn) == fresh_schema(tmp_path)
    [row] = ledger_rows(tmp_path / "old.db")
    assert {k: row[k] for k in sample} == sample
    if "latency_tax_ms" not in present:  # written before 0002: backfilled
        assert row["latency_tax_ms"] == 1200.0
        assert row["token_source"] == "usage"
        assert row["counterfactual_prompt_tokens"] == 10
    conn.close()


# A migration that builds on earlier ones cannot have run without them.
REQUIRES = {
    "0005_key_rollup.sql": {"0002_costs.sql", "0003_keys.sql"},
    "0008_budgets_cache.sql": {"0003_keys.sql"},  # it adds columns to api_keys
    "0009_key_concurrency.sql": {"0003_keys.sql"},  # a column of api_keys
    "0010_key_scope.sql": {"0003_keys.sql"},  # a column of api_keys
    "0012_responses_quota.sql": {"0011_responses.sql"},  # columns of responses
    "0015_responses_usage.sql": {"0011_responses.sql", "0012_responses_quota.sql"},  # sums bytes
    "0018_background_lease.sql": {"0011_responses.sql", "0012_responses_quota.sql"},  # a column
}


@pytest.mark.parametrize("missing", NAMES[1:])
def test_a_migration_missed_out_of_order_is_applied_later(tmp_path: Path, missing: str) -> None:
    """A database that has every migration but one (say a branch landed 0003 before 0002) and
    those that build on it."""
    skipped = [n for n in NAMES if n == missing or missing in REQUIRES.get(n, set())]
    conn = connect(tmp_path / "gap.db")
    conn.execute("CREATE TABLE _migrations (name TEXT PRIMARY KEY, applied_at REAL NOT NULL)")
    for name, sql in migration_files():
        if name not in skipped:
            conn.executescript(sql)
            conn.execute("INSERT INTO _migrations VALUES (?, ?)", (name, time.time()))
    assert migrate(conn) == skipped
    assert schema(conn) == fresh_schema(tmp_path)
    conn.close()


KEYS = ["alice", "bob", "ci", None, ""]  # None: the proxy ran without keys


def insert_random_rows(conn: sqlite3.Connection, rng: random.Random, n: int, days: int) -> None:
    models = ["gpt-4o-mini", "gpt-4o", None, "my-finetune"]
    first = conn.execute("SELECT COALESCE(MAX(id), 0) FROM requests").fetchone()[0]
    conn.execute("BEGIN")
    for i in range(first, first + n):
        route = rng.choice(["local", "api", "none"])
        conn.execute(
            "INSERT INTO requests (request_id, ts, endpoint, requested_model, key_name, route, "
            "reason, status, latency_ms, api_cost_pusd, counterfactual_cost_pusd, "
            "counterfactual_prompt_tokens, latency_tax_ms) VALUES (?, ?, 'chat.completions', "
            "?, ?, ?, ?, ?, 1, ?, ?, ?, ?)",
            (
                f"r{i}",
                1_790_000_000 + rng.uniform(0, days * 86400),
                rng.choice(models),
                rng.choice(KEYS),
                route,
                rng.choice(["accepted", "low_quality", "forced"]),
                rng.choice([200, 200, 200, 400, 502]),
                rng.choice([None, 0, rng.randrange(10**12)]),
                rng.choice([None, rng.randrange(10**12)]),
                rng.choice([None, 12]),
                rng.choice([0.0, 0.0, rng.uniform(1, 5000)]),
            ),
        )
    conn.execute("COMMIT")


def rollup_of_the_rows(conn: sqlite3.Connection) -> list[tuple[Any, ...]]:
    """The daily rollup summed here, in Python, from the rows themselves (not by the SQL the
    migrations and triggers use): one tuple per (day, model, key, reason, route, failed), in
    that order, with the rollup table's columns."""
    groups: dict[tuple[Any, ...], list[Any]] = {}
    for ts, model, key, reason, route, status, paid, counterfactual, tokens, tax in conn.execute(
        "SELECT ts, requested_model, key_name, reason, route, status, api_cost_pusd, "
        "counterfactual_cost_pusd, counterfactual_prompt_tokens, latency_tax_ms FROM requests"
    ):
        day = int(ts // 86400)
        sums = groups.setdefault(
            (day, model or "", key or "", reason, route, int(status >= 400)), [0] * 7
        )
        uncosted = status < 400 and counterfactual is None
        sums[0] += 1
        sums[1] += paid or 0
        sums[2] += counterfactual or 0
        sums[3] += int(uncosted)
        sums[4] += int(uncosted and tokens is None)
        sums[5] += tax or 0.0
        sums[6] += int((tax or 0.0) > 0)
    return [(*group, *sums) for group, sums in sorted(groups.items())]


def assert_rollup_is_the_sum_of_the_rows(conn: sqlite3.Connection) -> int:
    """Every rollup row equals a GROUP BY over the rows; returns how many there are."""
    rollup = conn.execute("SELECT * FROM requests_daily ORDER BY 1, 2, 3, 4, 5, 6").fetchall()
    expected = rollup_of_the_rows(conn)
    assert len(rollup) == len(expected)
    for got, want in zip(rollup, expected, strict=True):
        assert (got[:11], got[12]) == (want[:11], want[12])
        assert got[11] == pytest.approx(want[11])  # the latency tax, a float
    return len(rollup)


def test_the_daily_rollup_stays_the_sum_of_the_rows(tmp_path: Path) -> None:
    """Inserts, updates (a count arriving late, a status fixed, a key renamed) and deletes
    (pruning)."""
    conn = connect(tmp_path / "ledger.db")
    migrate(conn)
    insert_random_rows(conn, random.Random(2), 2000, days=10)
    conn.execute(
        "UPDATE requests SET counterfactual_cost_pusd = 777, counterfactual_prompt_tokens = 3 "
        "WHERE id % 7 = 0"
    )
    conn.execute("UPDATE requests SET status = 200, ts = ts + 86400 WHERE id % 11 = 0")
    conn.execute("UPDATE requests SET key_name = 'renamed' WHERE id % 13 = 0")
    conn.execute("DELETE FROM requests WHERE id % 5 = 0")
    assert assert_rollup_is_the_sum_of_the_rows(conn) > 50
    conn.close()


def test_upgrading_to_the_key_rollup_sums_the_rows_of_every_key(tmp_path: Path) -> None:
    """A ledger at 0004 (the rollup without the key) with rows of several keys, one of them
    NULL: 0005 rebuilds the rollup from the rows, and its triggers keep it equal after."""
    conn = connect(tmp_path / "v4.db")
    migrate(conn, upto="0004_prediction.sql")
    rng = random.Random(3)
    insert_random_rows(conn, rng, 1500, days=5)
    assert migrate(conn, upto="0005_key_rollup.sql") == ["0005_key_rollup.sql"]
    assert assert_rollup_is_the_sum_of_the_rows(conn) > 50
    keys = {r[0] for r in conn.execute("SELECT DISTINCT key_name FROM requests_daily")}
    assert keys == {"alice", "bob", "ci", ""}  # NULL and '' are both "no key", like model
    # After the upgrade: the writer's inserts, a late count, pruning.
    insert_random_rows(conn, rng, 500, days=6)
    conn.execute("UPDATE requests SET counterfactual_cost_pusd = 5 WHERE id % 9 = 0")
    conn.execute("DELETE FROM requests WHERE id % 4 = 0 OR key_name = 'bob'")
    assert assert_rollup_is_the_sum_of_the_rows(conn) > 50
    assert "bob" not in {r[0] for r in conn.execute("SELECT key_name FROM requests_daily")}
    conn.close()


# -- bad database files --------------------------------------------------------------------------


def not_usable(db: Path) -> str:
    """The whole error a corrupt ledger file gets, naming the key, the file and the fix."""
    return (
        f"[ledger] path = {str(db)!r}: not a usable SQLite database (file is not a database); "
        "move the file aside or point [ledger] path elsewhere"
    )


def test_a_corrupt_file_is_a_clear_error(tmp_path: Path) -> None:
    db = tmp_path / "ledger.db"
    db.write_bytes(b"this is not a database, it is a shopping list\n" * 100)
    with pytest.raises(ConfigError) as info:
        open_database(str(db))
    assert str(info.value) == not_usable(db)


def test_a_locked_database_is_a_clear_error(tmp_path: Path) -> None:
    db = tmp_path / "ledger.db"
    open_database(str(db))
    with locked(db):
        with pytest.raises(ConfigError) as info:
            open_database(str(db), busy_timeout_s=0.2)
    assert "the database is locked by another process" in str(info.value)
    open_database(str(db), busy_timeout_s=0.2)  # and fine once released


def test_a_missing_folder_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="the folder .* does not exist"):
        open_database(str(tmp_path / "nope" / "ledger.db"))


def serve_once(tmp_path: Path, db: Path) -> subprocess.CompletedProcess[str]:
    config = tmp_path / "frugal.toml"
    config.write_text(f'[ledger]\npath = "{db}"\n[fallback]\napi_base = ""\napi_key_env = ""\n')
    return subprocess.run(
        [FRUGAL, "serve", "--config", str(config), "--port", "1"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_serve_refuses_to_start_on_a_corrupt_ledger(tmp_path: Path) -> None:
    db = tmp_path / "ledger.db"
    db.write_bytes(b"\x00garbage" * 1000)
    out = serve_once(tmp_path, db)
    assert out.returncode == 2
    assert out.stderr.strip() == "frugal: config error: " + not_usable(db)


def test_serve_refuses_to_start_on_a_locked_ledger(tmp_path: Path) -> None:
    db = tmp_path / "ledger.db"
    open_database(str(db))
    with locked(db):
        out = serve_once(tmp_path, db)
    assert out.returncode == 2
    assert out.stderr.strip() == (
        f"frugal: config error: [ledger] path = {str(db)!r}: the database is locked by another "
        "process (is another `frugal serve` using it?); waited 5 s"
    )


# -- the writer ----------------------------------------------------------------------------------


async def test_rows_are_written_in_batches_with_their_costs(tmp_path: Path) -> None:
    ledger = Ledger(str(tmp_path / "ledger.db"), flush_interval_s=0.05, batch_size=64)
    await ledger.start()
    for i in range(200):
        ledger.record(api_row(f"r{i}", local_ms=250.0 if i % 2 else 0.0, reason="low_quality"))
    await until(lambda: ledger.written == 200)
    assert ledger.health()["write_failures"] == 0
    await ledger.close()
    rows = ledger_rows(tmp_path / "ledger.db")
    assert [r["request_id"] for r in rows] == [f"r{i}" for i in range(200)]
    assert {r["api_cost_pusd"] for r in rows} == {10 * 150_000 + 5 * 600_000}
    assert {r["counterfactual_cost_pusd"] for r in rows} == {10 * 150_000 + 5 * 600_000}
    assert {r["token_source"] for r in rows} == {"usage"}
    assert sum(r["latency_tax_ms"] for r in rows) == 100 * 250.0


async def test_close_writes_every_row_still_queued(tmp_path: Path) -> None:
    ledger = Ledger(str(tmp_path / "ledger.db"), flush_interval_s=5.0, batch_size=10_000)
    await ledger.start()
    for i in range(1000):
        ledger.record(api_row(f"r{i}"))
    assert ledger.written == 0 and ledger.pending == 1000
    await ledger.close()
    assert len(ledger_rows(tmp_path / "ledger.db")) == 1000


async def test_rows_are_held_and_retried_while_the_database_is_locked(tmp_path: Path) -> None:
    db = tmp_path / "ledger.db"
    ledger = Ledger(str(db), flush_interval_s=0.02, busy_timeout_s=0.05)
    await ledger.start()
    with locked(db):
        for i in range(50):
            ledger.record(api_row(f"r{i}"))
        await until(lambda: ledger.write_retries >= 2)
        health = ledger.health()
        assert (health["rows_written"], health["retrying"], health["rows_dropped"]) == (0, 50, 0)
        assert health["pending"] == 50 and health["rows_rejected"] == 0
        assert health["failing_since"] is not None and health["state"] == "degraded"
        assert health["last_error"] == "OperationalError"
        ledger.record(api_row("late"))
    await until(lambda: ledger.written == 51)
    health = ledger.health()
    assert (health["retrying"], health["pending"], health["failing_since"]) == (0, 0, None)
    assert health["state"] == "ok"
    await ledger.close()
    assert len(ledger_rows(db)) == 51 and ledger.dropped == ledger.rejected == 0
    assert not Path(ledger.spill_path).exists()


def spilled(ledger: Ledger) -> list[dict[str, Any]]:
    path = Path(ledger.spill_path)
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


# A value each layer refuses: SQLite's binding (beyond int64), the cost code (a list for a
# status), SQLite's types (a dict), a constraint (NaN is stored as NULL in a NOT NULL column).
BAD_VALUES = [
    pytest.param({"status": 2**70}, "OverflowError", id="int-beyond-int64"),
    pytest.param({"status": [200]}, "TypeError", id="list-status"),
    pytest.param({"error": {"not": "a text"}}, "ProgrammingError", id="dict-value"),
    pytest.param({"latency_ms": math.nan}, "IntegrityError", id="nan-not-null"),
]


@pytest.mark.parametrize(("bad", "error"), BAD_VALUES)
async def test_a_row_that_cannot_be_written_is_set_aside_alone_and_the_others_are_written(
    tmp_path: Path, bad: dict[str, Any], error: str
) -> None:
    ledger = Ledger(str(tmp_path / "ledger.db"), flush_interval_s=0.05)
    await ledger.start()
    ledger.record(api_row("good-1"))
    ledger.record(api_row("bad", **bad))
    ledger.record(api_row("good-2"))
    await until(lambda: ledger.written + ledger.rejected == 3)
    ledger.record(api_row("after"))  # the writer goes on
    await until(lambda: ledger.written == 3)
    health = ledger.health()
    assert (health["rows_rejected"], health["rows_dropped"], health["pending"]) == (1, 0, 0)
    assert (health["last_error"], health["state"]) == (error, "degraded")
    assert [d["request_id"] for d in ledger.dead_letters] == ["bad"]
    assert ledger.dead_letters[0]["error"] == error
    await ledger.close()
    rows = ledger_rows(tmp_path / "ledger.db")
    assert [r["request_id"] for r in rows] == ["good-1", "good-2", "after"]
    [line] = spilled(ledger)
    assert (line["why"], line["error"], line["row"]["request_id"]) == ("rejected", error, "bad")
    assert line["row"]["prompt_tokens"] == 10 and "messages" not in line["row"]


async def test_impossible_usage_is_stored_as_null_with_the_row_and_counted(
    tmp_path: Path,
) -> None:
    """2**70 tokens from an upstream cannot be a count: the row is written (a request is never
    left without its row), its tokens NULL, the fields named, its costs unknown."""
    db = tmp_path / "ledger.db"
    ledger = Ledger(str(db), flush_interval_s=0.02)
    await ledger.start()
    ledger.record(api_row("good-1"))
    ledger.record(api_row("huge", prompt_tokens=2**70, completion_tokens=-3, cached_tokens=2**70))
    ledger.record(api_row("text", completion_tokens="5"))
    ledger.record(api_row("whole-float", prompt_tokens=10.0))
    ledger.record(api_row("good-2"))
    await until(lambda: ledger.written == 5)
    assert (ledger.health()["usage_invalid"], ledger.rejected) == (2, 0)
    await ledger.close()
    rows = {r["request_id"]: r for r in ledger_rows(db)}
    huge = rows["huge"]
    assert (huge["prompt_tokens"], huge["completion_tokens"], huge["cached_tokens"]) == (
        None,
        None,
        0,
    )
    assert huge["usage_invalid"] == "prompt_tokens,completion_tokens,cached_tokens"
    assert (huge["api_cost_pusd"], huge["counterfactual_cost_pusd"]) == (None, None)
    assert (huge["status"], huge["route"]) == (200, "api")
    assert rows["text"]["usage_invalid"] == "completion_tokens"
    assert rows["text"]["prompt_tokens"] == 10 and rows["text"]["api_cost_pusd"] is None
    for ok in ("good-1", "good-2", "whole-float"):
        assert rows[ok]["usage_invalid"] is None
        assert rows[ok]["api_cost_pusd"] == 10 * 150_000 + 5 * 600_000
    assert not spilled(ledger)


def test_usage_checks_keep_possible_counts_and_blank_the_rest() -> None:
    row: dict[str, Any] = {
        "prompt_tokens": 2**31 - 1,
        "completion_tokens": 2**31,
        "local_prompt_tokens": True,
        "local_completion_tokens": 7.5,
        "cached_tokens": -1,
        "upstream_attempts": 2,
        "api_cost_pusd": 2**63,
        "counterfactual_cost_pusd": 2**63 - 1,
    }
    assert check_usage(row) == [
        "completion_tokens",
        "local_prompt_tokens",
        "local_completion_tokens",
        "cached_tokens",
    ]
    assert check_money(row) == ["api_cost_pusd"]
    assert row == {
        "prompt_tokens": 2**31 - 1,
        "completion_tokens": None,
        "local_prompt_tokens": None,
        "local_completion_tokens": None,
        "cached_tokens": 0,
        "upstream_attempts": 2,
        "api_cost_pusd": None,
        "counterfactual_cost_pusd": 2**63 - 1,
    }


async def test_upstream_attempts_are_written_and_a_row_without_them_stays_null(
    tmp_path: Path,
) -> None:
    db = tmp_path / "ledger.db"
    ledger = Ledger(str(db), flush_interval_s=0.02)
    await ledger.start()
    ledger.record(api_row("retried", upstream_attempts=3))
    ledger.record(api_row("local", route="local", reason="accepted"))
    await ledger.close()
    rows = {r["request_id"]: r["upstream_attempts"] for r in ledger_rows(db)}
    assert rows == {"retried": 3, "local": None}


def hold_lock(db: Path, seconds: float) -> tuple[threading.Thread, threading.Event]:
    """Another connection takes the database with BEGIN EXCLUSIVE and releases it after
    ``seconds``; the event is set once the lock is held."""
    held = threading.Event()

    def run() -> None:
        conn = connect(db)
        try:
            conn.execute("BEGIN EXCLUSIVE")
            held.set()
            time.sleep(seconds)
            conn.execute("ROLLBACK")
        finally:
            conn.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert held.wait(10)
    return thread, held


async def test_a_database_locked_for_seconds_gets_every_row_once_released(
    tmp_path: Path,
) -> None:
    db = tmp_path / "ledger.db"
    ledger = Ledger(str(db), flush_interval_s=0.02, busy_timeout_s=0.2)
    await ledger.start()
    holder, _ = hold_lock(db, 3.0)
    for i in range(300):
        ledger.record(api_row(f"r{i}"))
        if i % 50 == 0:
            await asyncio.sleep(0.05)
    await until(lambda: ledger.write_retries >= 1)
    assert ledger.written == 0
    await asyncio.to_thread(holder.join, 30)
    await until(lambda: ledger.written == 300, timeout=30)
    health = ledger.health()
    assert (health["rows_rejected"], health["rows_dropped"], health["pending"]) == (0, 0, 0)
    assert health["write_retries"] >= 1 and health["state"] == "ok"
    await ledger.close()
    assert [r["request_id"] for r in ledger_rows(db)] == [f"r{i}" for i in range(300)]


async def test_a_full_queue_drops_new_rows_and_counts_them(tmp_path: Path) -> None:
    db = tmp_path / "ledger.db"
    ledger = Ledger(str(db), flush_interval_s=0.02, busy_timeout_s=0.05, max_queue=10)
    await ledger.start()
    with locked(db):
        for i in range(25):
            ledger.record(api_row(f"r{i}"))
        health = ledger.health()
        assert (health["rows_dropped"], health["pending"], health["max_queue"]) == (15, 10, 10)
        assert health["state"] == "degraded"
    await until(lambda: ledger.written == 10)
    ledger.record(api_row("room-again"))
    await until(lambda: ledger.written == 11)
    await ledger.close()
    assert [r["request_id"] for r in ledger_rows(db)] == [f"r{i}" for i in range(10)] + [
        "room-again"
    ]
    assert ledger.dropped == 15


async def test_flush_writes_what_is_queued_without_waiting_for_the_interval(
    tmp_path: Path,
) -> None:
    ledger = Ledger(str(tmp_path / "ledger.db"), flush_interval_s=30.0, batch_size=10_000)
    await ledger.start()
    for i in range(20):
        ledger.record(api_row(f"r{i}"))
    assert await ledger.flush(20.0)
    assert ledger.written == 20 and ledger.pending == 0
    await ledger.close()


async def test_close_while_the_database_stays_locked_spills_every_row(tmp_path: Path) -> None:
    """The stop's deadline passes with the database still locked: the rows go to the spill
    file, all of them, and the counts say so; nothing is silently lost."""
    db = tmp_path / "ledger.db"
    ledger = Ledger(str(db), flush_interval_s=0.02, busy_timeout_s=2.0)
    await ledger.start()
    with locked(db):
        for i in range(40):
            ledger.record(api_row(f"r{i}", upstream_attempts=1))
        assert not await ledger.flush(0.5)  # the shutdown's flush gives up...
        started = time.monotonic()
        await ledger.close(1.0)  # ...and the close spills at its deadline
        closed_in = time.monotonic() - started
        ledger.record(api_row("after-close"))  # a straggler goes to the file as well
    assert closed_in < 30  # bounded: not the busy timeout times the retries
    lines = spilled(ledger)
    assert [line["row"]["request_id"] for line in lines] == [f"r{i}" for i in range(40)] + [
        "after-close"
    ]
    assert {line["why"] for line in lines} == {"unwritten"}
    assert lines[0]["row"]["upstream_attempts"] == 1 and lines[0]["row"]["ts"] > 0
    health = ledger.health()
    assert (health["rows_spilled"], health["rows_lost"], health["rows_written"]) == (41, 0, 0)
    assert ledger_rows(db) == []


async def test_a_spill_file_that_cannot_be_written_counts_the_rows_lost(tmp_path: Path) -> None:
    db = tmp_path / "ledger.db"
    ledger = Ledger(str(db), flush_interval_s=0.02, busy_timeout_s=0.05)
    await ledger.start()
    Path(ledger.spill_path).mkdir()  # a folder where the file should be
    with locked(db):
        for i in range(5):
            ledger.record(api_row(f"r{i}"))
        await ledger.close(1.0)
    assert (ledger.lost, ledger.spilled, ledger.health()["state"]) == (5, 0, "degraded")


async def test_the_ledger_counters_are_in_metrics(tmp_path: Path) -> None:
    ledger = Ledger(str(tmp_path / "ledger.db"), flush_interval_s=0.02, max_queue=7)
    await ledger.start()
    ledger.record(api_row("good"))
    ledger.record(api_row("bad", status=2**70))
    ledger.record(api_row("huge", prompt_tokens=2**70))
    await until(lambda: ledger.written + ledger.rejected == 3)
    text = Metrics(ledger=ledger).render().decode()
    await ledger.close()
    values = {
        line.split()[0]: float(line.split()[1])
        for line in text.splitlines()
        if line.startswith("frugal_ledger_")
    }
    assert values["frugal_ledger_rows_written_total"] == 2
    assert values["frugal_ledger_rows_rejected_total"] == 1
    assert values["frugal_ledger_usage_invalid_total"] == 1
    assert values["frugal_ledger_rows_dropped_total"] == 0
    assert values["frugal_ledger_max_queue"] == 7
    assert values["frugal_ledger_degraded"] == 1


def slow_counter() -> tuple[TokenCounter, threading.Event]:
    """A token counter whose litellm is not ready until the event is set."""
    gate = threading.Event()

    def slow_litellm() -> Any:
        gate.wait(30)
        return _import_litellm()

    return TokenCounter(slow_litellm), gate


def paris_count() -> CountJob:
    """The count of QUESTION answered "Paris." for gpt-4o-mini."""
    body = {"model": "gpt-4o-mini", "messages": QUESTION}
    completion = {"choices": [{"message": {"role": "assistant", "content": "Paris."}}]}
    return CountJob(model="gpt-4o-mini", body=body, completion=completion)


async def test_a_slow_tokenizer_never_holds_a_row_back(tmp_path: Path) -> None:
    """Until litellm is ready a local row goes in with the local model's counts, then is
    updated with the requested model's; the row itself is written at once."""
    counter, gate = slow_counter()
    db = tmp_path / "ledger.db"
    ledger = Ledger(str(db), counter=counter, flush_interval_s=0.02)
    await ledger.start()
    row = api_row(
        "local-1", route="local", reason="accepted", prompt_tokens=40, completion_tokens=3
    )
    ledger.record(row, count=paris_count())
    await until(lambda: ledger.written == 1)
    [early] = ledger_rows(db)
    assert (early["token_source"], early["counterfactual_prompt_tokens"]) == ("local", 40)
    assert early["counterfactual_cost_pusd"] == 40 * 150_000 + 3 * 600_000
    assert ledger.health()["token_counter"] == "loading"
    gate.set()
    await until(lambda: ledger_rows(db)[0]["token_source"] == "tokenizer")
    [late] = ledger_rows(db)
    assert (late["counterfactual_prompt_tokens"], late["counterfactual_completion_tokens"]) == (
        19,
        2,
    )
    assert late["counterfactual_cost_pusd"] == 19 * 150_000 + 2 * 600_000
    assert late["api_cost_pusd"] == 0
    await ledger.close()


async def test_close_waits_for_the_counts_of_the_last_rows(tmp_path: Path) -> None:
    """On SIGTERM a local row still queued goes in with its real count, if it comes in time."""
    counter, gate = slow_counter()
    db = tmp_path / "ledger.db"
    ledger = Ledger(str(db), counter=counter, flush_interval_s=5.0)
    await ledger.start()
    row = api_row("last", route="local", reason="accepted", prompt_tokens=40)
    ledger.record(row, count=paris_count())
    closing = asyncio.create_task(ledger.close())
    await asyncio.sleep(0.3)
    assert not closing.done() and ledger.written == 0
    gate.set()
    await closing
    [stored] = ledger_rows(db)
    assert (stored["token_source"], stored["counterfactual_prompt_tokens"]) == ("tokenizer", 19)


async def ledger_health_once(client: httpx.AsyncClient, counter: str) -> dict[str, Any]:
    """The ledger's /healthz once ``counter`` is above 0, or after about five seconds."""
    for _ in range(500):
        health: dict[str, Any] = (await client.get("/healthz")).json()["ledger"]
        if health[counter]:
            break
        await asyncio.sleep(0.01)
    return health


async def test_healthz_counts_write_failures_and_the_request_still_succeeds(
    tmp_path: Path, fake_api: FakeAPI, make_client: Any
) -> None:
    settings = settings_for(tmp_path, fake_api, ledger={"busy_timeout_s": 0.05})
    db = tmp_path / "ledger.db"
    async with make_client(settings) as client:
        with locked(db):
            r = await client.post(
                "/v1/chat/completions",
                json={"model": "gpt-4o-mini", "messages": QUESTION},
                headers={"x-frugal-route": "api"},
            )
            assert r.status_code == 200
            health = await ledger_health_once(client, "write_retries")
            assert health["write_retries"] >= 1 and health["retrying"] == 1
            assert (health["rows_written"], health["rows_dropped"], health["pending"]) == (0, 0, 1)
            assert (health["state"], health["last_error"]) == ("degraded", "OperationalError")
            assert health["max_queue"] == 100_000 and health["rows_rejected"] == 0
            assert health["usage_invalid"] == 0 and health["path"] == str(db)
        health = await ledger_health_once(client, "rows_written")
        assert (health["rows_written"], health["retrying"], health["state"]) == (1, 0, "ok")
    assert len(ledger_rows(db)) == 1


# -- a real server under load --------------------------------------------------------------------


@pytest.mark.serve
async def test_under_32_concurrent_clients_every_request_is_a_row(
    tmp_path: Path, fake_api: FakeAPI
) -> None:
    from tests.server.test_serve import start_server, stop_server

    served = await asyncio.to_thread(start_server, tmp_path, fake_api)
    try:
        load = Load(served.base)
        running = asyncio.create_task(load.run(seconds=None))
        try:
            # At least 5 s and more than 100 answers: a busy machine takes longer to send them.
            await asyncio.gather(asyncio.sleep(5), load.answered(101))
        finally:
            load.stop.set()
            await running
    finally:
        code = await asyncio.to_thread(stop_server, served)
    assert code == 0
    assert load.errors == 0 and len(load.sent) == len(load.completed) > 100
    rows = ledger_rows(served.db)
    assert len(rows) == len(load.sent)
    assert {r["request_id"] for r in rows} == {rid for rid, _ in load.completed}


@pytest.mark.serve
async def test_after_kill_9_every_response_older_than_a_second_is_in_the_ledger(
    tmp_path: Path, fake_api: FakeAPI
) -> None:
    from tests.server.test_serve import start_server

    served = await asyncio.to_thread(start_server, tmp_path, fake_api)
    engine_pid = served.health()["engine"]["pid"]
    load = Load(served.base)
    running = asyncio.create_task(load.run(seconds=None))
    try:
        # At least 3 s and more than 100 answers before the kill: a busy machine needs longer.
        await asyncio.gather(asyncio.sleep(3), load.answered(101))
    finally:
        killed_at = time.time()
        os.kill(served.proc.pid, signal.SIGKILL)
        load.stop.set()
        await running
    served.proc.wait(timeout=CEILING_S)
    # the engine worker ends with its parent
    assert not await outlived(engine_pid, scaled(10)), "the engine worker outlived the server"
    stored = {r["request_id"] for r in ledger_rows(served.db)}
    done = [(rid, at) for rid, at in load.completed if at <= killed_at]
    missing_ages = [killed_at - at for rid, at in done if rid not in stored]
    bound_s = scaled(1.0)  # the flush's second, scaled to the machine's load
    print(f"kill -9: {len(done)} answers, {len(missing_ages)} not in the ledger, bound {bound_s} s")
    assert len(done) > 100
    assert all(age < bound_s for age in missing_ages), sorted(missing_ages)[-5:]
