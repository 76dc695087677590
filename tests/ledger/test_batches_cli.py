"""``frugal batches list | show | cancel`` (proxy/cli/batches.py) against a real ledger, a SQLite
file and a database on a real PostgreSQL: batches made with the store's own API, some lines
answered locally, some by the API, one deferred to the API's batch; the listing's progress, a
batch's money from its lines' ledger rows, and a cancel, with the errors a user can meet."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from proxy.cli import main
from proxy.ledger.batches.objects import LineResult
from proxy.ledger.batches.store import BatchStore
from proxy.ledger.db.connections import Pool
from proxy.ledger.db.location import Database
from proxy.ledger.pricing import PUSD_PER_USD
from proxy.ledger.tenants import keys
from tests.ledger.test_batch_store import NOW, answer, batch_of, ledger_row, stores


def frugal(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def seeded(pool: Pool, database: Database) -> dict[str, Any]:
    """Two batches: alice's of 6 lines (3 answered locally, 1 by the API, 1 failed by the API,
    1 sent to the API's batch and waiting) and a keyless one of 2 lines, none answered."""
    keys.create(database, "bob")
    keys.create(database, "alice")
    alice = f"id:{next(k.key_id for k in keys.load_active(database)[0] if k.name == 'alice')}"
    _, batches = stores(pool)
    first = batch_of(pool, 6, owner=alice, now=NOW)
    second = batch_of(pool, 2, owner=None, now=NOW + 60)
    lines = batches.claim("w1", 6, lease_s=60, batch_id=first, now=NOW)
    for n, line in enumerate(lines[:3]):
        batches.finish(line.id, answer(line.id, n), route="local", row=ledger_row("local"), now=NOW)
    batches.finish(lines[3].id, answer(lines[3].id, 3), route="api", row=ledger_row("api"), now=NOW)
    refused = LineResult(status_code=400, request_id="req_x", body={"error": {"code": "x"}})
    batches.finish(lines[4].id, refused, route="api", row=ledger_row("api"), now=NOW)
    batches.defer_to_api([lines[5].id], "batch_upstream_1")
    return {"alice": first, "keyless": second, "lines": [line.id for line in lines]}


def test_list_shows_each_batch_with_its_progress_newest_first_and_by_key(
    pool: Pool, database: Database, capsys: pytest.CaptureFixture[str]
) -> None:
    made = seeded(pool, database)
    status, out, _ = frugal(capsys, "batches", "list", "--db", database.label, "--format", "json")
    assert status == 0
    rows = json.loads(out)
    assert [r["id"] for r in rows] == [made["keyless"], made["alice"]]
    alice = rows[1]
    assert (alice["status"], alice["endpoint"], alice["key"]) == (
        "in_progress",
        "/v1/chat/completions",
        "alice",
    )
    assert (alice["total"], alice["done"], alice["local"], alice["api"]) == (6, 5, 3, 2)
    assert (alice["deferred"], alice["failed"]) == (1, 1)
    assert (rows[0]["key"], rows[0]["total"], rows[0]["done"]) == (None, 2, 0)

    status, out, _ = frugal(capsys, "batches", "list", "--db", database.label, "--key", "alice")
    assert status == 0
    table = out.splitlines()
    assert table[0].split() == [
        "ID", "STATUS", "ENDPOINT", "KEY", "CREATED", "(UTC)", "DONE", "LOCAL", "API", "FAILED"
    ]  # fmt: skip
    assert len(table) == 2
    assert table[1].split()[:4] == [made["alice"], "in_progress", "/v1/chat/completions", "alice"]
    assert table[1].split()[-4:] == ["5/6", "3", "2+1", "1"]

    status, out, _ = frugal(capsys, "batches", "list", "--db", database.label, "--limit", "1")
    assert status == 0 and len(out.splitlines()) == 2 and made["keyless"] in out
    status, out, _ = frugal(capsys, "batches", "list", "--db", database.label, "--key", "bob")
    assert status == 0 and out == ""
    status, _, err = frugal(capsys, "batches", "list", "--db", database.label, "--key", "carol")
    assert status == 1
    assert err == "frugal batches: no stored key named 'carol'; see `frugal keys list`\n"


def test_show_gives_the_batch_its_lines_by_state_and_route_its_files_and_its_money(
    pool: Pool, database: Database, capsys: pytest.CaptureFixture[str]
) -> None:
    made = seeded(pool, database)
    with pool.transaction() as tx:  # a row that is not the batch's must not be counted
        tx.run(
            "INSERT INTO requests (request_id, ts, endpoint, route, reason, status, latency_ms, "
            "api_cost_pusd, counterfactual_cost_pusd) VALUES ('other', ?, 'chat.completions', "
            "'api', 'x', 200, 1, 999, 999)",
            (NOW,),
        )
        cost, counterfactual = tx.rows(
            "SELECT sum(api_cost_pusd), sum(counterfactual_cost_pusd) FROM requests "
            "WHERE request_id LIKE 'batch_req_%'"
        )[0]
    assert cost > 0 and counterfactual > cost  # three local lines cost nothing
    status, out, _ = frugal(
        capsys, "batches", "show", made["alice"], "--db", database.label, "--format", "json"
    )
    assert status == 0
    shown = json.loads(out)
    assert shown["batch"]["id"] == made["alice"] and shown["key"] == "alice"
    assert shown["batch"]["request_counts"] == {"total": 6, "completed": 4, "failed": 1}
    assert shown["lines"] == {"pending": 0, "claimed": 0, "deferred": 1, "done": 5, "cancelled": 0}
    assert shown["routes"] == {"local": 3, "api": 2}
    input_id = shown["batch"]["input_file_id"]
    assert shown["files"]["input"]["id"] == input_id and shown["files"]["input"]["bytes"] > 0
    assert shown["money"]["ledger_rows"] == 5
    money = {k: Decimal(v) * PUSD_PER_USD for k, v in shown["money"].items() if k != "ledger_rows"}
    assert money == {
        "api_cost_usd": cost,
        "counterfactual_usd": counterfactual,
        "saved_usd": counterfactual - cost,
    }
    status, out, _ = frugal(capsys, "batches", "show", made["alice"], "--db", database.label)
    assert status == 0
    assert "lines: 0 pending, 0 claimed, 1 deferred, 5 done, 0 cancelled" in out
    assert "answered: 3 local, 2 by the API (1 waiting in the API's batch)" in out
    assert f"input file: {input_id}" in out
    status, _, err = frugal(capsys, "batches", "show", "batch_nope", "--db", database.label)
    assert (status, err) == (1, "frugal batches: no batch 'batch_nope'\n")


def test_cancel_cancels_a_running_batch_and_refuses_an_ended_or_unknown_one(
    pool: Pool, database: Database, capsys: pytest.CaptureFixture[str]
) -> None:
    made = seeded(pool, database)
    status, _, err = frugal(capsys, "batches", "cancel", made["keyless"], "--db", database.label)
    assert status == 0 and err == f"Cancelled batch {made['keyless']}.\n"
    batch = BatchStore(pool).get(made["keyless"])
    assert batch is not None and batch.status == "cancelled"
    # Cancelling it again returns it as it is; one that ended otherwise is refused.
    status, _, _ = frugal(capsys, "batches", "cancel", made["keyless"], "--db", database.label)
    assert status == 0
    with pool.transaction() as tx:
        tx.run("UPDATE batches SET status = 'completed' WHERE id = ?", (made["alice"],))
    status, _, err = frugal(capsys, "batches", "cancel", made["alice"], "--db", database.label)
    assert status == 1
    assert err.startswith(f"frugal batches: {made['alice']}: The batch is completed; ")
    assert len(err.splitlines()) == 1
    status, _, err = frugal(capsys, "batches", "cancel", "batch_nope", "--db", database.label)
    assert (status, err) == (1, "frugal batches: no batch 'batch_nope'\n")


def test_a_ledger_that_is_not_there_is_exit_3_and_creates_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "none.db"
    for argv in (["list"], ["show", "batch_x"], ["cancel", "batch_x"]):
        status, out, err = frugal(capsys, "batches", *argv, "--db", str(missing))
        assert (status, out) == (3, "")
        assert err.startswith(f"frugal batches: no ledger database at {missing}")
    assert not missing.exists()
