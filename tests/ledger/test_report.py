"""``frugal report``: the real CLI against a real SQLite ledger seeded in tmp_path, exact output."""

from __future__ import annotations

import csv
import io
import json
import os
import random
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from proxy import cli
from proxy.ledger.db.migrate import migrate, open_database
from proxy.ledger.reports.build import KeyScope, Period, build, fixed_cost_pico

FRUGAL = str(Path(sys.executable).with_name("frugal"))
PICO = 10**12


def loads(text: str) -> Any:
    """The report's JSON, its money (six decimals) read as exact Decimals, other numbers as
    floats."""
    return json.loads(
        text, parse_float=lambda t: Decimal(t) if len(t.partition(".")[2]) == 6 else float(t)
    )


def ts(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


def row(when: str, route: str, reason: str, model: str, **extra: Any) -> dict[str, Any]:
    return {
        "request_id": f"{when}-{model}-{reason}",
        "ts": ts(when),
        "endpoint": "chat.completions",
        "requested_model": model,
        "api_model": model,
        "route": route,
        "reason": reason,
        "status": 200,
        "latency_ms": 100.0,
        "local_ms": 0.0,
        "latency_tax_ms": 0.0,
        "api_cost_pusd": 0,
        **extra,
    }


# October 2026: five answered requests, one failed, one unpriced; two rows just outside.
OCTOBER = [
    row("2026-10-01 10:00:00", "local", "accepted", "gpt-4o-mini",
        counterfactual_cost_pusd=1_250_000_000_000, key_name="ci"),
    row("2026-10-01 11:00:00", "api", "low_quality", "gpt-4o-mini", local_ms=800.0,
        latency_tax_ms=800.0, api_cost_pusd=300_000_000_000,
        counterfactual_cost_pusd=300_000_000_000, key_name="ci"),
    row("2026-10-02 09:30:00", "local", "accepted", "gpt-4o",
        counterfactual_cost_pusd=2_000_000_000_000, key_name="alice"),
    row("2026-10-02 23:59:59", "api", "local_timeout", "gpt-4o", local_ms=30_000.0,
        latency_tax_ms=30_000.0, api_cost_pusd=1_500_000_000_000,
        counterfactual_cost_pusd=1_500_000_000_000, key_name="alice"),
    row("2026-10-03 00:00:00", "none", "bad_request", "gpt-4o", status=400,
        api_cost_pusd=None, counterfactual_cost_pusd=None),
    row("2026-10-03 12:00:00", "local", "accepted", "my-finetune",
        counterfactual_cost_pusd=None, counterfactual_prompt_tokens=12,
        counterfactual_completion_tokens=3),
    row("2026-09-30 23:59:59", "api", "forced", "gpt-4o", api_cost_pusd=9 * PICO,
        counterfactual_cost_pusd=9 * PICO),
    row("2026-11-01 00:00:00", "api", "forced", "gpt-4o", api_cost_pusd=9 * PICO,
        counterfactual_cost_pusd=9 * PICO),
]  # fmt: skip


def seed(db: Path, rows: list[dict[str, Any]], *, upto: str | None = None) -> None:
    """A ledger with ``rows``, at the latest version or (``upto``) at an earlier one."""
    if upto is None:
        open_database(str(db))
    else:
        old = sqlite3.connect(db, isolation_level=None)
        migrate(old, upto=upto)
        old.close()
    conn = sqlite3.connect(db)
    with conn:
        for r in rows:
            names = list(r)
            conn.execute(
                f"INSERT INTO requests ({', '.join(names)}) "
                f"VALUES ({', '.join('?' for _ in names)})",
                [r[n] for n in names],
            )
    conn.close()


def october_ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``tmp_path/ledger.db`` seeded with :data:`OCTOBER`, in the working folder with a
    ``frugal.toml`` that names it (and $40 a month of fixed costs)."""
    monkeypatch.delenv("FRUGAL_CONFIG", raising=False)
    monkeypatch.chdir(tmp_path)
    db = tmp_path / "ledger.db"
    seed(db, OCTOBER)
    (tmp_path / "frugal.toml").write_text(
        f'[ledger]\npath = "{db}"\n\n[costs]\nmonthly_fixed_usd = 40\n'
    )
    return db


@pytest.fixture
def ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return october_ledger(tmp_path, monkeypatch)


def report(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = cli.main(["report", *args])
    out, err = capsys.readouterr()
    return code, out, err


# -- the table and the other formats --------------------------------------------------------------


MONTH_TABLE = """\
frugal report: 2026-10 (2026-10-01 to 2026-10-31, UTC)
┌─────────┬──────────┬───────┬─────────────┬────────────┬───────────────┬─────────┬────────┐
│ Period  │ Requests │ Local │ Local share │ Paid (API) │ Without proxy │   Saved │    Tax │
├─────────┼──────────┼───────┼─────────────┼────────────┼───────────────┼─────────┼────────┤
│ 2026-10 │        6 │     3 │       60.0% │    $1.8000 │       $5.0500 │ $3.2500 │ 30.8 s │
└─────────┴──────────┴───────┴─────────────┴────────────┴───────────────┴─────────┴────────┘
┌─────────────────────┬───────────────────────────────────────────┐
│ Without the proxy   │                                   $5.0500 │
│ Paid to the API     │                                   $1.8000 │
│ Saved               │                                   $3.2500 │
│ Fixed cost (server) │                                  $40.0000 │
│ Net saved           │                                 -$36.7500 │
│ Local share         │                                     60.0% │
│ Latency tax         │ 30.8 s on 2 requests (40.0%), p95 30.00 s │
│ Failed requests     │                                         1 │
│ Not costed          │                  1 request (see warnings) │
└─────────────────────┴───────────────────────────────────────────┘
warning: 1 request for 'my-finetune' not costed: no known price. Add [pricing."my-finetune"] \
to the config to price new requests.
"""


def test_month_table(ledger: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = report(capsys, "--month", "2026-10")
    assert (code, err) == (0, "")
    assert out == MONTH_TABLE


def test_month_json_keeps_the_documented_keys(
    ledger: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = report(capsys, "--month", "2026-10", "--format", "json")
    assert code == 0
    # Money is a JSON number written exactly, never a string: jq's `.saved_usd > 3` works.
    assert '"saved_usd": 3.250000,' in out and '"net_saved_usd": -36.750000,' in out
    assert json.loads(out)["saved_usd"] > 3
    assert loads(out) == {
        "month": "2026-10",
        "from": "2026-10-01",
        "to": "2026-10-31",
        "requests": 6,
        "local_requests": 3,
        "api_requests": 2,
        "failed_requests": 1,
        "unpriced_requests": 1,
        "local_share": 0.6,
        "api_cost_usd": Decimal("1.800000"),
        "counterfactual_cost_usd": Decimal("5.050000"),
        "saved_usd": Decimal("3.250000"),
        "fixed_cost_usd": Decimal("40.000000"),
        "net_saved_usd": Decimal("-36.750000"),
        "latency_tax_s": 30.8,
        "latency_tax_requests": 2,
        "latency_tax_share": 0.4,
        "latency_tax_p95_s": 30.0,
        "reasons": {"accepted": 3, "bad_request": 1, "local_timeout": 1, "low_quality": 1},
        "warnings": [
            "1 request for 'my-finetune' not costed: no known price. "
            'Add [pricing."my-finetune"] to the config to price new requests.'
        ],
        # The quality section (issue 17): no audit in this ledger.
        "audit_cost_usd": Decimal("0.000000"),
        "audits": 0,
        "audits_failed": 0,
        "audited_precision": None,
        "audited_precision_ci": [0.0, 1.0],
        "acceptance_rate": None,
        "rejected_but_correct_share": None,
        "target_precision": None,
        "threshold_in_force": 0.6,
        "threshold_source": "configured",
        "threshold_why": "the configured threshold 0.6 (no target precision set)",
        # Deferred work apart (issue 41): none in this ledger.
        "deferred": {
            "requests": 0,
            "local_requests": 0,
            "api_requests": 0,
            "failed_requests": 0,
            "unpriced_requests": 0,
            "local_share": 0.0,
            "api_cost_usd": Decimal("0.000000"),
            "counterfactual_cost_usd": Decimal("0.000000"),
            "saved_usd": Decimal("0.000000"),
            "latency_tax_s": 0.0,
            "latency_tax_requests": 0,
            "latency_tax_share": 0.0,
            "tiers": {},
        },
    }


def test_deferred_work_is_reported_apart_in_text_and_json(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # October's rows and three flex requests (issue 41): one answered locally, one by the API
    # (priced at the flex rate by the proxy: the row holds what it was charged), one failed.
    db = october_ledger(tmp_path, monkeypatch)
    flex = [
        row("2026-10-04 08:00:00", "local", "accepted", "gpt-4o-mini", deferred_tier="flex",
            service_tier="flex", counterfactual_cost_pusd=625_000_000_000, key_name="ci"),
        row("2026-10-04 09:00:00", "api", "low_quality", "gpt-4o-mini", deferred_tier="flex",
            service_tier="flex", api_cost_pusd=150_000_000_000, local_ms=400.0,
            latency_tax_ms=400.0, counterfactual_cost_pusd=150_000_000_000, key_name="alice"),
        row("2026-10-04 10:00:00", "none", "bad_request", "gpt-4o-mini", deferred_tier="flex",
            status=400, counterfactual_cost_pusd=None),
        row("2026-11-04 10:00:00", "local", "accepted", "gpt-4o-mini", deferred_tier="flex",
            counterfactual_cost_pusd=PICO),  # another month
    ]  # fmt: skip
    seed(db, flex)
    code, out, _ = report(capsys, "--month", "2026-10", "--format", "json")
    data = loads(out)
    assert code == 0 and data["requests"] == 9  # a part of the totals, not added to them
    assert data["deferred"] == {
        "requests": 3,
        "local_requests": 1,
        "api_requests": 1,
        "failed_requests": 1,
        "unpriced_requests": 0,
        "local_share": 0.5,
        "api_cost_usd": Decimal("0.150000"),
        "counterfactual_cost_usd": Decimal("0.775000"),
        "saved_usd": Decimal("0.625000"),
        "latency_tax_s": 0.4,
        "latency_tax_requests": 1,
        "latency_tax_share": 0.5,
        "tiers": {"flex": 3},
    }
    code, out, _ = report(capsys, "--month", "2026-10")
    [line] = [line for line in out.splitlines() if "Deferred work" in line]
    assert code == 0
    assert "3 requests (flex 3), 50.0% local, paid $0.1500, saved $0.6250 of $0.7750" in line
    # One key's view counts its own deferred work only.
    mine = build(str(db), Period.month("2026-10"), 0, only=KeyScope("alice"))["deferred"]
    assert (mine["requests"], mine["api_requests"], mine["tiers"]) == (1, 1, {"flex": 1})


def test_by_model_table(ledger: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = report(capsys, "--month", "2026-10", "--by", "model")
    assert code == 0
    table = out.split("┘\n", 1)[0] + "┘"
    assert (
        table
        == """\
frugal report: 2026-10 (2026-10-01 to 2026-10-31, UTC)
┌─────────────┬──────────┬───────┬─────────────┬────────────┬───────────────┬─────────┬────────┐
│ Model       │ Requests │ Local │ Local share │ Paid (API) │ Without proxy │   Saved │    Tax │
├─────────────┼──────────┼───────┼─────────────┼────────────┼───────────────┼─────────┼────────┤
│ gpt-4o      │        3 │     1 │       50.0% │    $1.5000 │       $3.5000 │ $2.0000 │ 30.0 s │
│ gpt-4o-mini │        2 │     1 │       50.0% │    $0.3000 │       $1.5500 │ $1.2500 │  0.8 s │
│ my-finetune │        1 │     1 │      100.0% │    $0.0000 │       $0.0000 │ $0.0000 │  0.0 s │
├─────────────┼──────────┼───────┼─────────────┼────────────┼───────────────┼─────────┼────────┤
│ Total       │        6 │     3 │       60.0% │    $1.8000 │       $5.0500 │ $3.2500 │ 30.8 s │
└─────────────┴──────────┴───────┴─────────────┴────────────┴───────────────┴─────────┴────────┘"""
    )


def test_by_day_lists_every_day_with_its_share_of_the_fixed_cost(
    ledger: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = report(capsys, "--month", "2026-10", "--by", "day", "--format", "json")
    data = loads(out)
    assert code == 0 and len(data["groups"]) == 31
    first, second, third, last = (
        data["groups"][0],
        data["groups"][1],
        data["groups"][2],
        data["groups"][-1],
    )
    assert (first["day"], first["requests"], first["saved_usd"]) == (
        "2026-10-01",
        2,
        Decimal("1.250000"),
    )
    assert (second["day"], second["requests"], second["saved_usd"]) == (
        "2026-10-02",
        2,
        Decimal("2.000000"),
    )
    assert (third["requests"], third["failed_requests"], third["unpriced_requests"]) == (2, 1, 1)
    assert (last["day"], last["requests"]) == ("2026-10-31", 0)
    # 40 USD over 31 days: 1.290323 a day, net of it each day.
    assert {g["fixed_cost_usd"] for g in data["groups"]} == {Decimal("1.290323")}
    assert first["net_saved_usd"] == Decimal("-0.040323")
    assert last["net_saved_usd"] == Decimal("-1.290323")


def test_by_reason_and_by_key(ledger: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = report(capsys, "--month", "2026-10", "--by", "reason", "--format", "json")
    groups = {g["reason"]: g["requests"] for g in loads(out)["groups"]}
    assert groups == {"accepted": 3, "bad_request": 1, "local_timeout": 1, "low_quality": 1}
    _, out, _ = report(capsys, "--month", "2026-10", "--by", "key", "--format", "json")
    keys = {g["key"]: (g["requests"], g["saved_usd"]) for g in loads(out)["groups"]}
    assert keys == {
        "alice": (2, Decimal("2.000000")),
        "ci": (2, Decimal("1.250000")),
        None: (2, Decimal("0.000000")),
    }


def test_by_key_on_a_ledger_from_before_client_keys_is_one_group_without_a_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    db = tmp_path / "old.db"
    seed(db, [{k: v for k, v in r.items() if k != "key_name"} for r in OCTOBER],
         upto="0002_costs.sql")  # fmt: skip
    code, out, _ = report(capsys, "--db", str(db), "--month", "2026-10", "--format", "json")
    total = loads(out)
    code, out, err = report(
        capsys, "--db", str(db), "--month", "2026-10", "--by", "key", "--format", "json"
    )
    assert (code, err) == (0, "")
    [group] = loads(out)["groups"]
    assert group.pop("key") is None
    assert group == {k: v for k, v in total.items() if k in group}
    assert (group["requests"], group["saved_usd"]) == (6, Decimal("3.250000"))


def test_csv_and_markdown(ledger: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = report(capsys, "--month", "2026-10", "--format", "csv", "--by", "model")
    assert code == 0
    assert out == (
        "from,to,model,requests,local_requests,api_requests,failed_requests,unpriced_requests,"
        "local_share,api_cost_usd,counterfactual_cost_usd,saved_usd,fixed_cost_usd,"
        "net_saved_usd,latency_tax_s,latency_tax_requests,latency_tax_share\n"
        "2026-10-01,2026-10-31,gpt-4o,3,1,1,1,0,0.5,1.500000,3.500000,2.000000,,,30.0,1,0.5\n"
        "2026-10-01,2026-10-31,gpt-4o-mini,2,1,1,0,0,0.5,0.300000,1.550000,1.250000,,,0.8,1,0.5\n"
        "2026-10-01,2026-10-31,my-finetune,1,1,0,0,1,1.0,0.000000,0.000000,0.000000,,,0.0,0,0.0\n"
        "2026-10-01,2026-10-31,total,6,3,2,1,1,0.6,1.800000,5.050000,3.250000,40.000000,"
        "-36.750000,30.8,2,0.4\n"
    )
    code, out, _ = report(capsys, "--month", "2026-10", "--format", "markdown")
    assert code == 0
    assert out.splitlines()[:9] == [
        "**frugal report: 2026-10 (2026-10-01 to 2026-10-31, UTC)**",
        "",
        "| Period | Requests | Local | Local share | Paid (API) | Without proxy | Saved | Tax |",
        "|:---|---:|---:|---:|---:|---:|---:|---:|",
        "| 2026-10 | 6 | 3 | 60.0% | $1.8000 | $5.0500 | $3.2500 | 30.8 s |",
        "",
        "| Summary |  |",
        "|:---|---:|",
        "| Without the proxy | $5.0500 |",
    ]


# -- periods and the fixed cost -------------------------------------------------------------------


def test_a_range_of_days_prorates_the_fixed_cost(
    ledger: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, out, _ = report(capsys, "--from", "2026-10-02", "--to", "2026-10-11", "--format", "json")
    data = loads(out)
    assert (data["month"], data["from"], data["to"]) == (
        "2026-10-02..2026-10-11",
        "2026-10-02",
        "2026-10-11",
    )
    assert data["requests"] == 4  # the 2nd and the 3rd of October
    assert data["fixed_cost_usd"] == Decimal("12.903226")  # 40 * 10 / 31
    _, out, _ = report(capsys, "--from", "2026-10-25", "--to", "2026-11-05", "--format", "json")
    # 7 of October's 31 days and 5 of November's 30: 40 * 7/31 + 40 * 5/30.
    assert loads(out)["fixed_cost_usd"] == Decimal("15.698925")


def test_the_running_month_counts_the_fixed_cost_up_to_now(ledger: Path) -> None:
    now = datetime(2026, 10, 11, 12, 0, tzinfo=UTC)
    data = build(str(ledger), Period.month(None, now), 40, now=now)
    assert data["month"] == "2026-10"
    assert data["fixed_cost_usd"] == Decimal("13.548387")  # 40 * 10.5 / 31
    assert data["requests"] == 6  # rows after "now" would count too: the ledger is the truth
    exact = fixed_cost_pico(Period.month("2026-10").start, now, 40 * PICO, now)
    assert exact == round(Decimal(40 * PICO) * Decimal(21) / Decimal(62))


# -- exact money ----------------------------------------------------------------------------------


def random_rows(
    seed: int, make: Callable[[random.Random, int], dict[str, Any]]
) -> list[dict[str, Any]]:
    """3,000 rows, the ``i``-th made by ``make`` from one generator seeded with ``seed``: the
    same rows on every run."""
    rng = random.Random(seed)
    return [make(rng, i) for i in range(3000)]


def test_totals_equal_the_sum_of_the_rows_to_the_cent(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)

    def priced(rng: random.Random, i: int) -> dict[str, Any]:
        paid = rng.randrange(0, 3 * 10**10)
        return row(
            f"2026-10-{1 + i % 31:02d} {i % 24:02d}:{i % 60:02d}:00",
            "api" if i % 3 else "local",
            "accepted",
            rng.choice(["gpt-4o-mini", "gpt-4o", "claude-3-5-haiku"]),
            request_id=f"r{i}",
            api_cost_pusd=paid if i % 3 else 0,
            counterfactual_cost_pusd=paid + rng.randrange(0, 10**10),
        )

    rows = random_rows(5, priced)
    db = tmp_path / "money.db"
    seed(db, rows)
    _, out, _ = report(capsys, "--db", str(db), "--month", "2026-10", "--format", "json")
    data = loads(out)
    paid = sum(r["api_cost_pusd"] for r in rows)
    counterfactual = sum(r["counterfactual_cost_pusd"] for r in rows)
    exact = Decimal(10) ** -6
    assert Decimal(data["api_cost_usd"]) == (Decimal(paid) / PICO).quantize(exact)
    assert Decimal(data["counterfactual_cost_usd"]) == (Decimal(counterfactual) / PICO).quantize(
        exact
    )
    assert Decimal(data["saved_usd"]) == (Decimal(counterfactual - paid) / PICO).quantize(exact)
    # Summing the same rows as floats, the way a careless report would, drifts.
    assert sum(r["counterfactual_cost_pusd"] / PICO for r in rows) != counterfactual / PICO
    _, out, _ = report(capsys, "--db", str(db), "--month", "2026-10", "--format", "json",
                       "--by", "model")  # fmt: skip
    groups = loads(out)["groups"]
    assert round(sum(Decimal(g["saved_usd"]) for g in groups), 2) == round(
        Decimal(data["saved_usd"]), 2
    )


# What `--by key` showed when it scanned the rows: one GROUP BY over the period's rows, the key
# NULL or '' being "no key".
BY_KEY_FROM_ROWS = """
SELECT NULLIF(key_name, ''), COUNT(*), SUM(route = 'local'), SUM(route = 'api'),
       SUM(status >= 400), COALESCE(SUM(api_cost_pusd), 0),
       COALESCE(SUM(counterfactual_cost_pusd), 0),
       SUM(status < 400 AND counterfactual_cost_pusd IS NULL), TOTAL(latency_tax_ms),
       SUM(latency_tax_ms > 0)
FROM requests WHERE ts >= ? AND ts < ? GROUP BY 1
"""


def usd6(pico: int) -> Decimal:
    return (Decimal(pico) / PICO).quantize(Decimal(10) ** -6)


def test_by_key_equals_a_group_by_over_the_rows(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ledger written at 0004 (before the key was in the rollup), upgraded by the report."""
    monkeypatch.chdir(tmp_path)

    def keyed(rng: random.Random, i: int) -> dict[str, Any]:
        route = rng.choice(["local", "local", "api", "none"])
        status = 400 if route == "none" else rng.choice([200, 200, 200, 502])
        paid = rng.randrange(0, 3 * 10**10) if route == "api" else 0
        tax = float(rng.randrange(1, 9000)) if route == "api" and i % 3 == 0 else 0.0
        day = {0: "2026-09-30", 1: "2026-11-01"}.get(i % 50, f"2026-10-{1 + i % 31:02d}")
        return row(
            f"{day} {i % 24:02d}:{i % 60:02d}:{i % 59:02d}",
            route,
            rng.choice(["accepted", "low_quality", "forced"]),
            rng.choice(["gpt-4o-mini", "gpt-4o", "my-finetune"]),
            request_id=f"r{i}",
            status=status,
            key_name=rng.choice(["alice", "bob", "ci", None, ""]),
            api_cost_pusd=paid,
            counterfactual_cost_pusd=rng.choice([None, paid + rng.randrange(0, 10**10)]),
            local_ms=tax,
            latency_tax_ms=tax,
        )

    rows = random_rows(7, keyed)
    db = tmp_path / "keys.db"
    seed(db, rows, upto="0004_prediction.sql")
    code, out, _ = report(
        capsys, "--db", str(db), "--month", "2026-10", "--by", "key", "--format", "json"
    )
    assert code == 0
    data = loads(out)
    conn = sqlite3.connect(db)
    bounds = (ts("2026-10-01 00:00:00"), ts("2026-11-01 00:00:00"))
    expected = {}
    for key, n, local, api, failed, paid, cf, uncosted, tax_ms, taxed in conn.execute(
        BY_KEY_FROM_ROWS, bounds
    ):
        expected[key] = {
            "requests": n,
            "local_requests": local,
            "api_requests": api,
            "failed_requests": failed,
            "unpriced_requests": uncosted,
            "local_share": round(local / (local + api), 4),
            "api_cost_usd": usd6(paid),
            "counterfactual_cost_usd": usd6(cf),
            "saved_usd": usd6(cf - paid),
            "latency_tax_s": round(tax_ms / 1000, 3),
            "latency_tax_requests": taxed,
            "latency_tax_share": round(taxed / (local + api), 4),
        }
    conn.close()
    assert set(expected) == {"alice", "bob", "ci", None}
    order = sorted(expected, key=lambda k: (-expected[k]["requests"], str(k)))
    assert [g["key"] for g in data["groups"]] == order
    assert {g.pop("key"): g for g in data["groups"]} == expected
    assert data["requests"] == sum(e["requests"] for e in expected.values()) == 2880


# -- latency tax ----------------------------------------------------------------------------------


def test_latency_tax_p95_is_the_nearest_rank_over_the_requests_that_paid_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    taxes = [float(ms) for ms in range(100, 2100, 100)]  # 20 requests: 0.1 s .. 2.0 s
    rows = [
        row(f"2026-10-05 10:00:{i:02d}", "api", "low_quality", "gpt-4o-mini", request_id=f"t{i}",
            local_ms=t, latency_tax_ms=t, api_cost_pusd=1, counterfactual_cost_pusd=1)
        for i, t in enumerate(taxes)
    ] + [row("2026-10-05 11:00:00", "local", "accepted", "gpt-4o-mini", request_id="free",
             counterfactual_cost_pusd=1)]  # fmt: skip
    db = tmp_path / "tax.db"
    seed(db, rows)
    _, out, _ = report(capsys, "--db", str(db), "--month", "2026-10", "--format", "json")
    data = loads(out)
    assert data["latency_tax_s"] == 21.0
    assert (data["latency_tax_requests"], data["latency_tax_share"]) == (20, round(20 / 21, 4))
    assert data["latency_tax_p95_s"] == 1.9  # the 19th of 20


# -- what can go wrong ----------------------------------------------------------------------------


def test_an_empty_month_says_so_with_exit_code_4(
    ledger: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = report(capsys, "--month", "2026-08", "--format", "json")
    assert code == 4
    data = loads(out)
    assert (data["requests"], data["saved_usd"], data["fixed_cost_usd"]) == (
        0,
        Decimal("0.000000"),
        Decimal("40.000000"),
    )
    assert err == (
        f"frugal report: no requests recorded from 2026-08-01 to 2026-08-31 in {ledger}\n"
    )


def test_a_missing_database_is_exit_code_3(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    code, out, err = report(capsys, "--db", str(tmp_path / "nowhere.db"))
    assert (code, out) == (3, "")
    assert err == (
        f"frugal report: no ledger database at {tmp_path / 'nowhere.db'}: the proxy has not "
        "recorded any request yet (or [ledger] path / --db points elsewhere)\n"
    )
    assert not (tmp_path / "nowhere.db").exists()


def test_a_corrupt_database_is_exit_code_3(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    db = tmp_path / "bad.db"
    db.write_bytes(b"not sqlite" * 500)
    code, out, err = report(capsys, "--db", str(db))
    assert (code, out) == (3, "")
    assert err == f"frugal report: cannot read the ledger at {db}: file is not a database\n"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--month", "2026-13"], "--month '2026-13': expected YYYY-MM, e.g. 2026-11"),
        (["--month", "26-1"], "--month '26-1': expected YYYY-MM, e.g. 2026-11"),
        (["--to", "2026-10-01"], "--to needs --from"),
        (["--from", "2026-10-05", "--to", "2026-10-01"], "--to 2026-10-01 is before --from"),
        (["--from", "yesterday"], "--from 'yesterday': expected YYYY-MM-DD"),
        (["--chart", "out.gif"], "--chart 'out.gif': expected a file name ending in .png"),
    ],
)
def test_bad_options_are_exit_code_2(
    ledger: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    code, out, err = report(capsys, *args)
    assert (code, out) == (2, "")
    assert err.startswith(f"frugal report: {message}")


def test_a_ledger_from_an_older_proxy_is_upgraded_and_reported(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    db = tmp_path / "old.db"
    conn = sqlite3.connect(db, isolation_level=None)
    migrate(conn, upto="0001_ledger.sql")
    conn.execute(
        "INSERT INTO requests (request_id, ts, endpoint, requested_model, route, reason, status, "
        "prompt_tokens, completion_tokens, latency_ms, local_ms, api_cost_pusd, "
        "counterfactual_cost_pusd) VALUES ('old', ?, 'chat.completions', 'gpt-4o-mini', 'api', "
        "'low_quality', 200, 10, 5, 900, 700, 4500000, 4500000)",
        (ts("2026-10-04 08:00:00"),),
    )
    conn.close()
    code, out, _ = report(capsys, "--db", str(db), "--month", "2026-10", "--format", "json")
    data = loads(out)
    assert code == 0
    # 4,500,000 pico-dollars shown to the micro-dollar, rounded half to even.
    assert (data["requests"], data["api_cost_usd"], data["latency_tax_s"]) == (
        1,
        Decimal("0.000004"),
        0.7,
    )


# -- the chart ------------------------------------------------------------------------------------


def test_chart_draws_daily_savings_and_local_share(
    ledger: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    svg = tmp_path / "savings.svg"
    code, _, err = report(capsys, "--month", "2026-10", "--chart", str(svg))
    assert code == 0 and err == f"frugal report: chart written to {svg}\n"
    text = svg.read_text()
    assert text.startswith("<?xml")
    for day in range(1, 32):
        assert f'id="saved-2026-10-{day:02d}"' in text
    assert 'id="local-share"' in text and 'id="fixed-cost"' in text
    assert "saved $3.25, net -$36.75, local share 60.0%" in text
    png = tmp_path / "savings.png"
    assert report(capsys, "--month", "2026-10", "--chart", str(png))[0] == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_installed_command_runs(ledger: Path, tmp_path: Path) -> None:
    out = subprocess.run(
        [FRUGAL, "report", "--config", str(tmp_path / "frugal.toml"), "--month", "2026-10",
         "--format", "json"],
        capture_output=True, text=True, check=False, cwd=tmp_path,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert loads(out.stdout)["saved_usd"] == Decimal("3.250000")
    help_text = subprocess.run(
        [FRUGAL, "report", "--help"], capture_output=True, text=True, check=True
    ).stdout
    assert "4  the ledger has no request in the period" in help_text


def test_a_closed_pipe_ends_the_report_quietly(ledger: Path, tmp_path: Path) -> None:
    # `frugal report | head`: the reader is gone before the table is written. A pipe whose
    # read end is already closed makes the first write fail with EPIPE, every time.
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        out = subprocess.run(
            [FRUGAL, "report", "--config", str(tmp_path / "frugal.toml"), "--month", "2026-10"],
            stdout=write_end, stderr=subprocess.PIPE, text=True, check=False, cwd=tmp_path,
        )  # fmt: skip
    finally:
        os.close(write_end)
    assert "Traceback" not in out.stderr, out.stderr
    assert "BrokenPipeError" not in out.stderr, out.stderr
    assert out.returncode == 141


# -- what clients chose is escaped ----------------------------------------------------------------


HOSTILE_MODEL = "evil\x1b[2J\x1b[31m\r\nfake | row\u2028\u3164"  # U+3164: a blank letter
FORMULA_MODEL = '=HYPERLINK("http://x","y")'
HOSTILE_KEY = "-2+3\u202e\t"
HOSTILE_REASON = "@sum|<b>"


@pytest.fixture
def hostile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv("FRUGAL_CONFIG", raising=False)
    monkeypatch.chdir(tmp_path)
    db = tmp_path / "ledger.db"
    seed(
        db,
        [
            row("2026-10-01 10:00:00", "api", HOSTILE_REASON, HOSTILE_MODEL, key_name=HOSTILE_KEY),
            row("2026-10-02 10:00:00", "local", "accepted", FORMULA_MODEL, key_name="ci"),
        ],
    )
    (tmp_path / "frugal.toml").write_text(f'[ledger]\npath = "{db}"\n')
    return db


@pytest.mark.parametrize("by", ["model", "key", "reason"])
def test_client_chosen_names_are_escaped_in_table_markdown_and_csv(
    hostile: Path, capsys: pytest.CaptureFixture[str], by: str
) -> None:
    for fmt in ("table", "markdown", "csv"):
        code, out, _ = report(capsys, "--month", "2026-10", "--by", by, "--format", fmt)
        assert code == 0, fmt
        for raw in ("\x1b", "\r", "\u2028", "\u202e", "\t", "\u3164"):
            assert raw not in out, (fmt, raw)
    _, table, _ = report(capsys, "--month", "2026-10", "--by", by)
    boxed = [line for line in table.splitlines() if line.startswith("│")][:4]
    assert len({line.count("│") for line in boxed}) == 1, boxed  # no line broken in two
    if by == "model":
        assert "│ evil\\x1b[2J\\x1b[31m\\x0d\\x0afake | row\\u2028\\u3164 │" in table
    _, markdown, _ = report(capsys, "--month", "2026-10", "--by", by, "--format", "markdown")
    header, *rows = [line for line in markdown.splitlines() if line.startswith("| ")][:4]
    columns = header.count(" | ")
    for line in rows:  # an escaped pipe is no cell border
        assert line.replace("\\|", "").count(" | ") == columns, line
    if by == "reason":
        assert "\\@sum\\|\\<b\\>" not in markdown and "@sum\\|\\<b\\>" in markdown
    _, text, _ = report(capsys, "--month", "2026-10", "--by", by, "--format", "csv")
    names = [cells[2] for cells in csv.reader(io.StringIO(text))][1:-1]
    expected = {
        "model": {"'" + FORMULA_MODEL, "evil\\x1b[2J\\x1b[31m\\x0d\\x0afake | row\\u2028\\u3164"},
        "key": {"ci", "'-2+3\\u202e\\x09"},
        "reason": {"accepted", "'@sum|<b>"},
    }[by]
    assert set(names) == expected


def test_json_keeps_client_chosen_names_exact(
    hostile: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for by, names in (
        ("model", {HOSTILE_MODEL, FORMULA_MODEL}),
        ("key", {HOSTILE_KEY, "ci"}),
        ("reason", {HOSTILE_REASON, "accepted"}),
    ):
        code, out, _ = report(capsys, "--month", "2026-10", "--by", by, "--format", "json")
        assert code == 0
        assert "\x1b" not in out and "\u2028" not in out
        assert {g[by] for g in loads(out)["groups"]} == names


def test_past_100_unpriced_model_names_the_rest_are_one_other_group(
    ledger: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 24, bounded growth: a client that sends a new model name with each request makes
    the report no larger than 100 named unpriced models, and the totals do not move."""
    code, before, _ = report(capsys, "--month", "2026-10", "--format", "json")
    assert code == 0
    # 150 client-chosen names: junk-000 gets 150 requests, junk-001 149, ... junk-149 one.
    junk = [
        row(f"2026-10-05 {n // 60:02d}:{n % 60:02d}:00", "local", "accepted", f"junk-{i:03d}",
            request_id=f"junk-{i}-{n}", counterfactual_cost_pusd=None,
            counterfactual_prompt_tokens=5, counterfactual_completion_tokens=2)
        for i in range(150) for n in range(150 - i)
    ]  # fmt: skip
    seed(ledger, junk)
    code, out, _ = report(capsys, "--month", "2026-10", "--format", "json", "--by", "model")
    assert code == 0
    data = loads(out)
    groups = {g["model"]: g for g in data["groups"]}
    named_junk = sorted(name for name in groups if name.startswith("junk-"))
    assert named_junk == [f"junk-{i:03d}" for i in range(100)]  # the busiest 100
    other = groups["other"]
    # junk-100 .. junk-149 (50 + ... + 1 requests) and my-finetune, unpriced too (1 request).
    assert other["models_folded"] == 51
    assert other["requests"] == sum(range(1, 51)) + 1
    assert {"gpt-4o-mini", "gpt-4o"} <= set(groups) and "my-finetune" not in groups
    assert sum(g["requests"] for g in data["groups"]) == data["requests"]
    assert data["requests"] == loads(before)["requests"] + len(junk)
    assert data["saved_usd"] == loads(before)["saved_usd"]
    warnings = data["warnings"]
    assert len(warnings) <= 102
    assert warnings[-1].startswith("1,276 requests for 51 other models not costed")
    code, plain, _ = report(capsys, "--month", "2026-10", "--format", "json")
    assert loads(plain)["warnings"] == warnings
