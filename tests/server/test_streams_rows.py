"""Clients that leave: the local work stops, the upstream connection closes, and the request
still gets exactly one ledger row (status 499, ``client_gone``), whatever the mode.

The app runs on a real uvicorn server in a thread, with its own engine (the real SmolLM2) and the
fake API on a loopback port. Clients are raw sockets that send a request and close, so the
disconnects are real ones. One case needs a moment no socket can aim at (the client gone after
the handler returned its stream, before the stream's first byte, when Starlette would never
start the stream's generator): there the test drives the same app, on the server's own loop,
through ASGI messages it controls. Waits poll with a generous deadline, only to avoid hangs.
"""

from __future__ import annotations

import asyncio
import json
import socket
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from starlette.types import Message, Receive, Scope, Send

from proxy.engine.local_engine import LocalEngine
from proxy.server.app import create_app
from tests.conftest import FAKE_KEY, FAKE_KEY_ENV, settings_for
from tests.fake_api import FakeAPI
from tests.loopback import ThreadedServer

DEADLINE_S = 20.0
LONG = [{"role": "user", "content": "Write a very long story about a lighthouse keeper."}]
LONG_REPLY = " ".join(f"word{i}" for i in range(60))


def wait_for(check: Callable[[], Any], what: str) -> Any:
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


class _LoopOf:
    """The app as uvicorn serves it, remembering the loop it runs on."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.loop: asyncio.AbstractEventLoop | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            self.loop = asyncio.get_running_loop()
        await self.app(scope, receive, send)


@dataclass
class Served:
    app: Any
    port: int
    db: Path
    api: FakeAPI
    loop: asyncio.AbstractEventLoop

    @property
    def engine(self) -> LocalEngine:
        engine: LocalEngine = self.app.state.services.engine
        return engine

    def rows(self, request_id: str) -> list[dict[str, Any]]:
        with sqlite3.connect(self.db) as conn:
            conn.row_factory = sqlite3.Row
            found = conn.execute("SELECT * FROM requests WHERE request_id = ?", (request_id,))
            return [dict(r) for r in found]

    def one_row(self, request_id: str) -> dict[str, Any]:
        """The request's row, once it is written and nothing more is waiting to be."""
        wait_for(lambda: self.rows(request_id), f"the row of {request_id}")
        wait_for(lambda: self.app.state.services.ledger.pending == 0, "the ledger to be written")
        rows = self.rows(request_id)
        assert len(rows) == 1, rows
        return rows[0]

    def idle(self) -> None:
        """Wait until the engine is doing nothing: no job running, none queued."""
        engine = self.engine
        wait_for(lambda: not engine.busy and engine.queue_depth == 0, "the engine to be idle")
        assert engine.pending_work().jobs == 0


def _serve(tmp: Path, api: FakeAPI, mode: str) -> Iterator[Served]:
    settings = settings_for(
        tmp,
        api,
        # One request at a time: the streams left while queued need a queue.
        local={"max_queue": 4, "n_ctx": 1024, "timeout_s": 120.0, "parallel": 1},
        router={"stream_mode": mode, "predictive": False},
    )
    app = create_app(settings)
    wrapped = _LoopOf(app)
    config = uvicorn.Config(wrapped, log_level="warning", interface="asgi3")
    served = ThreadedServer(config, name=f"frugal-{mode}")
    port = served.start(timeout_s=DEADLINE_S)
    try:
        assert wrapped.loop is not None, "the server did not start"
        yield Served(app, port, Path(settings.ledger.path), api, wrapped.loop)
    finally:
        served.stop(timeout_s=60)


@pytest.fixture(scope="module")
def api() -> Iterator[FakeAPI]:
    with pytest.MonkeyPatch.context() as patch, FakeAPI() as fake:
        patch.setenv(FAKE_KEY_ENV, FAKE_KEY)
        yield fake


@pytest.fixture(autouse=True)
def _fresh_api(api: FakeAPI) -> None:
    api.reset()


@pytest.fixture(scope="module")
def verify(api: FakeAPI, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    yield from _serve(tmp_path_factory.mktemp("verify"), api, "verify")


@pytest.fixture(scope="module")
def live(api: FakeAPI, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    yield from _serve(tmp_path_factory.mktemp("live"), api, "live")


# -- clients ---------------------------------------------------------------------------------


def _request_id() -> str:
    return "leave-" + uuid.uuid4().hex


def _head(path: str, payload: bytes, headers: dict[str, str]) -> list[tuple[str, str]]:
    return [
        ("host", "127.0.0.1"),
        ("content-type", "application/json"),
        ("content-length", str(len(payload))),
        *headers.items(),
    ]


def send(
    served: Served, body: dict[str, Any], *, path: str = "/v1/chat/completions", **headers: str
) -> tuple[socket.socket, str]:
    """Send a whole request on a fresh socket, read nothing; the socket and the request id."""
    request_id = _request_id()
    payload = json.dumps(body).encode()
    fields = _head(path, payload, {"x-request-id": request_id, **headers})
    head = f"POST {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in fields) + "\r\n"
    sock = socket.create_connection(("127.0.0.1", served.port), timeout=DEADLINE_S)
    sock.sendall(head.encode() + payload)
    return sock, request_id


def read_until(sock: socket.socket, marker: bytes) -> bytes:
    got = b""
    while marker not in got:
        chunk = sock.recv(65536)
        assert chunk, f"the connection closed before {marker!r}: {got[:300]!r}"
        got += chunk
    return got


def local_long(stream: bool) -> dict[str, Any]:
    return {"model": "local", "messages": LONG, "max_tokens": 3000, "stream": stream}


def api_stream() -> dict[str, Any]:
    return {"model": "gpt-4o-mini", "messages": LONG, "stream": True}


class Scripted:
    """One exchange driven through ASGI on the server's loop: the request, then a client that
    leaves when told. Its ``send`` never finishes sending the response's start, so no byte of
    the stream goes out: the client left between the handler's answer and the first byte."""

    def __init__(self, served: Served, body: dict[str, Any], **headers: str) -> None:
        self.served = served
        self.request_id = _request_id()
        self.payload = json.dumps(body).encode()
        fields = _head("/v1/chat/completions", self.payload, {"x-request-id": self.request_id})
        fields += list(headers.items())
        self.scope: Scope = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "1.1",
            "method": "POST",
            "scheme": "http",
            "path": "/v1/chat/completions",
            "raw_path": b"/v1/chat/completions",
            "root_path": "",
            "query_string": b"",
            "headers": [(k.encode(), v.encode()) for k, v in fields],
            "client": ("127.0.0.1", 50000),
            "server": ("127.0.0.1", served.port),
        }
        self.sent: list[Message] = []
        self.started = threading.Event()
        self._left: asyncio.Event | None = None
        self.done: Future[None] = asyncio.run_coroutine_threadsafe(self._run(), served.loop)

    async def _run(self) -> None:
        left = self._left = asyncio.Event()
        body_sent = False

        async def receive() -> Message:
            nonlocal body_sent
            if not body_sent:
                body_sent = True
                return {"type": "http.request", "body": self.payload, "more_body": False}
            await left.wait()
            return {"type": "http.disconnect"}

        async def send(message: Message) -> None:
            self.sent.append(message)
            if message["type"] == "http.response.start":
                self.started.set()
                await asyncio.Event().wait()  # the client is gone: this start never goes out

        await self.served.app(self.scope, receive, send)

    def leave(self) -> None:
        left = self._left
        assert left is not None
        self.served.loop.call_soon_threadsafe(left.set)
        self.done.result(timeout=DEADLINE_S)


def assert_left(row: dict[str, Any], *, stream: bool = True) -> None:
    assert (row["status"], row["error"], row["stream"]) == (499, "client_gone", int(stream)), row


# -- local work stops ------------------------------------------------------------------------


def test_a_finished_stream_gets_one_row_with_status_200(verify: Served) -> None:
    body = {"model": "local", "messages": LONG, "max_tokens": 4, "stream": True}
    sock, request_id = send(verify, body, connection="close")
    with sock:
        read_until(sock, b"data: [DONE]")
    row = verify.one_row(request_id)
    assert (row["status"], row["error"], row["route"]) == (200, None, "local"), row


@pytest.mark.parametrize("mode", ["verify", "live"])
def test_a_stream_left_while_generating_stops_it(mode: str, request: pytest.FixtureRequest) -> None:
    served: Served = request.getfixturevalue(mode)
    engine = served.engine
    pid = engine.health()["pid"]
    sock, request_id = send(served, local_long(stream=True))
    wait_for(lambda: engine.busy, "the generation to start")
    sock.close()
    served.idle()
    assert_left(served.one_row(request_id))
    # The worker stopped the generation itself when asked; it was not killed.
    assert engine.state == "ready" and engine.health()["pid"] == pid


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", local_long(stream=False)),
        ("/v1/completions", {"model": "local", "prompt": "Once upon a time", "max_tokens": 3000}),
        (
            "/v1/completions",
            {"model": "local", "prompt": "Once upon a time", "max_tokens": 3000, "stream": True},
        ),
    ],
    ids=["chat", "legacy", "legacy-stream"],
)
def test_a_request_left_while_generating_stops_it(
    verify: Served, path: str, body: dict[str, Any]
) -> None:
    engine = verify.engine
    sock, request_id = send(verify, body, path=path)
    wait_for(lambda: engine.busy, "the generation to start")
    sock.close()
    verify.idle()
    row = verify.one_row(request_id)
    assert_left(row, stream=bool(body.get("stream")))
    assert row["endpoint"] == ("completions" if path == "/v1/completions" else "chat.completions")


def test_live_stream_left_before_its_first_token_leaves_the_queue(live: Served) -> None:
    engine = live.engine
    blocker, blocker_id = send(live, local_long(stream=False))
    wait_for(lambda: engine.busy, "the first generation to start")
    waiting, waiting_id = send(live, local_long(stream=True))
    wait_for(lambda: engine.queue_depth == 1, "the live stream to be queued")
    waiting.close()  # no token of it was made: it was waiting behind the other one
    wait_for(lambda: engine.queue_depth == 0, "the live stream to leave the queue")
    assert_left(live.one_row(waiting_id))
    assert engine.busy  # the other one is still being generated
    blocker.close()
    live.idle()
    assert_left(live.one_row(blocker_id), stream=False)


# -- before the first byte: the stream's generator never runs --------------------------------


def test_live_stream_left_before_its_first_byte(live: Served) -> None:
    client = Scripted(live, local_long(stream=True))
    assert client.started.wait(DEADLINE_S), "no response started"
    assert live.engine.busy  # its first token is out of the engine: it is still generating
    client.leave()
    live.idle()
    row = live.one_row(client.request_id)
    assert_left(row)
    assert (row["route"], row["reason"]) == ("local", "forced")  # the model "local"
    assert [m["type"] for m in client.sent] == ["http.response.start"]


def test_verify_stream_left_before_its_first_byte(verify: Served) -> None:
    body = {"model": "local", "messages": LONG, "max_tokens": 8, "stream": True}
    client = Scripted(verify, body)
    assert client.started.wait(DEADLINE_S), "no response started"
    client.leave()
    assert_left(verify.one_row(client.request_id))
    assert [m["type"] for m in client.sent] == ["http.response.start"]


def test_api_stream_left_before_its_first_byte_closes_upstream(
    verify: Served, api: FakeAPI
) -> None:
    api.set(reply=LONG_REPLY, per_token_s=0.2)
    client = Scripted(verify, api_stream(), **{"x-frugal-route": "api"})
    assert client.started.wait(DEADLINE_S), "no response started"
    assert api.count == 1  # upstream is streaming its answer
    client.leave()
    wait_for(lambda: api.disconnects == 1, "the upstream connection to close")
    row = verify.one_row(client.request_id)
    assert_left(row)
    assert (row["route"], row["upstream_attempts"]) == ("api", 1)


# -- API streams -----------------------------------------------------------------------------


def left_mid_api_stream(
    served: Served, api: FakeAPI, body: dict[str, Any], path: str = "/v1/chat/completions"
) -> dict[str, Any]:
    """Ask ``body`` on the API route, the upstream slow to stream a long answer; leave once some
    of it came through, and wait for the proxy to close the upstream connection. The request's
    row, checked as left by the client."""
    api.set(reply=LONG_REPLY, per_token_s=0.2)
    sock, request_id = send(served, body, path=path, **{"x-frugal-route": "api"})
    with sock:
        read_until(sock, b"word1")  # some of the answer has come through
    wait_for(lambda: api.disconnects == 1, "the upstream connection to close")
    row = served.one_row(request_id)
    assert_left(row)
    return row


def test_api_stream_left_mid_stream_closes_upstream(verify: Served, api: FakeAPI) -> None:
    row = left_mid_api_stream(verify, api, api_stream())
    assert (row["route"], row["reason"], row["upstream_attempts"]) == ("api", "forced", 1)


def test_a_responses_stream_of_the_apis_own_left_mid_stream_is_charged_what_came(
    verify: Served, api: FakeAPI
) -> None:
    """``/v1/responses`` relays the upstream's own typed events: a client that leaves closes
    the upstream connection, and the row counts the text that came (or the usage, if the
    upstream's last event came while it was read on)."""
    body = {"model": "gpt-4o-mini", "input": LONG[0]["content"], "stream": True}
    row = left_mid_api_stream(verify, api, body, path="/v1/responses")
    assert (row["endpoint"], row["route"], row["upstream_attempts"]) == ("responses", "api", 1)
    assert row["completion_tokens"] >= 2 and row["prompt_tokens"] > 0


def test_api_stream_row_counts_the_attempts_it_took(verify: Served, api: FakeAPI) -> None:
    api.set(fail_status=429, fail_times=1, retry_after=0)
    sock, request_id = send(verify, api_stream(), connection="close", **{"x-frugal-route": "api"})
    with sock:
        read_until(sock, b"data: [DONE]")
    assert api.count == 2
    row = verify.one_row(request_id)
    assert (row["status"], row["error"], row["upstream_attempts"]) == (200, None, 2), row
