"""SIGTERM on a real ``frugal serve`` with requests in flight: they finish, their ledger rows are
written, new connections are refused, and the process exits 0. With the database locked by
another process, the stop still ends within the unit's ``TimeoutStopSec`` and every request's row
is in the database or in the rejected-rows file beside it. And the stop's worst case, added up
from its bounds, fits ``TimeoutStopSec``."""

from __future__ import annotations

import json
import signal
import sqlite3
import threading
import time
import tomllib
from pathlib import Path
from typing import Any

import httpx
import pytest

from proxy import config
from proxy.ledger.writing.writer import SPILL_SUFFIX
from proxy.server.shutdown import shutdown_budget_s
from tests.fake_api import FakeAPI
from tests.load_factor import CEILING_S, scaled
from tests.server.test_serve import serving
from tests.test_deploy import EXAMPLE, UNIT, unit_settings

STORY = [{"role": "user", "content": "Write a very long story about the sea."}]
REPLY = "one two three four five six seven eight"


def stop_timeout_s() -> float:
    [value] = unit_settings(UNIT.read_text(encoding="utf-8"))["TimeoutStopSec"]
    return float(value)


def test_the_worst_stop_fits_the_units_timeout_with_a_margin() -> None:
    """drain_s + the ledger's flush and close + the engine's stop + the other closes, with the
    example config (the installed one) and with the defaults."""
    example = config.from_dict(tomllib.loads(EXAMPLE.read_text("utf-8")))
    for settings in (example, config.Settings()):
        assert shutdown_budget_s(settings) + 5 <= stop_timeout_s(), shutdown_budget_s(settings)


@pytest.mark.serve
def test_sigterm_drains_requests_in_flight_then_flushes_the_ledger_and_exits_0(
    tmp_path: Path,
) -> None:
    with FakeAPI(reply=REPLY, per_token_s=0.4) as api, serving(tmp_path, api) as served:
        _drain(served)


def _drain(served: Any) -> None:
    results: dict[str, Any] = {}
    first_chunk = threading.Event()

    def local_answer() -> None:
        results["local"] = _ask_locally(served, max_tokens=40)
        results["local_done"] = time.monotonic()

    def api_stream() -> None:
        chunks: list[tuple[float, bytes]] = []
        with httpx.stream(
            "POST",
            served.base + "/v1/chat/completions",
            json={"model": "gpt-4o-mini", "messages": STORY, "stream": True},
            headers={"x-frugal-route": "api", "x-request-id": "in-flight-stream"},
            timeout=120,
        ) as response:
            results["stream_status"] = response.status_code
            for chunk in response.iter_bytes():
                chunks.append((time.monotonic(), chunk))
                first_chunk.set()
        results["stream"] = chunks

    workers = [threading.Thread(target=local_answer), threading.Thread(target=api_stream)]
    for worker in workers:
        worker.start()
    deadline = time.monotonic() + CEILING_S
    while not (served.health()["engine"]["busy"] and first_chunk.is_set()):
        assert time.monotonic() < deadline, "the requests never got in flight"
        time.sleep(0.05)

    served.proc.send_signal(signal.SIGTERM)
    signalled = time.monotonic()
    # The listening socket closes at once: new connections are refused while the rest drain.
    refused = False
    while time.monotonic() - signalled < scaled(3) and not refused:
        try:
            httpx.get(served.base + "/healthz", timeout=1)
        except (httpx.ConnectError, httpx.ReadError):
            # refused outright, or reset while the listener closes: either way, not served
            refused = True
        time.sleep(0.05)
    assert refused, "the server still accepted connections after SIGTERM"

    for worker in workers:
        worker.join(timeout=60)
    assert served.proc.wait(timeout=60) == 0, served.log.read_text()

    local = results["local"]
    assert local.status_code == 200, local.text
    assert local.headers["x-frugal-route"] == "local"
    assert local.json()["choices"][0]["message"]["content"]
    assert results["local_done"] > signalled, "the local answer had come before SIGTERM"

    assert results["stream_status"] == 200
    stream = results["stream"]
    body = b"".join(chunk for _, chunk in stream)
    assert body.rstrip().endswith(b"data: [DONE]")
    assert any(at > signalled for at, _ in stream), "the stream had ended before SIGTERM"
    for word in REPLY.split():
        assert word.encode() in body

    with sqlite3.connect(served.db) as conn:
        rows = dict(
            conn.execute(
                "SELECT request_id, status FROM requests WHERE request_id LIKE 'in-flight-%'"
            ).fetchall()
        )
    assert rows == {"in-flight-local": 200, "in-flight-stream": 200}
    log = served.log.read_text()
    assert '"event": "stopped"' in log


@pytest.mark.serve
def test_sigterm_with_the_database_locked_and_the_engine_busy_loses_no_row(
    tmp_path: Path,
) -> None:
    with FakeAPI(reply=REPLY) as api, serving(tmp_path, api) as served:
        _locked_stop(served)


def _locked_stop(served: Any) -> None:
    sent: list[str] = []

    def api_call(request_id: str) -> None:
        r = httpx.post(
            served.base + "/v1/chat/completions",
            json={"model": "gpt-4o-mini", "messages": STORY, "max_tokens": 8},
            headers={"x-frugal-route": "api", "x-request-id": request_id},
            timeout=60,
        )
        assert r.status_code == 200, r.text
        sent.append(request_id)

    for i in range(10):
        api_call(f"before-lock-{i}")
    deadline = time.monotonic() + CEILING_S
    while served.health()["ledger"]["rows_written"] < 10:
        assert time.monotonic() < deadline, "the first rows were never written"
        time.sleep(0.05)
    holder = sqlite3.connect(served.db, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        for i in range(10):
            api_call(f"while-locked-{i}")
        local = threading.Thread(target=_local_answer, args=(served, sent))
        local.start()
        deadline = time.monotonic() + CEILING_S
        while not served.health()["engine"]["busy"]:
            assert time.monotonic() < deadline, "the local request never reached the engine"
            time.sleep(0.05)
        health = served.health()["ledger"]
        assert health["write_retries"] >= 1 or health["pending"] >= 1
        served.proc.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        code = served.proc.wait(timeout=stop_timeout_s() + 30)
        stopped_in = time.monotonic() - signalled
        local.join(timeout=60)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    log = served.log.read_text()
    assert code == 0, log
    assert stopped_in < stop_timeout_s(), f"{stopped_in:.1f} s: systemd would have killed it"
    with sqlite3.connect(served.db) as conn:
        stored = [r[0] for r in conn.execute("SELECT request_id FROM requests")]
    spill = Path(str(served.db) + SPILL_SUFFIX)
    lines = [json.loads(line) for line in spill.read_text("utf-8").splitlines()]
    spilled = [line["row"]["request_id"] for line in lines]
    assert {line["why"] for line in lines} == {"unwritten"}
    assert "in-flight-local" in sent, "the local request did not finish"
    assert sorted(stored + spilled) == sorted(sent)  # each row once, none lost
    assert all(rid.startswith("before-lock-") for rid in stored) and len(stored) == 10
    assert '"event": "ledger_rows_spilled"' in log and '"event": "stopped"' in log
    assert '"ledger_rows_lost": 0' in log


def _ask_locally(served: Any, max_tokens: int) -> httpx.Response:
    """The story asked of the local model (any answer accepted), as request ``in-flight-local``."""
    return httpx.post(
        served.base + "/v1/chat/completions",
        json={"model": "gpt-4o-mini", "messages": STORY, "max_tokens": max_tokens},
        headers={
            "x-frugal-route": "local",
            "x-frugal-min-quality": "0",
            "x-request-id": "in-flight-local",
        },
        timeout=120,
    )


def _local_answer(served: Any, sent: list[str]) -> None:
    r = _ask_locally(served, max_tokens=24)
    if r.status_code == 200:
        sent.append("in-flight-local")
