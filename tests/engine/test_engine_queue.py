"""The engine's queue seen through the app: a full queue sends requests to the API at once, and a
client that disconnects takes its request out of the queue and stops its generation."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn

from proxy.engine.local_engine import LocalEngine
from proxy.server.app import create_app
from tests.conftest import settings_for
from tests.fake_api import FakeAPI
from tests.load_factor import settle
from tests.loopback import ThreadedServer

LONG = [{"role": "user", "content": "Write a very long story about a lighthouse keeper."}]


async def test_a_full_queue_sends_the_next_request_to_the_api_at_once(
    tmp_path: Path, fake_api: FakeAPI, make_client: Any
) -> None:
    settings = settings_for(
        tmp_path,
        fake_api,
        local={"max_queue": 1, "n_ctx": 1024, "parallel": 1},  # one slot
    )
    async with make_client(settings, own_engine=True) as client:
        local_only = {"x-frugal-route": "local"}
        slow = {"model": "gpt-4o-mini", "messages": LONG, "max_tokens": 400}
        running = asyncio.create_task(
            client.post("/v1/chat/completions", json=slow, headers=local_only)
        )
        engine: LocalEngine = client.app.state.services.engine  # type: ignore[attr-defined]
        await settle(lambda: engine.busy, "the engine busy with the slow request")
        waiting = asyncio.create_task(
            client.post("/v1/chat/completions", json=slow, headers=local_only)
        )
        await settle(lambda: engine.queue_depth == 1, "the second request queued")
        assert engine.busy and engine.queue_depth == 1
        answer = await client.post(
            "/v1/chat/completions",
            json={"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "Hi"}]},
        )
        assert answer.status_code == 200
        assert answer.headers["x-frugal-route"] == "api"
        assert answer.headers["x-frugal-reason"] == "local_busy"
        assert fake_api.requests, "the API answered"
        assert engine.busy  # the long request is still being generated
        health = (await client.get("/healthz")).json()["engine"]
        assert health["queue_depth"] == 1 and health["pending"]["jobs"] == 2
        assert health["calibration"]["decode_tok_s"] > 0
        assert health["speculative"]["mode"] == "prompt-lookup"  # the default
        assert health["memory"]["fits"] is True
        running.cancel()
        waiting.cancel()
        await asyncio.gather(running, waiting, return_exceptions=True)


# -- a real server, for real disconnects ----------------------------------------------------


class _Server:
    """The app on a real loopback port, so that a client can really leave."""

    def __init__(self, app: Any) -> None:
        self.served = ThreadedServer(uvicorn.Config(app, log_level="warning"), name="frugal")
        self.port = 0

    def __enter__(self) -> _Server:
        self.port = self.served.start(timeout_s=60)
        return self

    def __exit__(self, *exc: object) -> None:
        self.served.stop(timeout_s=30)


def _send_and_leave_open(port: int, body: dict[str, Any]) -> socket.socket:
    """Send a complete HTTP request and return the socket without reading the answer."""
    payload = json.dumps(body).encode()
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\n"
        b"content-type: application/json\r\nx-frugal-route: local\r\n"
        + f"content-length: {len(payload)}\r\n\r\n".encode()
        + payload
    )
    return sock


def _wait_for(check: Any, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.05)
    return False


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[_Server, Any]]:
    settings = settings_for(
        tmp_path, None, local={"max_queue": 4, "n_ctx": 1024, "timeout_s": 120.0, "parallel": 1}
    )
    app = create_app(settings)
    with _Server(app) as server:
        yield server, app


def test_a_client_that_disconnects_stops_its_generation_and_leaves_the_queue(
    served: tuple[_Server, Any],
) -> None:
    server, app = served
    engine: LocalEngine = app.state.services.engine
    pid = engine.health()["pid"]
    long = {"model": "local", "messages": LONG, "max_tokens": 3000}
    first = _send_and_leave_open(server.port, long)
    assert _wait_for(lambda: engine.busy)
    second = _send_and_leave_open(server.port, long)
    assert _wait_for(lambda: engine.queue_depth == 1)

    second.close()  # leaves while queued
    assert _wait_for(lambda: engine.queue_depth == 0)
    assert engine.busy  # the first is still generating

    first.close()  # leaves while its answer is being generated
    assert _wait_for(lambda: not engine.busy)
    assert engine.pending_work().jobs == 0
    time.sleep(0.5)  # a kill, had there been one, would have been noticed by now
    # The worker stopped the generation itself when asked; it was not killed.
    assert engine.state == "ready" and engine.health()["pid"] == pid
    assert engine.stats.crashes == 0 and engine.stats.timeouts == 0

    # And the engine serves the next client.
    with socket.create_connection(("127.0.0.1", server.port), timeout=60) as sock:
        payload = json.dumps(
            {"model": "local", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
        ).encode()
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n"
            b"content-type: application/json\r\n"
            + f"content-length: {len(payload)}\r\n\r\n".encode()
            + payload
        )
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
    assert reply.startswith(b"HTTP/1.1 200")
