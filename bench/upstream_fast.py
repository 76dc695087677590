"""A minimal OpenAI-compatible upstream for the overhead benchmark: raw asyncio, canned answers.

``tests/fake_api.py`` (Starlette on uvicorn) is the upstream of the tests: it records requests and
has fault knobs, and it costs about as much CPU per request as a small proxy does. Measuring a
proxy's overhead against it mostly measures the fake. This server does the least an HTTP/1.1
server can: it reads a request head and a ``Content-Length`` body from a keep-alive connection
and writes back a canned ``chat.completion`` (or, when the body asks for ``"stream":true``, the
same answer as a few SSE events with a usage chunk). It is meant for loopback load tests only.

    python bench/upstream_fast.py --port 9999
    curl -s localhost:9999/v1/chat/completions -d '{"model":"gpt-4o-mini","messages":[]}'

It counts the chat requests it answered; ``GET /count`` returns that number as text, so a
benchmark can check how many requests a proxy actually sent upstream.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import time

REPLY = "Paris is the capital of France."
USAGE = {"prompt_tokens": 14, "completion_tokens": 7, "total_tokens": 21}


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
        self.not_found = _response("404 Not Found", "application/json", b'{"error":"not found"}')
        self.count = 0


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
        if path.endswith(b"/chat/completions"):
            canned.count += 1
            stream = b'"stream":true' in body or b'"stream": true' in body
            self.transport.write(canned.sse if stream else canned.json)
        elif path == b"/count":
            self.transport.write(_response("200 OK", "text/plain", str(canned.count).encode()))
        else:
            self.transport.write(canned.not_found)


async def serve(host: str, port: int, model: str) -> None:
    canned = Canned(model)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: Connection(canned), host, port, backlog=1024)
    print(f"fast upstream on http://{host}:{port}/v1", flush=True)
    async with server:
        await server.serve_forever()


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
