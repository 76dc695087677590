"""A minimal OpenAI-compatible upstream for the overhead benchmark: raw asyncio, canned answers.

``tests/fake_api.py`` (Starlette on uvicorn) is the upstream of the tests: it records requests and
has fault knobs, and it costs about as much CPU per request as a small proxy does. Measuring a
proxy's overhead against it mostly measures the fake. This server does the least an HTTP/1.1
server can: it reads a request head and a ``Content-Length`` body from a keep-alive connection
and writes back a canned ``chat.completion`` (or, when the body asks for ``"stream":true``, the
same answer as a few SSE events with a usage chunk). ``POST /v1/responses`` gets a canned
``response`` object, usage in the Responses shape (or, streamed, its typed events from
``response.created`` to ``response.completed``, each with its ``sequence_number``). It is meant
for loopback load tests only.

    python bench/upstream_fast.py --port 9999
    curl -s localhost:9999/v1/chat/completions -d '{"model":"gpt-4o-mini","messages":[]}'
    curl -s localhost:9999/v1/responses -d '{"model":"gpt-4o-mini","input":"hi"}'

It counts the chat and Responses requests it answered; ``GET /count`` returns their sum as
text (``GET /count/chat`` and ``GET /count/responses`` each one), so a benchmark can check how many
requests a proxy actually sent upstream, and to which endpoint.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPLY = "Paris is the capital of France."
UPSTREAM_KEY = "sk-bench-upstream-" + "0" * 16
"""The fallback key of the benchmarks' proxies (:func:`proxy_settings`)."""
USAGE = {"prompt_tokens": 14, "completion_tokens": 7, "total_tokens": 21}
RESPONSES_USAGE = {
    "input_tokens": 14,
    "input_tokens_details": {"cached_tokens": 0},
    "output_tokens": 7,
    "output_tokens_details": {"reasoning_tokens": 0},
    "total_tokens": 21,
}


def _completion(model: str) -> bytes:
    return json.dumps(
        {
            "id": "chatcmpl-fast",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "system_fingerprint": "fp_fast",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": REPLY, "refusal": None},
                    "logprobs": None,
                    "finish_reason": "stop",
                }
            ],
            "usage": USAGE,
        },
        separators=(",", ":"),
    ).encode()


def _events(model: str) -> bytes:
    base = {"id": "chatcmpl-fast", "object": "chat.completion.chunk", "created": 0, "model": model}

    def event(payload: dict[str, object]) -> bytes:
        return b"data: " + json.dumps({**base, **payload}, separators=(",", ":")).encode() + b"\n\n"

    def choice(delta: dict[str, str], finish: str | None = None) -> dict[str, object]:
        return {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}], "usage": None}

    out = [event(choice({"role": "assistant", "content": ""}))]
    out += [event(choice({"content": word})) for word in re.findall(r"\s*\S+", REPLY)]
    out.append(event(choice({}, "stop")))
    out.append(event({"choices": [], "usage": USAGE}))
    out.append(b"data: [DONE]\n\n")
    return b"".join(out)


def _output_item(status: str, text: str) -> dict[str, object]:
    part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
    return {
        "id": "msg_fast",
        "type": "message",
        "status": status,
        "role": "assistant",
        "content": [part] if text or status == "completed" else [],
    }


def _response_object(model: str, status: str = "completed") -> dict[str, object]:
    done = status == "completed"
    return {
        "id": "resp_fast",
        "object": "response",
        "created_at": int(time.time()),
        "status": status,
        "background": False,
        "error": None,
        "incomplete_details": None,
        "instructions": None,
        "max_output_tokens": None,
        "metadata": {},
        "model": model,
        "output": [_output_item("completed", REPLY)] if done else [],
        "parallel_tool_calls": True,
        "previous_response_id": None,
        "reasoning": {"effort": None, "summary": None},
        "store": False,
        "temperature": 1.0,
        "text": {"format": {"type": "text"}, "verbosity": "medium"},
        "tool_choice": "auto",
        "tools": [],
        "top_p": 1.0,
        "truncation": "disabled",
        "usage": RESPONSES_USAGE if done else None,
        "user": None,
    }


def _responses_events(model: str) -> bytes:
    """The typed events of one streamed Response, in OpenAI's order."""
    out: list[bytes] = []

    def event(kind: str, **payload: object) -> None:
        data = {"type": kind, "sequence_number": len(out), **payload}
        line = json.dumps(data, separators=(",", ":")).encode()
        out.append(b"event: " + kind.encode() + b"\ndata: " + line + b"\n\n")

    where = {"item_id": "msg_fast", "output_index": 0, "content_index": 0}
    empty = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
    event("response.created", response=_response_object(model, "in_progress"))
    event("response.in_progress", response=_response_object(model, "in_progress"))
    event("response.output_item.added", output_index=0, item=_output_item("in_progress", ""))
    event("response.content_part.added", **where, part=empty)
    for word in re.findall(r"\s*\S+", REPLY):
        event("response.output_text.delta", **where, delta=word, logprobs=[])
    event("response.output_text.done", **where, text=REPLY, logprobs=[])
    event("response.content_part.done", **where, part={**empty, "text": REPLY})
    event("response.output_item.done", output_index=0, item=_output_item("completed", REPLY))
    event("response.completed", response=_response_object(model))
    return b"".join(out)


def _response(status: str, content_type: str, body: bytes) -> bytes:
    head = (
        f"HTTP/1.1 {status}\r\ncontent-type: {content_type}\r\n"
        f"content-length: {len(body)}\r\nconnection: keep-alive\r\n\r\n"
    )
    return head.encode() + body


class Canned:
    """The answers, made once: the model name is fixed, so the bytes never change."""

    def __init__(self, model: str) -> None:
        self.json = _response("200 OK", "application/json", _completion(model))
        self.sse = _response("200 OK", "text/event-stream", _events(model))
        self.response = _response(
            "200 OK",
            "application/json",
            json.dumps(_response_object(model), separators=(",", ":")).encode(),
        )
        self.response_sse = _response("200 OK", "text/event-stream", _responses_events(model))
        self.not_found = _response("404 Not Found", "application/json", b'{"error":"not found"}')
        self.chat = 0
        self.responses = 0


class Connection(asyncio.Protocol):
    def __init__(self, canned: Canned) -> None:
        self.canned = canned
        self.buffer = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while True:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buffer[:end]
            length = 0
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            total = end + 4 + length
            if len(self.buffer) < total:
                return
            body = self.buffer[end + 4 : total]
            self.buffer = self.buffer[total:]
            self.answer(head.split(b" ", 2), body)

    def answer(self, request_line: list[bytes], body: bytes) -> None:
        assert self.transport is not None
        canned = self.canned
        path = request_line[1] if len(request_line) > 1 else b""
        stream = b'"stream":true' in body or b'"stream": true' in body
        if path.endswith(b"/chat/completions"):
            canned.chat += 1
            self.transport.write(canned.sse if stream else canned.json)
        elif path.endswith(b"/v1/responses"):
            canned.responses += 1
            self.transport.write(canned.response_sse if stream else canned.response)
        elif path.startswith(b"/count"):
            count = {b"/count/chat": canned.chat, b"/count/responses": canned.responses}.get(
                path, canned.chat + canned.responses
            )
            self.transport.write(_response("200 OK", "text/plain", str(count).encode()))
        else:
            self.transport.write(canned.not_found)


async def serve(host: str, port: int, model: str) -> None:
    canned = Canned(model)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: Connection(canned), host, port, backlog=1024)
    print(f"fast upstream on http://{host}:{port}/v1", flush=True)
    async with server:
        await server.serve_forever()


@contextlib.contextmanager
def started(port: int, cpu: int | None = None) -> Iterator[str]:
    """This server in a child process on ``port`` (pinned to ``cpu`` with taskset when given),
    once it accepts connections: yields its base URL (``.../v1``) and stops it on the way out."""
    pin = [] if cpu is None else ["taskset", "-c", str(cpu)]
    child = subprocess.Popen(
        [*pin, sys.executable, str(Path(__file__).resolve()), "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise SystemExit("the upstream did not start") from None
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        child.terminate()
        child.wait()


def proxy_settings(base: str, ledger: Path) -> dict[str, Any]:
    """The settings of a proxy built in a benchmark's own process (``config.from_dict``) whose
    fallback is the upstream at ``base``: one engine thread, JSON logs, one retry, the ledger
    file ``ledger``. The key is read from ``BENCH_UPSTREAM_KEY``: set it to :data:`UPSTREAM_KEY`
    before the app is built."""
    return {
        "server": {"log_format": "json"},
        "local": {"n_threads": 1},
        "fallback": {
            "api_base": base,
            "api_key_env": "BENCH_UPSTREAM_KEY",
            "max_retries": 1,
            "timeout_s": 30,
        },
        "ledger": {"path": str(ledger)},
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="A canned OpenAI-compatible upstream.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9999)
    parser.add_argument("--model", default="gpt-4o-mini", help="the model name in each answer")
    args = parser.parse_args(argv)
    try:
        asyncio.run(serve(args.host, args.port, args.model))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
