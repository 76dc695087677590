"""The request head's guards (proxy/server/limits.py): uvicorn's httptools protocol held to a
deadline for the headers, a 16 KiB head and a ``Host`` on HTTP/1.1, as h11 held it. A real
uvicorn serves a small app on loopback; the client is a raw socket, so every byte is ours.
(tests/server/test_security.py runs the deadlines and the body limits through ``frugal serve``.)"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator

import pytest
import uvicorn
from starlette.types import Receive, Scope, Send

from proxy.server.limits import MAX_HEAD_BYTES, guarded_protocol
from tests.loopback import ThreadedServer


async def echo_app(scope: Scope, receive: Receive, send: Send) -> None:
    """200 with the request's body length and headers' names, once the body is read."""
    if scope["type"] != "http":
        return
    size, more = 0, True
    while more:
        message = await receive()
        size += len(message.get("body", b""))
        more = message.get("more_body", False)
    body = json.dumps({"size": size, "headers": [k.decode() for k, _ in scope["headers"]]})
    length = [(b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": length})
    await send({"type": "http.response.body", "body": body.encode()})


@pytest.fixture(scope="module")
def port() -> Iterator[int]:
    config = uvicorn.Config(echo_app, http=guarded_protocol(0.5), log_level="error", lifespan="off")
    server = ThreadedServer(config, name="limits")
    yield server.start()
    server.stop()


def exchange(port: int, *chunks: bytes) -> bytes:
    """Send ``chunks`` one after another, then read until the server closes (or 10 s pass)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        try:
            for chunk in chunks:
                sock.sendall(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass  # refused before we were done
        data = b""
        try:
            while piece := sock.recv(65536):
                data += piece
                if complete(data):
                    break  # a kept-alive answer, all of it
        except (ConnectionResetError, TimeoutError):
            pass
    return data


def complete(data: bytes) -> bool:
    """Whether ``data`` holds a whole answer with a Content-Length."""
    top, sep, body = data.partition(b"\r\n\r\n")
    for line in top.lower().split(b"\r\n"):
        if sep and line.startswith(b"content-length:"):
            return len(body) >= int(line.split(b":", 1)[1])
    return False


def head(extra: bytes = b"", *, host: bool = True, version: bytes = b"1.1") -> bytes:
    host_line = b"host: 127.0.0.1\r\n" if host else b""
    return b"GET /x HTTP/" + version + b"\r\n" + host_line + extra + b"\r\n"


def padding(total: int) -> bytes:
    """Header lines of about ``total`` bytes in all."""
    line = b"x-pad-%05d: " + b"a" * 90 + b"\r\n"
    return b"".join(line % i for i in range(total // len(line % 0)))


def test_a_head_under_the_limit_is_served(port: int) -> None:
    answer = exchange(port, head(padding(MAX_HEAD_BYTES - 1024)))
    assert answer.startswith(b"HTTP/1.1 200 ")
    assert "x-pad-00000" in json.loads(answer.split(b"\r\n\r\n", 1)[1])["headers"]


@pytest.mark.parametrize("pieces", [1, 64], ids=["one-send", "in-pieces"])
def test_a_head_over_16_kib_gets_400_and_the_connection_is_closed(port: int, pieces: int) -> None:
    request = head(padding(MAX_HEAD_BYTES + 2048))
    step = -(-len(request) // pieces)
    answer = exchange(port, *(request[i : i + step] for i in range(0, len(request), step)))
    assert answer.startswith(b"HTTP/1.1 400 ")
    assert b"connection: close" in answer.lower()


def test_a_header_value_that_never_ends_is_not_buffered_past_the_limit(port: int) -> None:
    start = b"GET /x HTTP/1.1\r\nhost: 127.0.0.1\r\nx-endless: "
    answer = exchange(port, start, *(b"a" * 4096 for _ in range(8)))
    assert answer.startswith(b"HTTP/1.1 400 ")


def test_http_1_1_must_name_its_host_and_http_1_0_need_not(port: int) -> None:
    assert exchange(port, head(host=False)).startswith(b"HTTP/1.1 400 ")
    assert b" 200 " in exchange(port, head(host=False, version=b"1.0")).split(b"\r\n", 1)[0]


def test_a_content_length_beside_a_transfer_encoding_is_refused(port: int) -> None:
    smuggled = (
        b"POST /x HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-length: 4\r\n"
        b"transfer-encoding: chunked\r\n\r\n0\r\n\r\n"
    )
    assert exchange(port, smuggled).startswith(b"HTTP/1.1 400 ")


def test_a_connection_that_sends_no_head_in_time_gets_408(port: int) -> None:
    answer = exchange(port, b"GET /x HTTP/1.1\r\nhost: 127.0.0.1\r\n")
    assert answer.startswith(b"HTTP/1.1 408 ")
    assert json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"]["code"] == "request_timeout"


def test_a_kept_alive_connection_serves_its_next_request_and_times_out_its_next_head(
    port: int,
) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        for _ in range(3):
            sock.sendall(head())
            answer = b""
            while not complete(answer):
                answer += sock.recv(65536)
            assert answer.startswith(b"HTTP/1.1 200 ")
        sock.sendall(b"GET /x HTTP/1.1\r\n")  # the next request, begun and never ended
        data = b""
        while piece := sock.recv(65536):
            data += piece
    assert data.startswith(b"HTTP/1.1 408 ")


async def test_a_body_whose_check_passes_its_time_gets_a_400_naming_the_field(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 24, row 3: the check in a thread has a time bound as well as the size bounds; past
    it the request gets a 400 naming the schema the check was on, and the loop is not held."""
    import json as json_mod
    import threading

    from starlette.requests import Request

    from proxy.errors import BadRequest
    from proxy.protocol.check_progress import note_field
    from proxy.serving import body_check

    monkeypatch.setattr(body_check, "CHECK_TIMEOUT_S", 0.2)
    raw = json_mod.dumps({"padding": "x" * (body_check.INLINE_BYTES + 1)}).encode()

    async def receive() -> dict[str, object]:
        return {"type": "http.request", "body": raw, "more_body": False}

    release = threading.Event()
    finished = threading.Event()

    def slow_check(body: dict[str, object]) -> dict[str, object]:
        note_field("tools[7].function.parameters")
        release.wait(30)  # a check that lasts until the test lets it end
        finished.set()
        return body

    checker = body_check.BodyChecker()
    try:
        with pytest.raises(BadRequest) as refused:
            await checker.read(Request({"type": "http", "method": "POST"}, receive), slow_check)
        assert not finished.is_set()  # answered at its bound, while the check still ran
        release.set()
        assert refused.value.param == "tools[7].function.parameters"
        assert "within 0.2 s" in str(refused.value)
        # A body checked in time is returned as parsed.
        quick = await checker.read(Request({"type": "http", "method": "POST"}, receive), dict)
        assert quick == json_mod.loads(raw)
    finally:
        checker.close()
