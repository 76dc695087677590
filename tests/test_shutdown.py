"""SIGTERM on a real ``frugal serve`` with requests in flight: they finish, their ledger rows are
written, new connections are refused, and the process exits 0."""

from __future__ import annotations

import signal
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fake_api import FakeAPI
from tests.test_serve import start_server, stop_server

pytestmark = pytest.mark.serve

STORY = [{"role": "user", "content": "Write a very long story about the sea."}]
REPLY = "one two three four five six seven eight"


def test_sigterm_drains_requests_in_flight_then_flushes_the_ledger_and_exits_0(
    tmp_path: Path,
) -> None:
    with FakeAPI(reply=REPLY, per_token_s=0.4) as api:
        served = start_server(tmp_path, api)
        try:
            _drain(served)
        finally:
            stop_server(served)


def _drain(served: Any) -> None:
    results: dict[str, Any] = {}
    first_chunk = threading.Event()

    def local_answer() -> None:
        results["local"] = httpx.post(
            served.base + "/v1/chat/completions",
            json={"model": "gpt-4o-mini", "messages": STORY, "max_tokens": 40},
            headers={
                "x-frugal-route": "local",
                "x-frugal-min-quality": "0",
                "x-request-id": "in-flight-local",
            },
            timeout=120,
        )
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
    deadline = time.monotonic() + 30
    while not (served.health()["engine"]["busy"] and first_chunk.is_set()):
        assert time.monotonic() < deadline, "the requests never got in flight"
        time.sleep(0.05)

    served.proc.send_signal(signal.SIGTERM)
    signalled = time.monotonic()
    # The listening socket closes at once: new connections are refused while the rest drain.
    refused = False
    while time.monotonic() - signalled < 3 and not refused:
        try:
            httpx.get(served.base + "/healthz", timeout=1)
        except httpx.ConnectError:
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
