"""The audits table: 0007 runs through the ledger's own migrate(), rows go in and come back."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from proxy.ledger.audits.audit_record import AuditRecord, insert, month_spend_pusd, read
from proxy.ledger.db.migrate import migrate


@pytest.fixture
def conn(tmp_path: Path) -> Iterator[sqlite3.Connection]:
    db = sqlite3.connect(tmp_path / "ledger.db", isolation_level=None)
    assert "0007_audits.sql" in migrate(db)
    yield db
    db.close()


def audit(**values: object) -> AuditRecord:
    base: dict[str, object] = {
        "request_id": "req-1",
        "ts": 1_000.0,
        "requested_model": "gpt-4o-mini",
        "task_kind": "math",
        "local_model": "sha256:abc",
        "features": {"confidence": 0.5, "kind_math": 1.0},
        "score": 0.7,
        "threshold": 0.6,
        "accepted": True,
        "verdict": True,
        "method": "judge",
        "correctness": "strict",
        "judge_model": "gpt-4o",
        "cost_pusd": 1_500_000,
        "weight": 50.0,
        "prompt": '[{"role": "user", "content": "2+2?"}]',
        "reference": "4",
        "candidate": "4.",
        "judge_reason": "same number",
    }
    base.update(values)
    return AuditRecord(**base)  # type: ignore[arg-type]


def test_the_migration_makes_the_table_and_its_month_indexes(conn: sqlite3.Connection) -> None:
    columns = {r[1] for r in conn.execute("PRAGMA table_info(audits)")}
    assert set(audit().row(log_content=True)) <= columns
    indexes = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='index'")}
    assert {"audits_ts", "audits_model_ts", "audits_local_model"} <= indexes
    plan = " ".join(
        str(r[-1])
        for r in conn.execute("EXPLAIN QUERY PLAN SELECT * FROM audits WHERE ts >= 0 AND ts < 9")
    )
    assert "audits_ts" in plan
    assert migrate(conn) == []


def test_without_content_logging_no_text_is_stored(conn: sqlite3.Connection) -> None:
    insert(conn, [audit()], log_content=False)
    row = conn.execute("SELECT prompt, reference, candidate, judge_reason FROM audits").fetchone()
    assert row == (None, None, None, None)
    (back,) = read(conn, since=0, until=2_000)
    assert back == audit(prompt=None, reference=None, candidate=None, judge_reason=None)


def test_with_content_logging_a_row_comes_back_whole(conn: sqlite3.Connection) -> None:
    failed = audit(request_id="req-2", ts=1_001.0, verdict=None, error="timeout", cost_pusd=0)
    insert(conn, [audit(), failed], log_content=True)
    assert read(conn, since=0, until=2_000) == [audit(), failed]
    assert conn.execute("SELECT verdict, accepted FROM audits ORDER BY id").fetchall() == [
        (1, 1),
        (None, 1),
    ]


def test_reading_selects_the_period_and_the_local_model(conn: sqlite3.Connection) -> None:
    insert(
        conn,
        [audit(ts=10.0), audit(ts=20.0, local_model="sha256:other"), audit(ts=30.0)],
        log_content=False,
    )
    assert [a.ts for a in read(conn, since=10.0, until=30.0)] == [10.0, 20.0]
    assert [a.ts for a in read(conn, since=0, until=99, local_model="sha256:abc")] == [10.0, 30.0]
    assert month_spend_pusd(conn, since=0, until=25.0) == 3_000_000
    assert month_spend_pusd(conn, since=100, until=200) == 0


@pytest.mark.parametrize(
    "bad",
    [
        {"verdict": 2},
        {"method": "vibes"},
        {"correctness": "lenient"},
        {"cost_pusd": -1},
        {"weight": 0.5},
        {"accepted": None},
    ],
)
def test_the_table_refuses_impossible_values(
    conn: sqlite3.Connection, bad: dict[str, object]
) -> None:
    row = audit().row(log_content=False) | bad
    columns = ", ".join(row)
    marks = ", ".join(":" + c for c in row)
    with pytest.raises(sqlite3.IntegrityError):
        conn.execute(f"INSERT INTO audits ({columns}) VALUES ({marks})", row)
