"""The ledger on both backends, SQLite and a real PostgreSQL: migrations from empty and from
every earlier version, the writer, the rollup, keys, the report, ``frugal migrate``, and a
PostgreSQL server that is down at start or goes away while rows are being written."""

from __future__ import annotations

import asyncio
import json
import random
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from proxy import cli
from proxy.errors import ConfigError
from proxy.ledger.db import access, migrate
from proxy.ledger.db.location import Database, parse
from proxy.ledger.pricing import PICO
from proxy.ledger.reports.build import Period, build
from proxy.ledger.tenants import keys
from proxy.ledger.writing.writer import Ledger, LedgerRow
from tests import pg
from tests.loopback import free_port

NAMES = [name for name, _ in migrate.migration_files()]
OCT = Period.month("2026-10")


def row(request_id: str, **extra: Any) -> LedgerRow:
    base: dict[str, Any] = {
        "request_id": request_id,
        "ts": 1_791_000_000.0 + random.random() * 86400 * 3,  # October 2026
        "requested_model": "gpt-4o-mini",
        "api_model": "gpt-4o-mini",
        "route": "api",
        "reason": "low_quality",
        "status": 200,
        "stream": False,
        "prompt_tokens": 120,
        "completion_tokens": 30,
        "latency_ms": 12.5,
        "local_ms": 4.0,
        "key_name": "alice",
    }
    return LedgerRow(**{**base, **extra})


def rows_of(db: Database, columns: str = "*") -> list[tuple[Any, ...]]:
    with access.connect(db) as conn:
        return conn.query(f"SELECT {columns} FROM requests ORDER BY id")


def rollup_matches_rows(db: Database) -> int:
    """The rollup equals a GROUP BY over the rows; returns the number of rollup rows."""
    with access.connect(db) as conn:
        rollup = conn.query(
            "SELECT day, model, key_name, reason, route, failed, requests, api_cost_pusd, "
            "counterfactual_cost_pusd, uncosted, taxed FROM requests_daily "
            "ORDER BY day, model, key_name, reason, route, failed"
        )
        day = "floor(ts / 86400)::bigint" if db.is_postgres else "CAST(ts / 86400 AS INTEGER)"
        raw = conn.query(
            f"SELECT {day}, COALESCE(requested_model, ''), "
            "COALESCE(key_name, ''), reason, route, CASE WHEN status >= 400 THEN 1 ELSE 0 END, "
            "count(*), COALESCE(sum(api_cost_pusd), 0), "
            "COALESCE(sum(counterfactual_cost_pusd), 0), "
            "sum(CASE WHEN status < 400 AND counterfactual_cost_pusd IS NULL THEN 1 ELSE 0 END), "
            "sum(CASE WHEN latency_tax_ms > 0 THEN 1 ELSE 0 END) FROM requests "
            "GROUP BY 1, 2, 3, 4, 5, 6 ORDER BY 1, 2, 3, 4, 5, 6"
        )
    assert [tuple(map(_plain, r)) for r in rollup] == [tuple(map(_plain, r)) for r in raw]
    return len(rollup)


def _plain(value: Any) -> Any:
    return int(value) if isinstance(value, Decimal) else value


# -- migrations ---------------------------------------------------------------------------------


def test_both_backends_have_the_same_migrations() -> None:
    assert [n for n, _ in migrate.migration_files("postgresql")] == NAMES


def test_migrating_from_empty_applies_every_migration(database: Database) -> None:
    assert migrate.open_database(database) == NAMES
    assert migrate.open_database(database) == []
    assert migrate.schema_state(database) == (sorted(NAMES), [])


@pytest.mark.parametrize("upto", NAMES[:-1])
def test_upgrading_from_every_earlier_version_keeps_the_rows_and_the_rollup(
    database: Database, upto: str
) -> None:
    """A database left at ``upto`` with rows in it, upgraded by a newer proxy."""
    with access.connect(database) as conn:
        if database.is_postgres:
            migrate.migrate_postgres(conn.raw, upto=upto)
        else:
            migrate.migrate(conn.raw, upto=upto)
        for n in range(20):
            conn.execute(
                "INSERT INTO requests (request_id, ts, endpoint, route, reason, status, "
                "latency_ms, requested_model, api_cost_pusd, counterfactual_cost_pusd) "
                "VALUES (?, ?, 'chat.completions', ?, 'accepted', 200, 1.0, 'm', ?, ?)",
                (f"r{n}", 1_791_000_000.0 + n * 3600, "api" if n % 2 else "local", n, 2 * n),
            )
    assert migrate.schema_state(database)[1] == [n for n in NAMES if n > upto]
    migrate.open_database(database)
    assert migrate.schema_state(database)[1] == []
    assert len(rows_of(database)) == 20
    assert rollup_matches_rows(database) > 0


# -- the writer ---------------------------------------------------------------------------------


async def test_rows_are_written_with_their_costs_and_the_rollup_follows(
    database: Database,
) -> None:
    ledger = Ledger(database, flush_interval_s=0.02, batch_size=64)
    await ledger.start()
    for n in range(300):
        ledger.record(row(f"req-{n}", status=500 if n % 50 == 0 else 200))
    assert await ledger.flush(10.0)
    await ledger.close()
    stored = rows_of(database, "request_id, api_cost_pusd, stream, token_source")
    assert [r[0] for r in stored] == [f"req-{n}" for n in range(300)]
    assert all(r[1] is not None and r[1] > 0 and r[2] == 0 for r in stored)
    assert {r[3] for r in stored} == {"usage"}
    assert ledger.health()["rows_written"] == 300
    assert rollup_matches_rows(database) >= 2


async def test_two_writers_on_one_database_get_unique_ids_and_one_report(
    database: Database,
) -> None:
    """Two replicas: each its own writer and batches, every row once, one report."""
    if not database.is_postgres:
        pytest.skip("replicas share a PostgreSQL ledger; a SQLite file has one writer")
    first, second = (Ledger(database, flush_interval_s=0.01, batch_size=16) for _ in range(2))
    await first.start()
    await second.start()
    for n in range(400):
        (first if n % 2 else second).record(row(f"req-{n}", ts=1_791_100_000.0 + n))
    await asyncio.gather(first.close(), second.close())
    ids = [r[0] for r in rows_of(database, "id")]
    assert len(ids) == len(set(ids)) == 400
    report = build(database, OCT, 0)
    assert report["requests"] == 400
    rollup_matches_rows(database)


async def test_a_late_count_updates_its_row_on_both_backends(database: Database) -> None:
    from concurrent.futures import Future

    from proxy.ledger.writing.tokens import TokenCounter

    ledger = Ledger(database, flush_interval_s=0.02, counter=TokenCounter())
    await ledger.start()
    pending: Future[tuple[int, int]] = Future()
    ledger.counter.submit = lambda job: pending  # type: ignore[method-assign]
    ledger.record(row("late", route="local", reason="accepted"), count=object())  # type: ignore[arg-type]
    assert await ledger.flush(5.0)
    assert rows_of(database, "token_source")[0][0] == "local"
    pending.set_result((500, 40))
    deadline = time.monotonic() + 10
    while rows_of(database, "token_source")[0][0] != "tokenizer":
        assert time.monotonic() < deadline
        await asyncio.sleep(0.02)
    await ledger.close()
    assert rows_of(database, "counterfactual_prompt_tokens")[0][0] == 500
    rollup_matches_rows(database)


# -- keys ---------------------------------------------------------------------------------------


def test_keys_are_created_listed_and_revoked(database: Database) -> None:
    key = keys.create(database, "alice")
    with pytest.raises(keys.KeyCommandError, match="exists already"):
        keys.create(database, "alice")
    active, ever = keys.load_active(database)
    assert [k.name for k in active] == ["alice"] and active[0].digest == keys.digest(key)
    assert keys.stored_count(database) == 1
    keys.revoke(database, "alice")
    assert keys.load_active(database) == ([], 1)
    assert [r["name"] for r in keys.listing(database)] == ["alice"]
    with pytest.raises(keys.KeyCommandError, match="no usable key"):
        keys.revoke(database, "alice")


def test_frugal_keys_and_report_and_migrate_take_a_url(
    database: Database, capsys: pytest.CaptureFixture[str]
) -> None:
    url = database.url or f"sqlite:///{database.path}"
    assert cli.main(["migrate", "--db", url]) == 0
    assert "applied 0001_ledger" in capsys.readouterr().err
    assert cli.main(["migrate", "--db", url]) == 0
    assert "up to date" in capsys.readouterr().err
    assert cli.main(["keys", "create", "ci", "--db", url]) == 0
    assert capsys.readouterr().out.startswith(keys.KEY_PREFIX)
    assert cli.main(["keys", "list", "--db", url, "--format", "json"]) == 0
    assert [r["name"] for r in json.loads(capsys.readouterr().out)] == ["ci"]
    assert cli.main(["report", "--db", url, "--month", "2026-10", "--format", "json"]) == 4
    assert json.loads(capsys.readouterr().out)["requests"] == 0


# -- the report ---------------------------------------------------------------------------------


async def test_the_report_is_the_same_on_both_backends(database: Database, tmp_path: Path) -> None:
    rng = random.Random(7)
    rows = [
        row(
            f"r{n}",
            ts=1_791_000_000.0 + rng.randrange(0, 86400 * 5),
            route=rng.choice(["api", "local"]),
            reason=rng.choice(["accepted", "low_quality", "forced"]),
            key_name=rng.choice(["alice", "bob", None]),
            local_ms=rng.choice([0.0, 250.0]),
            status=rng.choice([200, 200, 200, 502]),
            deferred_tier=rng.choice([None, None, "flex"]),  # deferred work, reported apart
        )
        for n in range(500)
    ]
    reference = parse(str(tmp_path / "reference.db"))
    for target in (database, reference):
        ledger = Ledger(target, flush_interval_s=0.01, batch_size=128)
        await ledger.start()
        for r in rows:
            ledger.record(r)
        await ledger.close()
    for by in (None, "model", "day", "key", "reason"):
        mine = build(database, OCT, 40, by=by, now=OCT.end)
        theirs = build(reference, OCT, 40, by=by, now=OCT.end)
        assert mine == theirs
    assert build(database, OCT, 0)["requests"] == 500
    total = build(database, OCT, 0)
    assert isinstance(total["saved_usd"], Decimal)
    assert 0 < total["deferred"]["requests"] < 500 and total["deferred"]["tiers"].keys() == {"flex"}
    with access.connect(database) as conn:
        ((paid,),) = conn.query("SELECT sum(api_cost_pusd) FROM requests")
    assert total["api_cost_usd"] == (Decimal(int(paid)) / PICO).quantize(Decimal("0.000001"))


# -- PostgreSQL faults --------------------------------------------------------------------------


def test_a_url_with_a_password_is_refused_naming_password_env() -> None:
    with pytest.raises(ConfigError) as info:
        parse("postgresql://frugal:hunter2-secret@db.internal/frugal")
    assert "password_env" in str(info.value) and "hunter2" not in str(info.value)


def test_postgres_down_at_start_is_a_clear_error_without_the_password(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.setenv("FRUGAL_TEST_DB_PASSWORD", "s3cr3t-pw-0042")
    port = free_port()  # nothing listens there
    config = tmp_path / "frugal.toml"
    config.write_text(
        f'[ledger]\npath = "{tmp_path / "x.db"}"\n'
        f'url = "postgresql://frugal@127.0.0.1:{port}/frugal"\n'
        'password_env = "FRUGAL_TEST_DB_PASSWORD"\n'
    )
    assert cli.main(["migrate", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert "connecting failed" in err and "is PostgreSQL running" in err
    assert "s3cr3t" not in err


async def test_rows_are_held_while_postgres_is_away_and_written_when_it_returns(
    tmp_path: Path,
) -> None:
    """A server of its own, stopped and started again under the writer."""
    with pg.running() as server:
        if server is None:
            pytest.skip("PostgreSQL is not installed")
        db = parse(server.database(), spill_base=str(tmp_path / "ledger"))
        ledger = Ledger(db, flush_interval_s=0.02, max_queue=1000)
        await ledger.start()
        ledger.record(row("before"))
        assert await ledger.flush(5.0)
        server.stop()
        for n in range(50):
            ledger.record(row(f"away-{n}"))
        deadline = time.monotonic() + 20
        while ledger.health()["state"] != "degraded":
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
        health = ledger.health()
        assert health["pending"] == 50 and "cannot write to the database" in health["reason"]
        server.start()
        assert await ledger.flush(20.0)
        await ledger.close()
        assert [r[0] for r in rows_of(db, "request_id")] == ["before"] + [
            f"away-{n}" for n in range(50)
        ]
        assert ledger.health()["reason"] is None and ledger.health()["rows_spilled"] == 0
