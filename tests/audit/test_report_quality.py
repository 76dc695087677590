"""``frugal report``'s quality section on a seeded ledger: the real CLI, a real SQLite file with
request rows and audit rows, the exact JSON and the table; and audit rows written through the
ledger's one writer on both backends."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from proxy import cli
from proxy.ledger.audits.audit_record import AuditRecord, insert
from proxy.ledger.audits.estimate import wilson
from proxy.ledger.audits.table import read_rows, spend_pusd
from proxy.ledger.db import access
from proxy.ledger.db.location import Database, parse
from proxy.ledger.writing.writer import Ledger
from tests import pg
from tests.ledger.test_report import october_ledger


def at(when: str) -> float:
    return datetime.strptime(when, "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC).timestamp()


def audit(when: str, *, accepted: bool, verdict: bool | None, **extra: Any) -> AuditRecord:
    return AuditRecord(accepted=accepted, verdict=verdict, ts=at(when), **extra)


# 10 accepted (8 right, 1 wrong, 1 failed) and 4 rejected (1 right); two kinds; $0.25 of audits.
AUDITS = [
    *(
        audit(
            "2026-10-05 10:00:00",
            accepted=True,
            verdict=True,
            task_kind="math",
            requested_model="gpt-4o",
            cost_pusd=25_000_000_000,
            score=0.9,
        )
        for _ in range(8)
    ),
    audit("2026-10-06 10:00:00", accepted=True, verdict=False, task_kind="json", score=0.7),
    audit("2026-10-06 11:00:00", accepted=True, verdict=None, task_kind="json", error="judge_x"),
    audit("2026-10-07 10:00:00", accepted=False, verdict=True, task_kind="json", score=0.2),
    *(
        audit("2026-10-07 11:00:00", accepted=False, verdict=False, task_kind="json", score=0.1)
        for _ in range(3)
    ),
    # September's audit is not October's.
    audit("2026-09-30 23:00:00", accepted=True, verdict=False, cost_pusd=10**12),
]


@pytest.fixture
def ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    db = october_ledger(tmp_path, monkeypatch)
    conn = sqlite3.connect(db)
    with conn:
        insert(conn, AUDITS, log_content=False)
    conn.close()
    return db


def report(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any]]:
    code = cli.main(["report", "--month", "2026-10", "--format", "json", *args])
    out, _ = capsys.readouterr()
    return code, json.loads(out, parse_float=Decimal)


def test_the_quality_keys_say_what_the_audits_found(
    ledger: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, data = report(capsys)
    assert code == 0
    assert data["audits"] == 14 and data["audits_failed"] == 1
    low, high = wilson(8 / 9, 9)
    assert float(data["audited_precision"]) == pytest.approx(8 / 9, abs=1e-4)
    assert [float(x) for x in data["audited_precision_ci"]] == pytest.approx([low, high], abs=1e-4)
    assert float(data["rejected_but_correct_share"]) == 0.25
    assert float(data["acceptance_rate"]) == pytest.approx(10 / 14, abs=1e-4)
    # Audits are money paid: in the API cost, out of the savings (the seeded rows alone paid
    # $1.80 and saved $3.25).
    assert data["audit_cost_usd"] == Decimal("0.200000")
    assert data["api_cost_usd"] == Decimal("2.000000")
    assert data["saved_usd"] == Decimal("3.050000")
    assert data["threshold_in_force"] == Decimal("0.6")
    assert data["threshold_source"] == "configured"


def test_by_kind_groups_the_quality_section(
    ledger: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, data = report(capsys, "--by", "kind")
    assert code == 0 and data["by"] == "kind" and "groups" not in data
    groups = {g["kind"]: g for g in data["quality_groups"]}
    assert set(groups) == {"json", "math"}
    assert groups["math"]["audits"] == 8 and float(groups["math"]["audited_precision"]) == 1.0
    assert groups["json"]["audits"] == 6 and float(groups["json"]["audited_precision"]) == 0.0
    assert float(groups["json"]["rejected_but_correct_share"]) == 0.25


def test_the_table_has_a_quality_section(ledger: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["report", "--month", "2026-10", "--by", "kind"]) == 0
    out, _ = capsys.readouterr()
    lines = {line.split("│")[1].strip(): line for line in out.splitlines() if "│" in line}
    assert lines["Audits"].endswith("14 (1 without a verdict) │")
    assert "88.9% (95%: " in lines["Audited precision (accepted)"]
    assert "$0.2000" in lines["Audit spend (in Paid)"]
    assert "Audited precision" in lines["Kind"] and "100.0%" in lines["math"]


def test_a_target_the_audits_cannot_reach_is_said_plainly(
    ledger: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = (ledger.parent / "frugal.toml").read_text() + "\n[quality]\ntarget_precision = 0.9\n"
    (ledger.parent / "frugal.toml").write_text(text)
    code, data = report(capsys)
    assert code == 0
    # 13 audits with a verdict, fewer than the 30 a choice needs: the configured threshold.
    assert data["threshold_source"] == "configured"
    assert "13 of the 30 audits" in data["threshold_why"]
    assert float(data["target_precision"]) == 0.9


@pytest.fixture(params=["sqlite", "postgresql"])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Database]:
    if request.param == "sqlite":
        yield parse(str(tmp_path / "ledger.db"))
        return
    with pg.running() as server:
        if server is None:
            pytest.skip("PostgreSQL is not installed")
        yield parse(server.database(), spill_base=str(tmp_path / "ledger"))


async def test_audit_rows_go_through_the_one_writer_on_both_backends(database: Database) -> None:
    ledger = Ledger(database, flush_interval_s=0.02)
    await ledger.start()
    for i, record in enumerate(AUDITS):
        row = {**record.row(log_content=False), "request_id": f"r{i}"}
        ledger.record_audit(row)
    assert await ledger.flush(10)
    assert ledger.health()["audits_written"] == len(AUDITS)
    await ledger.close()
    with access.connect(database) as conn:
        rows = read_rows(conn, since=at("2026-10-01 00:00:00"), until=at("2026-11-01 00:00:00"))
        spent = spend_pusd(conn, since=at("2026-10-01 00:00:00"), until=at("2026-11-01 00:00:00"))
        newest = read_rows(conn, since=0, until=at("2027-01-01 00:00:00"), limit=2)
    assert len(rows) == 14 and spent == 8 * 25_000_000_000
    assert [r["request_id"] for r in newest] == ["r12", "r13"]
    assert "candidate" not in rows[0]  # the readers never read text
