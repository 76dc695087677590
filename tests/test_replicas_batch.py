"""Deferred work across two real ``frugal serve`` replicas on one real PostgreSQL ledger
(``tests/pg.py``), the fake API (``tests/fake_api.py``) upstream of both, driven by the official
``openai`` SDK: what issue 41 asks of replicas ("Durable, and shared by replicas").

- One batch of 40 chat lines, made through replica 0, is drained by both: each replica's batch
  runner claims lines through the database (``FOR UPDATE SKIP LOCKED``). Its output, read
  through replica 1, has every ``custom_id`` once; the ledger has one row per line; each line
  names the replica (host, process) whose runner ran it, and both did; the lines the gate
  refused and the ones the local model cannot serve reached the fake as upstream batches, never
  as single calls, and none was sent twice.
- A background response running on replica 0 while replica 1 restarts (its start sweeps the
  open ones) and runs on past two leases: it is still running, then completes, with one ledger
  row.
- A batch's rejects on their way up from one replica (the fake holds the upload) while the
  other restarts: the restarted one does not take them over, and each goes up once.
- A background response running on replica 1 when it is killed with ``kill -9``: replica 0
  fails it once its lease has lapsed (on one host, at its next sweep: the holder's process is
  gone; from another host, once the lease's time has passed), with one ledger row, and only
  one.

Which lines the gate keeps is the test's choice, through ``[quality.models]`` (as
tests/server/test_batch_serve.py does): ``gpt-4o-mini`` has the bar 0, ``gpt-4o`` the bar 1.
The figures (the lines each replica ran, how long the failed response stayed open after the
kill) are printed (``pytest -s``).
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import openai
import pytest

from proxy.ledger.db.connections import Pool
from proxy.ledger.db.location import parse
from tests import pg
from tests.fake_api import FakeAPI
from tests.faults_support import launch, server_env, stop, tail, wait_ready
from tests.load_factor import CEILING_S, load_factor
from tests.server.test_serve import Served

pytestmark = [
    pytest.mark.serve,
    pytest.mark.skipif(pg.binaries() is None, reason="PostgreSQL is not installed"),
]

KEPT, REFUSED = "gpt-4o-mini", "gpt-4o"  # the gate's bar: 0 for the first, 1 for the second
LEASE_S = 5.0  # [batch] line_lease_s: a batch line's claim and a background response's lease
OPEN_BOUND_S = LEASE_S + LEASE_S / 3  # a dead process's response: its lease, then a sweep
QUESTION = "What is the capital of France?"
IMAGE = [
    {"type": "text", "text": QUESTION},
    {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
]
DONE = frozenset({"completed", "failed", "expired", "cancelled"})
API = {"x-frugal-route": "api"}


@dataclass
class Replicas:
    url: str
    api: FakeAPI
    servers: list[Served]  # replica 0 and replica 1 (a restart replaces one)
    made: list[Any]  # every replica launched, to stop them all at the end

    def client(self, replica: int) -> openai.OpenAI:
        return self.servers[replica].client()

    def relaunch(self, replica: int, tmp: Any) -> Served:
        served = launch(tmp, self.api, config=_config(self.url), env=server_env())
        self.made.append(served)
        self.servers[replica] = wait_ready(served)
        return served


def _config(url: str) -> dict[str, Any]:
    return {
        "ledger": {"url": url},
        # a held upstream call (the fake's hold) waits as long as a test holds it
        "fallback": {"timeout_s": CEILING_S},
        "quality": {"models": {KEPT: 0.0, REFUSED: 1.0}},
        "batch": {"poll_interval_s": 0.05, "max_poll_interval_s": 0.2, "line_lease_s": LEASE_S},
    }


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Replicas]:
    with pg.running() as server, FakeAPI() as api:
        assert server is not None
        url = server.database()
        made = [
            launch(tmp_path_factory.mktemp(f"replica{i}"), api, config=_config(url))
            for i in range(2)
        ]
        try:
            for served in made:
                wait_ready(served)
            yield Replicas(url, api, list(made), made)
        finally:
            for served in made:
                _stop(served)


def _stop(served: Served) -> None:
    """SIGTERM (SIGKILL past a grace), and its SDK client closed."""
    if served._client is not None:
        served._client.close()
        served._client = None
    stop(served)


def _rows(url: str, statement: str, values: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    pool = Pool(parse(url), size=1, timeout_s=10.0)
    try:
        with pool.transaction() as tx:
            return tx.rows(statement, values)
    finally:
        pool.close()


def _chat(model: str, content: Any = QUESTION) -> dict[str, Any]:
    messages = [{"role": "user", "content": content}]
    return {"model": model, "messages": messages, "max_tokens": 8, "temperature": 0}


def _lines() -> list[dict[str, Any]]:
    """40 lines: 30 the gate keeps, 5 it refuses, 5 with an image (the local model cannot
    serve them), mixed."""
    lines = []
    for i in range(40):
        kind = ("kept", "kept", "kept", "refused", "kept", "kept", "kept", "image")[i % 8]
        body = {"kept": _chat(KEPT), "refused": _chat(REFUSED), "image": _chat(REFUSED, IMAGE)}
        url = "/v1/chat/completions"
        lines.append({"custom_id": f"{kind}-{i}", "method": "POST", "url": url, "body": body[kind]})
    return lines


def _read(client: openai.OpenAI, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    return [json.loads(x) for x in client.files.content(file_id).read().decode().splitlines()]


def test_two_replicas_drain_one_batch_each_line_answered_once(replicas: Replicas) -> None:
    api = replicas.api
    api.reset()
    lines = _lines()
    first, second = replicas.client(0), replicas.client(1)
    jsonl = "".join(json.dumps(x) + "\n" for x in lines).encode()
    made = first.files.create(file=("in.jsonl", jsonl), purpose="batch")
    batch = first.batches.create(
        input_file_id=made.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    started = time.monotonic()
    end = started + CEILING_S
    while batch.status not in DONE and time.monotonic() < end:
        time.sleep(0.2)
        batch = second.batches.retrieve(batch.id)  # polled through the other replica
    took = time.monotonic() - started
    logs = [tail(s.log) for s in replicas.servers]
    assert batch.status == "completed", (batch, logs)
    out, errors = _read(second, batch.output_file_id), _read(second, batch.error_file_id)
    ids = [x["custom_id"] for x in out + errors]
    assert sorted(ids) == sorted(x["custom_id"] for x in lines)  # every custom_id once
    assert errors == []
    counts = batch.request_counts
    assert counts is not None and (counts.total, counts.completed) == (40, 40)
    line_ids = {x["id"]: x["custom_id"] for x in out}
    marks = ", ".join("?" for _ in line_ids)
    rows = _rows(
        replicas.url,
        f"SELECT request_id, route FROM requests WHERE request_id IN ({marks})",
        tuple(line_ids),
    )
    assert sorted(r[0] for r in rows) == sorted(line_ids)  # one ledger row per line
    ran = _rows(
        replicas.url,
        "SELECT l.id, l.route, l.worker FROM batch_lines l WHERE l.batch_id = ?",
        (batch.id,),
    )
    pids = {served.proc.pid: i for i, served in enumerate(replicas.servers)}
    by_replica: dict[int, dict[str, int]] = {0: {}, 1: {}}
    for _, route, worker in ran:
        replica = pids[int(str(worker).split(":")[1])]  # host:pid:suffix
        by_replica[replica][route] = by_replica[replica].get(route, 0) + 1
    print(
        f"\n40 lines on two replicas in {took:.1f} s: replica 0 ran {by_replica[0]}, "
        f"replica 1 ran {by_replica[1]}; {api.batches_made} upstream batches, "
        f"{len(api.batch_lines)} lines sent up"
    )
    assert len(ran) == 40
    assert all(by_replica[r].get("local", 0) > 0 for r in (0, 1)), by_replica  # both took part
    upstream = {cid for cid, x in line_ids.items() if not x.startswith("kept-")}
    assert sorted(r[0] for r in rows if r[1] == "api") == sorted(upstream)
    # the rejects went up in upstream batches, each line once, and no single call was made
    sent = [cid for cid, _, _ in api.batch_lines]
    assert api.single_calls == 0 and api.batches_made >= 1
    assert sorted(sent) == sorted(upstream)


def _background(client: openai.OpenAI) -> Any:
    return client.responses.create(
        model=KEPT, input=QUESTION, background=True, max_output_tokens=16, extra_headers=API
    )


def _status(client: openai.OpenAI, rid: str, *, until: frozenset[str], bound_s: float) -> Any:
    """The response once its status is in ``until``, or as it is after ``bound_s``."""
    end = time.monotonic() + bound_s
    found = client.responses.retrieve(rid)
    while found.status not in until and time.monotonic() < end:
        time.sleep(0.1)
        found = client.responses.retrieve(rid)
    return found


def _background_rows(url: str) -> list[tuple[Any, ...]]:
    return _rows(
        url,
        "SELECT status, route, error FROM requests WHERE deferred_tier = 'background' ORDER BY id",
    )


def _wait_rows(url: str, count: int) -> list[tuple[Any, ...]]:
    """The background rows, once there are ``count`` (each replica's writer batches its own)."""
    end = time.monotonic() + CEILING_S
    rows = _background_rows(url)
    while len(rows) < count and time.monotonic() < end:
        time.sleep(0.1)
        rows = _background_rows(url)
    return rows


def _under_way(api: FakeAPI, calls: int) -> None:
    """Wait until ``calls`` answering calls (not a batch's) have reached the fake."""
    end = time.monotonic() + CEILING_S
    while api.single_calls < calls and time.monotonic() < end:
        time.sleep(0.05)
    assert api.single_calls >= calls


def test_a_background_response_survives_another_replicas_restart(
    replicas: Replicas, tmp_path_factory: pytest.TempPathFactory
) -> None:
    api = replicas.api
    api.reset()
    api.set(hold=True)  # its upstream call stays under way until the test lets it go
    try:
        made = _background(replicas.client(0))
        running = _status(replicas.client(0), made.id, until=frozenset({"in_progress"}), bound_s=60)
        assert running.status == "in_progress"
        _under_way(api, 1)
        _stop(replicas.servers[1])  # replica 1 restarts: its start sweeps the open responses
        replicas.relaunch(1, tmp_path_factory.mktemp("replica1-again"))
        time.sleep(2 * LEASE_S)  # and runs on past two leases (its sweeps, replica 0's renewals)
        still = replicas.client(1).responses.retrieve(made.id)
        assert still.status == "in_progress", (still, tail(replicas.servers[1].log))
    finally:
        api.set(hold=False)
    done = _status(replicas.client(1), made.id, until=DONE, bound_s=CEILING_S)
    assert done.status == "completed", done
    rows = _wait_rows(replicas.url, 1)
    time.sleep(LEASE_S)  # a late second row (a sweep) would be in by now
    assert _background_rows(replicas.url) == rows
    assert [(r[0], r[1]) for r in rows] == [(200, "api")]
    assert api.single_calls == 1  # its one upstream call, never sent again


def _deferred(url: str, batch_id: str) -> list[tuple[Any, ...]]:
    return _rows(
        url,
        "SELECT id, worker FROM batch_lines WHERE batch_id = ? AND state = 'deferred' ORDER BY seq",
        (batch_id,),
    )


def test_a_restarting_replica_leaves_another_replicas_upstream_batch_alone(
    replicas: Replicas, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The rejects of a batch are on their way up from replica 0 (its upload held by the fake)
    when replica 1 starts again, and runs on past two leases: it does not take them over (it
    would send them up a second time), so each goes up once, in one upstream batch. Replica 1
    is stopped while the batch runs, so that replica 0 alone holds its rejects."""
    api = replicas.api
    api.reset()
    api.set(hold=True)  # the upload of the upstream batch's file waits
    lines = [
        {"custom_id": f"{kind}-{i}", "method": "POST", "url": "/v1/chat/completions", "body": body}
        for i, (kind, body) in enumerate([("kept", _chat(KEPT)), ("refused", _chat(REFUSED))] * 2)
    ]
    _stop(replicas.servers[1])
    try:
        jsonl = "".join(json.dumps(x) + "\n" for x in lines).encode()
        made = replicas.client(0).files.create(file=("in.jsonl", jsonl), purpose="batch")
        batch = replicas.client(0).batches.create(
            input_file_id=made.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        end = time.monotonic() + CEILING_S
        while len(_deferred(replicas.url, batch.id)) < 2 and time.monotonic() < end:
            time.sleep(0.1)
        deferred = _deferred(replicas.url, batch.id)
        assert len(deferred) == 2, deferred
        senders = {int(str(worker).split(":")[1]) for _, worker in deferred}
        assert senders == {replicas.servers[0].proc.pid}
        # replica 1 starts again while replica 0's upload is under way
        replicas.relaunch(1, tmp_path_factory.mktemp("replica1-third"))
        time.sleep(2 * LEASE_S)  # its start, and its renewals' looks for lines left behind
        still = _deferred(replicas.url, batch.id)
    finally:
        api.set(hold=False)
    batch = replicas.client(1).batches.retrieve(batch.id)
    end = time.monotonic() + CEILING_S
    while batch.status not in DONE and time.monotonic() < end:
        time.sleep(0.2)
        batch = replicas.client(1).batches.retrieve(batch.id)
    sent = sorted(cid for cid, _, _ in api.batch_lines)
    print(
        f"\nrejects sent up by replica 0, replica 1 started meanwhile: "
        f"{api.batches_made} upstream batch(es), {len(sent)} line(s) sent up"
    )
    assert still == deferred  # still the sender's
    assert batch.status == "completed", batch
    out = _read(replicas.client(1), batch.output_file_id)
    assert sorted(x["custom_id"] for x in out) == sorted(x["custom_id"] for x in lines)
    assert sent == sorted(line_id for line_id, _ in deferred)  # each reject once
    assert (api.batches_made, api.single_calls) == (1, 0)


def test_a_background_response_of_a_killed_replica_is_failed_after_its_lease(
    replicas: Replicas,
) -> None:
    api = replicas.api
    before = len(_background_rows(replicas.url))
    api.reset()
    api.set(hold=True)
    try:
        doomed = replicas.servers[1]
        made = _background(doomed.client())
        running = _status(doomed.client(), made.id, until=frozenset({"in_progress"}), bound_s=60)
        assert running.status == "in_progress"
        _under_way(api, 1)
        os.kill(doomed.proc.pid, signal.SIGKILL)
        killed = time.monotonic()
        assert doomed.proc.wait(timeout=30) == -signal.SIGKILL
        # replica 0 fails it once its lease has lapsed: the bound (the lease and a sweep, the
        # longest wait, from another host), with a generous margin
        margin = 10 * load_factor()
        failed = _status(replicas.client(0), made.id, until=DONE, bound_s=OPEN_BOUND_S * margin)
        open_s = time.monotonic() - killed
    finally:
        api.set(hold=False)
    print(
        f"\nkilled replica's background response {failed.status} {open_s:.1f} s after the kill "
        f"(lease {LEASE_S:.0f} s, bound {OPEN_BOUND_S:.1f} s)"
    )
    assert failed.status == "failed" and failed.error is not None, failed
    assert failed.error.code == "server_error"
    rows = _wait_rows(replicas.url, before + 1)
    time.sleep(LEASE_S)  # another sweep has run by now: still one row for it
    assert _background_rows(replicas.url) == rows
    assert [(r[0], r[2]) for r in rows[before:]] == [(500, "server_restarted")]
