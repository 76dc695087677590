"""Files, batches and batch lines in the ledger database (proxy/ledger/batches/), on SQLite files
and a real PostgreSQL: a batch from upload to its output files in the client's order, with one
ledger row per line; a key's file quota; a bad input file's errors by line; claims that never
overlap between two replicas racing; a lease that passes and is claimed again; a result
written once; cancel and expiry; and a worker killed with SIGKILL mid-batch, whose batch a
new process finishes with every line answered and billed once."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from proxy.errors import BadRequest, NotFound, PayloadTooLarge
from proxy.ledger.batches.files import FileStore
from proxy.ledger.batches.objects import LineResult
from proxy.ledger.batches.store import AlreadyFinished, BatchStore
from proxy.ledger.db.connections import Pool
from proxy.ledger.db.location import Database
from proxy.ledger.pricing import Price, PriceBook, pico_per_token
from proxy.ledger.writing.ledger_row import LedgerRow

NOW = 1_790_000_000.0
CHAT = "/v1/chat/completions"
PRICES = PriceBook(
    {}, {"gpt-4o-mini": Price(input=pico_per_token(0.15), output=pico_per_token(0.6))}
)
ROOT = Path(__file__).resolve().parents[2]


def request(i: int, *, url: str = CHAT, custom_id: str | None = None) -> dict[str, Any]:
    return {
        "custom_id": custom_id or f"task-{i}",
        "method": "POST",
        "url": url,
        "body": {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": f"q{i} é"}]},
    }


def jsonl(lines: list[Any]) -> bytes:
    return "".join(json.dumps(line) + "\n" for line in lines).encode("utf-8")


def stores(pool: Pool, quota: int = 10**9) -> tuple[FileStore, BatchStore]:
    return FileStore(pool, quota_bytes=quota), BatchStore(pool, prices=PRICES)


def batch_of(pool: Pool, n: int, *, owner: str | None = "id:1", now: float = NOW) -> str:
    files, batches = stores(pool)
    upload = files.put(
        owner,
        purpose="batch",
        filename="in.jsonl",
        content=jsonl([request(i) for i in range(n)]),
        now=now,
    )
    return batches.create(owner, input_file_id=upload.id, endpoint=CHAT, now=now).id


def answer(line_id: str, n: int) -> LineResult:
    return LineResult(
        status_code=200,
        request_id=f"req_{n}",
        body={"id": f"chatcmpl-{n}", "choices": [{"message": {"content": f"a{n}"}}]},
    )


def ledger_row(route: str) -> LedgerRow:
    return LedgerRow(
        request_id="replaced by the line's id",
        ts=NOW,
        requested_model="gpt-4o-mini",
        route=route,
        reason="accepted" if route == "local" else "low_quality",
        status=200,
        prompt_tokens=10,
        completion_tokens=5,
        latency_ms=12.0,
        service_tier="batch",
    )


def ledger(pool: Pool) -> list[tuple[Any, ...]]:
    with pool.transaction() as tx:
        return tx.rows("SELECT request_id, route, api_cost_pusd FROM requests ORDER BY request_id")


def read_jsonl(files: FileStore, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    content = files.content(file_id)
    assert content is not None
    return [json.loads(line) for line in content.decode("utf-8").splitlines()]


def test_a_batch_runs_from_upload_to_its_output_files_in_the_clients_order(pool: Pool) -> None:
    files, batches = stores(pool)
    batch_id = batch_of(pool, 9)
    batch = batches.get(batch_id)
    assert batch is not None and batch.status == "in_progress"
    assert batch.as_openai()["request_counts"] == {"total": 9, "completed": 0, "failed": 0}
    assert batch.times["in_progress_at"] == int(NOW) and batch.times["expires_at"] == NOW + 86400
    # Two workers take the lines in turns and finish them out of order.
    first = batches.claim("w1", 4, lease_s=60, now=NOW)
    second = batches.claim("w2", 10, lease_s=60, now=NOW)
    assert [line.index for line in first] == [0, 1, 2, 3]
    assert [line.index for line in second] == [4, 5, 6, 7, 8]
    assert second[0].body["messages"][0]["content"] == "q4 é" and second[0].owner == "id:1"
    assert batches.claim("w3", 10, lease_s=60, now=NOW) == []
    ended = []
    for line in reversed(first + second):
        if line.index == 6:  # the API refused it: a failed line, in the error file
            result = LineResult(status_code=400, request_id="req_6", body={"error": {"code": "x"}})
        elif line.index == 2:  # nothing came back at all
            result = LineResult(error={"code": "upstream_failed", "message": "gave up"})
        else:
            result = answer(line.id, line.index)
        route = "api" if line.index % 3 == 0 else "local"
        ended.append(batches.finish(line.id, result, route=route, row=ledger_row(route), now=NOW))
    assert ended == [None] * 8 + ["completed"]  # the last line's transaction ended the batch
    batch = batches.get(batch_id)
    assert batch is not None and batch.status == "completed"
    assert batch.as_openai()["request_counts"] == {"total": 9, "completed": 7, "failed": 2}
    assert batch.times["finalizing_at"] == batch.times["completed_at"] == int(NOW)
    output = read_jsonl(files, batch.output_file_id)
    errors = read_jsonl(files, batch.error_file_id)
    assert [line["custom_id"] for line in output] == [f"task-{i}" for i in (0, 1, 3, 4, 5, 7, 8)]
    assert [line["custom_id"] for line in errors] == ["task-2", "task-6"]
    by_index = {line.index: line for line in first + second}
    assert output[0] == {
        "id": by_index[0].id,
        "custom_id": "task-0",
        "response": {
            "status_code": 200,
            "request_id": "req_0",
            "body": {"id": "chatcmpl-0", "choices": [{"message": {"content": "a0"}}]},
        },
        "error": None,
    }
    assert errors[0]["response"] is None and errors[0]["error"]["code"] == "upstream_failed"
    assert errors[1]["response"]["status_code"] == 400 and errors[1]["error"] is None
    out = files.get(batch.output_file_id or "")
    assert out is not None and out.purpose == "batch_output" and out.owner == "id:1"
    # One ledger row per line, under the line's id; an API line priced as the writer prices it
    # (10 in, 5 out, at the batch tier: half the standard rate, which is all the book has).
    rows = ledger(pool)
    assert sorted(r[0] for r in rows) == sorted(line.id for line in first + second)
    api_costs = {r[2] for r in rows if r[1] == "api"}
    assert api_costs == {(10 * pico_per_token(0.15) + 5 * pico_per_token(0.6)) // 2}
    progress = batches.progress(batch_id)
    assert progress["done"] == 9 and progress["open"] == 0
    assert progress["api"] == 3 and progress["local"] == 6


def test_a_second_finish_of_a_line_is_refused_and_the_first_result_stands(pool: Pool) -> None:
    files, batches = stores(pool)
    batch_id = batch_of(pool, 2)
    line, other = batches.claim("w1", 2, lease_s=60, now=NOW)
    batches.finish(line.id, answer(line.id, 1), route="local", row=ledger_row("local"), now=NOW)
    with pytest.raises(AlreadyFinished):
        batches.finish(line.id, answer(line.id, 99), route="api", row=ledger_row("api"), now=NOW)
    assert [r[0] for r in ledger(pool)] == [line.id]  # billed once
    batches.finish(other.id, answer(other.id, 2), route="local", now=NOW)
    batch = batches.get(batch_id)
    assert batch is not None and batch.completed == 2 and batch.failed == 0
    output = read_jsonl(files, batch.output_file_id)
    assert output[0]["response"]["request_id"] == "req_1"  # not 99


def test_a_line_whose_lease_passed_is_claimed_again_and_finished_once(pool: Pool) -> None:
    _, batches = stores(pool)
    batch_id = batch_of(pool, 3)
    held = batches.claim("dies", 2, lease_s=30, now=NOW)
    assert [line.claims for line in held] == [1, 1]
    # Before the lease passes only the third line is free; the live worker keeps its two.
    assert [line.index for line in batches.claim("other", 5, lease_s=30, now=NOW + 29)] == [2]
    assert batches.renew("dies", [held[0].id], lease_s=30, now=NOW + 29) == [held[0].id]
    # At NOW + 30 the second line's lease has passed; the first one's was renewed to NOW + 59.
    again = batches.claim("other", 5, lease_s=30, now=NOW + 30)
    assert [(line.id, line.claims) for line in again] == [(held[1].id, 2)]
    assert batches.renew("dies", [held[1].id], lease_s=30, now=NOW + 31) == []  # lost it
    batches.finish(again[0].id, answer(again[0].id, 1), route="local", now=NOW + 31)
    with pytest.raises(AlreadyFinished):  # the first worker, late: refused
        batches.finish(held[1].id, answer(held[1].id, 1), route="local", now=NOW + 32)
    progress = batches.progress(batch_id)
    assert progress == {"claimed": 2, "done": 1, "local": 1, "open": 2}


def test_a_line_whose_workers_keep_dying_is_given_up_after_max_claims(pool: Pool) -> None:
    """Each worker that takes the first line dies with it (its lease runs out); the third time,
    the line is finished as failed instead of being handed out again, and the batch ends."""
    files, batches = stores(pool)
    batch_id = batch_of(pool, 3)
    for attempt in range(3):
        (line,) = batches.claim(f"w{attempt}", 1, lease_s=10, max_claims=3, now=NOW + 10 * attempt)
        assert (line.index, line.claims) == (0, attempt + 1)
    lines = batches.claim("w3", 5, lease_s=10, max_claims=3, now=NOW + 30)
    assert [line.index for line in lines] == [1, 2]
    for line in lines:
        batches.finish(line.id, answer(line.id, line.index), route="local", now=NOW + 31)
    batch = batches.get(batch_id)
    assert batch is not None and batch.status == "completed"
    assert batch.as_openai()["request_counts"] == {"total": 3, "completed": 2, "failed": 1}
    (abandoned,) = read_jsonl(files, batch.error_file_id)
    assert (abandoned["custom_id"], abandoned["error"]["code"]) == ("task-0", "line_abandoned")
    assert batches.give_up(3, now=NOW + 100) == 0


def test_two_replicas_claiming_at_once_never_get_the_same_line(database: Database) -> None:
    """Two pools (two replicas) on one database, each claiming five lines at a time as fast as
    it can and finishing them, with their ledger rows, until none is left: every line is claimed
    once, by one of them, answered once and billed once, and the batch ends once."""
    from proxy.ledger.db.migrate import open_database

    open_database(database)
    pools = [Pool(database, size=2, timeout_s=30.0) for _ in range(2)]
    try:
        batch_id = batch_of(pools[0], 400)
        got: list[list[str]] = [[], []]
        ended: list[str | None] = []
        start = threading.Barrier(2)

        def drain(i: int) -> None:
            store = BatchStore(pools[i], prices=PRICES)
            start.wait()
            while lines := store.claim(f"replica-{i}", 5, lease_s=600, now=NOW):
                got[i] += [line.id for line in lines]
                for line in lines:
                    result = answer(line.id, line.index)
                    row = ledger_row("local")
                    ended.append(store.finish(line.id, result, route="local", row=row, now=NOW))

        threads = [threading.Thread(target=drain, args=(i,)) for i in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        print(f"claimed: replica-0 {len(got[0])}, replica-1 {len(got[1])}")
        assert set(got[0]).isdisjoint(got[1])
        assert len(got[0]) + len(got[1]) == len(set(got[0]) | set(got[1])) == 400
        with pools[0].transaction() as tx:
            assert tx.rows("SELECT max(claims), count(*) FROM batch_lines") == [(1, 400)]
        assert [e for e in ended if e is not None] == ["completed"]
        files, batches = stores(pools[0])
        batch = batches.get(batch_id)
        assert batch is not None and (batch.completed, batch.failed) == (400, 0)
        output = read_jsonl(files, batch.output_file_id)
        assert [line["custom_id"] for line in output] == [f"task-{i}" for i in range(400)]
        rows = ledger(pools[0])
        assert sorted(r[0] for r in rows) == sorted(got[0] + got[1])
    finally:
        for pool in pools:
            pool.close()


def test_an_upload_past_the_keys_quota_is_refused_before_a_byte_is_written(pool: Pool) -> None:
    files = FileStore(pool, quota_bytes=1000)
    kept = files.put("id:1", purpose="batch", filename="a.jsonl", content=b"x" * 600, now=NOW)
    assert files.used("id:1") == 600 and files.room("id:1") == 400
    with pytest.raises(BadRequest) as refused:
        files.put("id:1", purpose="batch", filename="b.jsonl", content=b"y" * 401, now=NOW)
    body = refused.value.body()["error"]
    assert refused.value.status == 400
    assert (body["param"], body["code"]) == ("file", "file_quota_exceeded")
    assert files.list_files("id:1")[0] == [kept] and files.used("id:1") == 600
    # Another key, and the keyless proxy, have quotas of their own.
    files.put("id:2", purpose="batch", filename="c.jsonl", content=b"z" * 1000, now=NOW)
    files.put(None, purpose="user_data", filename="d.txt", content=b"w" * 1000, now=NOW)
    assert files.delete(kept.id) is True and files.delete(kept.id) is False
    assert files.room("id:1") == 1000
    files.put("id:1", purpose="batch", filename="b.jsonl", content=b"y" * 1000, now=NOW)
    with pytest.raises(PayloadTooLarge) as large:
        FileStore(pool, quota_bytes=2**40).put(
            "id:3", purpose="batch", filename="big", content=b"\n" * (200 * 2**20 + 1)
        )
    assert large.value.param == "file" and large.value.status == 413
    with pytest.raises(BadRequest) as purpose:
        files.put("id:4", purpose="batch_output", filename="x", content=b"")
    assert purpose.value.param == "purpose"


def test_files_are_listed_by_owner_with_after_limit_and_order(pool: Pool) -> None:
    files = FileStore(pool, quota_bytes=10**6)
    mine = [
        files.put("id:1", purpose="batch", filename=f"{i}.jsonl", content=b"{}", now=NOW + i)
        for i in range(5)
    ]
    files.put("id:2", purpose="batch", filename="theirs.jsonl", content=b"{}", now=NOW)
    newest, more = files.list_files("id:1", limit=2)
    assert [f.filename for f in newest] == ["4.jsonl", "3.jsonl"] and more
    rest, more = files.list_files("id:1", after=newest[-1].id, limit=10)
    assert [f.filename for f in rest] == ["2.jsonl", "1.jsonl", "0.jsonl"] and not more
    oldest, more = files.list_files("id:1", order="asc", after=mine[1].id, limit=2)
    assert [f.filename for f in oldest] == ["2.jsonl", "3.jsonl"] and more
    assert len(files.list_files(None, anyone=True)[0]) == 6
    files.put("id:1", purpose="user_data", filename="notes.txt", content=b"n", now=NOW + 9)
    assert [f.filename for f in files.list_files("id:1", purpose="user_data")[0]] == ["notes.txt"]
    assert files.list_files(None)[0] == []
    assert files.get(mine[0].id) == mine[0]
    assert mine[0].as_openai()["object"] == "file" and mine[0].id.startswith("file-")
    for bad, param in (({"order": "up"}, "order"), ({"limit": 0}, "limit")):
        with pytest.raises(BadRequest) as refused:
            files.list_files("id:1", **bad)
        assert refused.value.param == param


def test_expired_files_are_swept_and_their_bytes_given_back(pool: Pool) -> None:
    files = FileStore(pool, quota_bytes=10**6)
    hour = {"anchor": "created_at", "seconds": 3600}
    short = files.put(
        "id:1", purpose="batch", filename="a", content=b"ab", expires_after=hour, now=NOW
    )
    kept = files.put("id:1", purpose="batch", filename="b", content=b"abc", now=NOW)
    assert short.expires_at == int(NOW) + 3600 and kept.expires_at is None
    assert files.sweep(now=NOW + 3599) == 0
    assert files.sweep(now=NOW + 3600) == 1
    assert files.get(short.id) is None and files.used("id:1") == 3
    for bad, param in (
        ({"anchor": "last_active_at", "seconds": 3600}, "expires_after.anchor"),
        ({"anchor": "created_at", "seconds": 59}, "expires_after.seconds"),
    ):
        with pytest.raises(BadRequest) as refused:
            files.put("id:1", purpose="batch", filename="c", content=b"", expires_after=bad)
        assert refused.value.param == param


def test_a_bad_input_file_fails_the_batch_naming_each_bad_line(pool: Pool) -> None:
    files, batches = stores(pool)
    content = b"\n".join(
        [
            json.dumps(request(0)).encode(),
            b"{not json",
            json.dumps(request(2, custom_id="task-0")).encode(),  # a custom_id again
            json.dumps({**request(3), "method": "GET"}).encode(),
            json.dumps(request(4, url="/v1/embeddings")).encode(),  # a second url
            json.dumps({**request(5), "body": "text"}).encode(),
            b"",
            json.dumps({"method": "POST", "url": CHAT, "body": {}}).encode(),
            b"[1, 2]",
        ]
    )
    upload = files.put("id:1", purpose="batch", filename="bad.jsonl", content=content, now=NOW)
    batch = batches.create("id:1", input_file_id=upload.id, endpoint=CHAT, now=NOW)
    assert batch.status == "failed" and batch.times["failed_at"] == int(NOW)
    assert batch.total == 0
    errors = batch.as_openai()["errors"]
    assert errors["object"] == "list"
    assert [(e["line"], e["code"], e["param"]) for e in errors["data"]] == [
        (2, "invalid_json_line", None),
        (3, "duplicate_custom_id", "custom_id"),
        (4, "invalid_value", "method"),
        (5, "mismatched_url", "url"),
        (6, "missing_required_parameter", "body"),
        (8, "missing_required_parameter", "custom_id"),
        (9, "invalid_json_line", None),
    ]
    with pool.transaction() as tx:
        assert tx.rows("SELECT count(*) FROM batch_lines") == [(0,)]
    assert batches.claim("w", 10, lease_s=60, now=NOW) == []
    # An empty file, and more lines than a batch takes.
    empty = files.put("id:1", purpose="batch", filename="e", content=b"\n\n", now=NOW)
    failed = batches.create("id:1", input_file_id=empty.id, endpoint=CHAT, now=NOW)
    assert [e["code"] for e in failed.errors or []] == ["empty_file"]
    many = jsonl([request(i) for i in range(50_001)])
    upload = files.put("id:1", purpose="batch", filename="many.jsonl", content=many, now=NOW)
    failed = batches.create("id:1", input_file_id=upload.id, endpoint=CHAT, now=NOW)
    assert [(e["code"], e["line"]) for e in failed.errors or []] == [("too_many_requests", 50_001)]
    exactly = jsonl([request(i) for i in range(50_000)])
    upload = files.put("id:1", purpose="batch", filename="max.jsonl", content=exactly, now=NOW)
    assert batches.create("id:1", input_file_id=upload.id, endpoint=CHAT, now=NOW).total == 50_000


def test_a_batch_is_made_only_of_the_keys_own_batch_file_and_good_parameters(pool: Pool) -> None:
    files, batches = stores(pool)
    theirs = files.put("id:2", purpose="batch", filename="t", content=jsonl([request(0)]))
    data = files.put("id:1", purpose="user_data", filename="u", content=jsonl([request(0)]))
    with pytest.raises(NotFound) as missing:
        batches.create("id:1", input_file_id=theirs.id, endpoint=CHAT)
    assert missing.value.param == "input_file_id" and missing.value.status == 404
    cases: list[tuple[dict[str, Any], str]] = [
        ({"input_file_id": data.id, "endpoint": CHAT}, "input_file_id"),
        ({"input_file_id": data.id, "endpoint": "/v1/images"}, "endpoint"),
        (
            {"input_file_id": data.id, "endpoint": CHAT, "completion_window": "1h"},
            "completion_window",
        ),
        ({"input_file_id": data.id, "endpoint": CHAT, "metadata": {"k": 1}}, "metadata"),
    ]
    for given, param in cases:
        with pytest.raises(BadRequest) as refused:
            batches.create("id:1", **given)
        assert refused.value.param == param
    with pool.transaction() as tx:
        assert tx.rows("SELECT count(*) FROM batches") == [(0,)]


def test_batches_are_listed_newest_first_by_owner(pool: Pool) -> None:
    _, batches = stores(pool)
    made = [batch_of(pool, 1, now=NOW + i) for i in range(3)]
    batch_of(pool, 1, owner="id:2", now=NOW)
    page, more = batches.list_batches("id:1", limit=2)
    assert [b.id for b in page] == [made[2], made[1]] and more
    page, more = batches.list_batches("id:1", after=made[1])
    assert [b.id for b in page] == [made[0]] and not more
    assert len(batches.list_batches(None, anyone=True)[0]) == 4


def test_a_batch_cancelled_mid_way_ends_once_its_running_lines_finish(pool: Pool) -> None:
    files, batches = stores(pool)
    batch_id = batch_of(pool, 6)
    running = batches.claim("w1", 2, lease_s=60, now=NOW)
    batches.finish(running[0].id, answer(running[0].id, 0), route="local", now=NOW)
    batch = batches.cancel(batch_id, now=NOW + 1)
    assert batch.status == "cancelling" and batch.times["cancelling_at"] == int(NOW) + 1
    assert batches.claim("w2", 10, lease_s=60, now=NOW + 1) == []  # nothing more starts
    assert batches.cancel(batch_id, now=NOW + 2).status == "cancelling"
    assert batches.finish(running[1].id, answer(running[1].id, 1), route="local", now=NOW + 3) == (
        "cancelled"
    )
    batch = batches.get(batch_id)
    assert batch is not None and batch.status == "cancelled"
    assert batch.times["cancelled_at"] == int(NOW) + 3 and batch.times["completed_at"] is None
    assert [line["custom_id"] for line in read_jsonl(files, batch.output_file_id)] == [
        "task-0",
        "task-1",
    ]
    # The four lines never run are in the error file as OpenAI's batch_cancelled, counted
    # failed: every custom_id is in exactly one of the two files.
    assert [
        (line["custom_id"], line["response"], line["error"]["code"])
        for line in read_jsonl(files, batch.error_file_id)
    ] == [(f"task-{i}", None, "batch_cancelled") for i in range(2, 6)]
    assert batch.as_openai()["request_counts"] == {"total": 6, "completed": 2, "failed": 4}
    assert batches.progress(batch_id)["cancelled"] == 4
    # A worker that dies with a line of a cancelling batch: the batch ends once its lease has
    # passed, at the next sweep or cancel, not never.
    stuck_id = batch_of(pool, 3)
    (dying,) = batches.claim("dies", 1, lease_s=60, batch_id=stuck_id, now=NOW)
    assert batches.cancel(stuck_id, now=NOW + 1).status == "cancelling"
    assert batches.expire(now=NOW + 59) == []
    assert batches.cancel(stuck_id, now=NOW + 59).status == "cancelling"
    assert batches.expire(now=NOW + 60) == [stuck_id]
    stuck = batches.get(stuck_id)
    assert stuck is not None and stuck.status == "cancelled" and stuck.output_file_id is None
    assert sorted(line["custom_id"] for line in read_jsonl(files, stuck.error_file_id)) == [
        "task-0",
        "task-1",
        "task-2",
    ]
    assert stuck.as_openai()["request_counts"] == {"total": 3, "completed": 0, "failed": 3}
    with pytest.raises(AlreadyFinished):
        batches.finish(dying.id, answer(dying.id, 0), route="local", now=NOW + 61)
    # A line given back to a cancelling batch (its upstream batch was cancelled) ends it too.
    given_id = batch_of(pool, 2)
    held = batches.claim("w", 2, lease_s=600, batch_id=given_id, now=NOW)
    batches.cancel(given_id, now=NOW + 1)
    assert batches.release([line.id for line in held]) == 2
    assert batches.expire(now=NOW + 2) == [given_id]
    # A batch that has ended cannot be cancelled; one that is not there is a 404.
    done_id = batch_of(pool, 1)
    (line,) = batches.claim("w", 1, lease_s=60, batch_id=done_id, now=NOW)
    batches.finish(line.id, answer(line.id, 0), route="local", now=NOW)
    with pytest.raises(BadRequest) as refused:
        batches.cancel(done_id)
    assert (refused.value.param, refused.value.code) == ("batch_id", "invalid_batch_status")
    with pytest.raises(NotFound):
        batches.cancel("batch_nothing")


def test_a_batch_past_its_window_expires_with_its_unfinished_lines_in_the_error_file(
    pool: Pool,
) -> None:
    files, batches = stores(pool)
    batch_id = batch_of(pool, 4)
    lines = batches.claim("w1", 3, lease_s=60, now=NOW)
    batches.finish(lines[0].id, answer(lines[0].id, 0), route="local", now=NOW)
    assert batches.expire(now=NOW + 86399) == []
    assert batches.expire(now=NOW + 86400) == [batch_id]
    batch = batches.get(batch_id)
    assert batch is not None and batch.status == "expired"
    assert batch.as_openai()["request_counts"] == {"total": 4, "completed": 1, "failed": 3}
    assert [line["custom_id"] for line in read_jsonl(files, batch.output_file_id)] == ["task-0"]
    late = read_jsonl(files, batch.error_file_id)
    assert [(line["custom_id"], line["error"]["code"]) for line in late] == [
        ("task-1", "batch_expired"),
        ("task-2", "batch_expired"),
        ("task-3", "batch_expired"),
    ]
    with pytest.raises(AlreadyFinished):  # a worker still running a line, too late
        batches.finish(lines[1].id, answer(lines[1].id, 1), route="local", now=NOW + 86401)
    assert batches.expire(now=NOW + 90000) == []  # once


def test_lines_deferred_to_the_upstreams_batch_are_found_again_and_finished(pool: Pool) -> None:
    files, batches = stores(pool)
    batch_id = batch_of(pool, 4)
    lines = batches.claim("w1", 4, lease_s=60, now=NOW)
    rejected = [lines[1].id, lines[3].id]
    assert batches.defer_to_api(rejected, "local-handle-1") == 2  # before the upload
    assert batches.defer_to_api(rejected, "batch_upstream_1") == 2  # the upstream's id
    for line in (lines[0], lines[2]):
        batches.finish(line.id, answer(line.id, line.index), route="local", now=NOW)
    # Deferred lines hold no lease: no worker claims them, however late it is.
    assert batches.claim("w2", 10, lease_s=60, now=NOW + 10**6) == []
    waiting = batches.deferred()
    assert list(waiting) == ["batch_upstream_1"]
    assert [line.custom_id for line in waiting["batch_upstream_1"]] == ["task-1", "task-3"]
    assert batches.deferred("batch_other") == {}
    # The upstream batch failed: one line is sent again, and comes back through a worker.
    assert batches.release([lines[3].id]) == 1
    (again,) = batches.claim("w2", 10, lease_s=60, now=NOW)
    assert again.id == lines[3].id and again.upstream_batch_id is None
    batches.finish(lines[1].id, answer(lines[1].id, 1), route="api", row=ledger_row("api"), now=NOW)
    assert batches.finish(again.id, answer(again.id, 3), route="api", now=NOW) == "completed"
    batch = batches.get(batch_id)
    assert batch is not None
    custom_ids = [line["custom_id"] for line in read_jsonl(files, batch.output_file_id)]
    assert custom_ids == ["task-0", "task-1", "task-2", "task-3"]


_WORKER = """
import sys, time
from proxy.ledger.batches.objects import LineResult
from proxy.ledger.batches.store import BatchStore
from proxy.ledger.db.connections import Pool
from proxy.ledger.db.location import parse
from tests.ledger.test_batch_store import PRICES, ledger_row

store = BatchStore(Pool(parse(sys.argv[1])), prices=PRICES)
for n in range(int(sys.argv[2])):
    (line,) = store.claim("doomed", 1, lease_s=60)
    result = LineResult(status_code=200, request_id=f"req_{n}", body={"n": line.index})
    store.finish(line.id, result, route="local", row=ledger_row("local"))
    print("finished", line.id, flush=True)
held = store.claim("doomed", 3, lease_s=60)
print("holding", " ".join(line.id for line in held), flush=True)
time.sleep(600)
"""


def test_a_worker_killed_with_sigkill_mid_batch_leaves_a_batch_another_process_finishes(
    pool: Pool, database: Database
) -> None:
    """A worker process finishes five lines (each with its ledger row), claims three more and
    is killed with SIGKILL while it holds them. A new store on the same database claims those
    three once their lease has passed, and the rest; the output has every custom_id once, and
    there is one ledger row per line."""
    files, batches = stores(pool)
    batch_id = batch_of(pool, 12, now=time.time())
    target = database.url if database.is_postgres else database.path
    with subprocess.Popen(
        [sys.executable, "-c", _WORKER, target, "5"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    ) as worker:
        assert worker.stdout is not None
        said = [worker.stdout.readline().split() for _ in range(6)]
        worker.send_signal(signal.SIGKILL)
        assert worker.wait(timeout=30) == -signal.SIGKILL
    assert [w[0] for w in said] == ["finished"] * 5 + ["holding"]
    finished, held = [w[1] for w in said[:5]], said[5][1:]
    assert len(held) == 3
    # Restarted: the held lines are not free while their lease runs, and are after it.
    before = batches.claim("restarted", 100, lease_s=600)
    assert {line.index for line in before} == {8, 9, 10, 11}
    after = batches.claim("restarted", 100, lease_s=60, now=time.time() + 61)
    assert sorted(line.id for line in after) == sorted(held)
    assert {line.claims for line in after} == {2}
    for line in before + after:
        batches.finish(line.id, answer(line.id, line.index), route="local", row=ledger_row("local"))
    batch = batches.get(batch_id)
    assert batch is not None and batch.status == "completed"
    assert batch.as_openai()["request_counts"] == {"total": 12, "completed": 12, "failed": 0}
    output = read_jsonl(files, batch.output_file_id)
    assert [line["custom_id"] for line in output] == [f"task-{i}" for i in range(12)]
    rows = ledger(pool)
    assert sorted(r[0] for r in rows) == sorted(line["id"] for line in output)
    assert set(finished) <= {r[0] for r in rows}
