"""A fake OpenAI-compatible API: the external provider in tests and benchmarks.

It is a real HTTP server (Starlette on uvicorn) on a loopback port, run in a background thread, so
the code under test talks to it over real sockets exactly as it would talk to the provider.

    with FakeAPI() as api:            # or api = FakeAPI(); api.start(); ...; api.stop()
        api.set(fail_status=429, fail_times=1, retry_after=1)
        ...                           # point the client at api.url ("http://127.0.0.1:PORT/v1")
        assert api.count == 2

Knobs (plain attributes; ``set(**knobs)`` checks the names, ``reset()`` restores the defaults and
forgets the recorded requests):

- ``reply``: the assistant text; ``usage`` is derived from it (one token per word, see ``words``)
- ``latency_s``: delay before the response headers; ``per_token_s``: delay between stream chunks
- ``fail_status`` / ``fail_times``: answer that status to the next N requests (default -1: to all);
  ``retry_after`` goes into the ``Retry-After`` header of a 429 or 503; ``error_message`` replaces
  the default message of the error body (OpenAI's shape)
- ``hang``: read the request and never answer (until the client goes away or the server stops)
- ``hold``: read the request and wait while the knob stays set, then answer as without it
  (``set(hold=False)`` lets the held requests go on): a call kept under way for as long as a
  test needs
- ``cut_stream_after``: send N SSE events, then drop the connection without ``[DONE]``
- ``usage``: a dict merged over the derived usage (``{"prompt_tokens": 2**70}``: a provider that
  sends an absurd count), in plain answers and in the usage chunk of a stream
- ``bill_prompt_bytes``: count ``prompt_tokens`` as the request body's bytes // 4 (its compact
  JSON), roughly as OpenAI bills ``functions``, ``tools`` and ``response_format`` along with
  the messages, instead of the words of the messages alone; in plain answers and in the usage
  chunk of a stream (``usage`` still wins over it)
- ``reset_after_request``: read the whole request, then abort the connection with a TCP RST
  (SO_LINGER 0) instead of answering: the provider took the request and its reply was lost
- ``require_key``: the bearer key expected; anything else gets OpenAI's 401
- ``models``: what ``GET /v1/models`` lists
- ``oracle``: an object whose ``reply_for(body)`` gives the reply to a chat request (None: use
  ``reply``); :class:`DevSetOracle` answers the dev set's prompts with their right answers and
  plays the audit judge (``docs/audit.md``) with the dev set's graders, strict or content-only
- ``tool_call``: ``{"name": ..., "arguments": {...}}``: a plain chat request that offers tools and
  ends with the user's message gets that call (``finish_reason: "tool_calls"``), each time with
  a new call id, and streamed as OpenAI streams a call (``delta.tool_calls``: the id and name
  first, then the arguments in pieces); once a tool's result follows, the ``reply`` text, as a
  model that used one tool, so an agent loop ends
- ``tool_call_loop``: with ``tool_call``, make the call again after its result too, as a small
  model stuck in an agent loop does (what the gate must not accept from a local backend)
- ``tool_script``: a list of such calls, made in order, one per request, as a model that uses
  several tools in turn (an agent that hands off, then calls the specialist's tool): a request
  (chat or ``/v1/responses``) that offers a function named as the next call gets that call,
  whatever its input ends with, and the script moves on; a request that does not offer it is
  answered as without the knob (``tool_call``, or the ``reply``). Every call has a new call id;
  ``set`` copies the list, and what is left of it is ``tool_script``
- ``batch_polls``, ``batch_seconds``, ``batch_fail``, ``batch_expire_after``,
  ``batch_line_error``, ``batch_output_extra``, ``batch_unsupported``: the Files and Batch
  APIs' knobs (a slow, failed or expired batch, a failed line, a hostile output file, a
  provider without batches), described in
  :mod:`tests.fake_batch`, which serves ``/v1/files`` and ``/v1/batches`` as OpenAI's do
- ``served_tier``: the ``service_tier`` a chat answer (and each of its stream's chunks) says it
  was served at, as OpenAI's do (None: the field is left out)
- ``refusal``: a text: a plain chat answer refuses, as OpenAI's does (its message's ``content``
  null and ``refusal`` that text; a chat stream and a tool call are as without the knob), and
  so does a ``/v1/responses`` answer (its message's one part a ``refusal``, streamed with
  ``response.refusal.delta`` and ``.done``)
- ``thinking``: a text: a plain chat answer's message carries it as ``reasoning_content``, as
  vLLM's and DeepSeek's do for a model that thinks (a chat stream is as without the knob); a
  ``/v1/responses`` answer's ``reasoning`` item (asked with ``reasoning``) carries it as its
  ``reasoning_text`` part, streamed with ``response.reasoning_text.delta`` and ``.done``
- ``failed_response``: a message: a streamed ``/v1/responses`` answer ends with
  ``response.failed`` (``status: failed``, ``error.code: server_error``, that message)
- ``huge_reply_bytes``: a chat answer whose text is that many bytes (``a``), sent 1 MiB at a
  time and never held whole: a plain answer's JSON body without a ``Content-Length``, or a
  stream whose one content event is a single line that long (a server that answers far too
  much); ``huge_sent`` counts the bytes that went out before the client left. Set, it is
  also the answer to a POST on any path the fake does not serve (another provider's wire)
- ``huge_aws_frame``: with ``huge_reply_bytes``, a stream is sent as one frame of AWS's binary
  event stream (bedrock's), its prelude saying its length, and the bytes after it.
- ``echo_auth``: an upstream (or a gateway) that repeats what it was sent: every error body
  (``fail_status``) says the request's ``Authorization`` value, the bare key after ``Bearer``
  and that key URL-encoded, in its message, and the bare key in its ``param`` and ``code``; a
  stream (chat, or ``/v1/responses``) sends its text, then such an error (a ``data: {"error":
  ...}`` event, or ``response.failed``) instead of its end

``POST /v1/responses`` answers as OpenAI's Responses API does (:meth:`FakeAPI._responses`): a
``response`` object with the ``reply`` as one message item (cut by ``max_output_tokens``:
``incomplete``), usage in the Responses' shape (``input_tokens``: the words of every input
text; ``usage`` merged over it), or with ``stream: true`` its typed events, each with its
``sequence_number``. ``tool_call`` works as on chat (a ``function_call`` item when the input
ends with the user's message); a built-in tool (``web_search``...) adds its ``*_call`` item
before the message, and ``reasoning`` a ``reasoning`` item, as a model that used them. The
fault knobs of ``_enter`` apply, and ``cut_stream_after``.

Every request is recorded (unless ``FakeAPI(record=False)``, as the script runs it): ``requests``
holds ``(path, headers, body)`` tuples (headers with lower-case names, the parsed JSON body or
None), ``request_times`` the ``time.monotonic()`` of each arrival, and ``count`` how many there
were. ``disconnects`` counts the requests whose client went away before the answer was
complete (a ``hang``, or a stream still being sent), and ``resets`` the connections aborted by
``reset_after_request``. ``max_tokens`` cuts the reply (``finish_reason: "length"``); a plain
answer has ``n`` choices, and its usage bills each of them (each of ``best_of`` on completions);
embeddings are deterministic 8-dimensional vectors, as floats or base64 (what the openai
client asks for by default).

Run it alone for benchmarks: ``python -m tests.fake_api --port 9999 --latency 0``.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import hashlib
import json
import re
import socket
import struct
import threading
import time
import urllib.parse
import zlib
from collections.abc import Iterator
from types import TracebackType
from typing import Any, NamedTuple

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from tests.fake_batch import ENDPOINTS, LINE_SCOPE, FakeBatches
from tests.loopback import ThreadedServer, quiet_config

DEFAULT_REPLY = "Paris is the capital of France."
EMBEDDING_DIM = 8

DEFAULTS: dict[str, Any] = {
    "reply": DEFAULT_REPLY,
    "latency_s": 0.0,
    "per_token_s": 0.0,
    "fail_status": None,
    "fail_times": -1,
    "retry_after": None,
    "error_message": None,
    "hang": False,
    "hold": False,
    "cut_stream_after": None,
    "usage": None,
    "bill_prompt_bytes": False,
    "reset_after_request": False,
    "require_key": None,
    "models": ("gpt-4o-mini", "gpt-4o"),
    "oracle": None,
    "tool_call": None,
    "tool_call_loop": False,
    "tool_script": (),
    "refusal": None,
    "thinking": None,
    "failed_response": None,
    "huge_reply_bytes": None,
    "huge_aws_frame": False,
    "echo_auth": False,
    "served_tier": None,
    "batch_polls": 0,
    "batch_seconds": 0.0,
    "batch_fail": None,
    "batch_expire_after": None,
    "batch_line_error": None,
    "batch_output_extra": (),
    "batch_unsupported": None,
}

_ERROR_TYPES = {
    400: ("invalid_request_error", None),
    401: ("invalid_request_error", "invalid_api_key"),
    404: ("invalid_request_error", "model_not_found"),
    408: ("timeout", None),
    429: ("requests", "rate_limit_exceeded"),
}
_WORD = re.compile(r"\s*\S+")


class Recorded(NamedTuple):
    path: str
    headers: dict[str, str]
    body: Any


def words(text: str) -> list[str]:
    """``text`` cut into stream pieces, one per word with its leading space (the token count)."""
    return _WORD.findall(text)


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return ""


def prompt_tokens(body: dict[str, Any]) -> int:
    """Words in every message (chat) or in the prompt (legacy completions)."""
    if "messages" in body:
        return sum(len(words(_text_of(m.get("content")))) for m in body.get("messages") or [])
    prompt = body.get("prompt", "")
    texts = prompt if isinstance(prompt, list) else [prompt]
    return sum(len(words(t)) for t in texts if isinstance(t, str))


def body_tokens(body: dict[str, Any]) -> int:
    """The whole body as a provider that bills every field of it would count it: the bytes of
    its compact JSON, about 4 a token."""
    raw = json.dumps(body, ensure_ascii=False, separators=(",", ":"))
    return len(raw.encode("utf-8")) // 4


def _count(body: dict[str, Any], field: str) -> int:
    """``n`` or ``best_of`` of a request (1 when absent or not a small positive int)."""
    value = body.get(field)
    return value if isinstance(value, int) and 0 < value <= 128 else 1


def usage_for(
    body: dict[str, Any], completion_tokens: int, *, by_bytes: bool = False
) -> dict[str, int]:
    """The usage of an answer: the prompt by its words (or, ``by_bytes``, by the body's bytes,
    :func:`body_tokens`), and ``completion_tokens``."""
    prompt = body_tokens(body) if by_bytes else prompt_tokens(body)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt + completion_tokens,
    }


def _error(status: int, message: str) -> dict[str, Any]:
    type_, code = _ERROR_TYPES.get(status, ("server_error", None))
    return {"error": {"message": message, "type": type_, "param": None, "code": code}}


def _echoed(error: dict[str, Any], request: Request) -> dict[str, Any]:
    """``error`` (OpenAI's shape) repeating the request's ``Authorization``: the knob
    ``echo_auth``, as a careless upstream or gateway does."""
    sent = request.headers.get("authorization") or ""
    bare = sent.partition(" ")[2] or sent
    said = f"{error['error']['message']}; you sent Authorization: {sent!r}, key {bare}"
    said += f", as a query: api_key={urllib.parse.quote(bare, safe='')}"
    return {"error": {**error["error"], "message": said, "param": bare, "code": bare}}


def _vector(text: str) -> list[float]:
    digest = hashlib.sha256(text.encode()).digest()
    return [round(b / 127.5 - 1.0, 6) for b in digest[:EMBEDDING_DIM]]


def _watch_disconnect(receive: Receive) -> tuple[asyncio.Event, asyncio.Task[None]]:
    """An event set once the client has left, and the task that reads ``receive`` for it (the
    caller cancels the task when its answer is done)."""
    gone = asyncio.Event()

    async def watch() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        gone.set()

    return gone, asyncio.create_task(watch())


class _SSE(Response):
    """Streams prepared events; with ``cut_after`` it drops the connection after that many.
    A client that leaves before the last event is counted in ``api.disconnects``."""

    def __init__(
        self,
        events: list[bytes],
        *,
        per_token_s: float,
        cut_after: int | None,
        api: FakeAPI | None = None,
    ) -> None:
        super().__init__(media_type="text/event-stream")
        self.api = api
        self.raw_headers = [h for h in self.raw_headers if h[0] != b"content-length"]
        self.raw_headers.append((b"cache-control", b"no-cache"))
        self.events = events
        self.per_token_s = per_token_s
        self.cut_after = cut_after

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        gone, watcher = _watch_disconnect(receive)
        if self.api is not None:
            with self.api._lock:
                self.api.open_streams += 1
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            for i, data in enumerate(self.events):
                if self.cut_after is not None and i >= self.cut_after:
                    # Returning without the final body message makes uvicorn close the socket:
                    # the client sees a chunked body that never ends.
                    return
                if i and self.per_token_s:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(gone.wait(), self.per_token_s)
                if gone.is_set():
                    if self.api is not None:
                        with self.api._lock:
                            self.api.disconnects += 1
                    return
                await send({"type": "http.response.body", "body": data, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            watcher.cancel()
            if self.api is not None:
                with self.api._lock:
                    self.api.open_streams -= 1


class _Huge(Response):
    """The knob ``huge_reply_bytes``: a chat answer of ``size`` bytes of text, sent a MiB at a
    time (one MiB object, sent again and again), until it is all out or the client has left."""

    def __init__(self, api: FakeAPI, base: dict[str, Any], size: int, *, stream: bool) -> None:
        super().__init__(media_type="text/event-stream" if stream else "application/json")
        self.raw_headers = [h for h in self.raw_headers if h[0] != b"content-length"]
        self.api, self.size = api, size
        if stream and api.huge_aws_frame:  # one AWS event-stream frame that says its length
            self.media_type = "application/vnd.amazon.eventstream"
            self.raw_headers = [
                (b"content-type", self.media_type.encode()) if h[0] == b"content-type" else h
                for h in self.raw_headers
            ]
            prelude = (size + 16).to_bytes(4, "big") + (0).to_bytes(4, "big")
            self.head = prelude + zlib.crc32(prelude).to_bytes(4, "big")
            self.tail = b"\0\0\0\0"
        elif stream:
            chunk = {**base, "object": "chat.completion.chunk"}
            delta = '"choices":[{"index":0,"delta":{"content":"'
            self.head = ("data: " + json.dumps(chunk)[:-1] + "," + delta).encode()
            self.tail = b'"},"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n'
        else:
            message = '"choices":[{"index":0,"message":{"role":"assistant","content":"'
            self.head = (json.dumps(base)[:-1] + "," + message).encode()
            self.tail = b'"},"finish_reason":"stop"}],"usage":null}'

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        gone, watcher = _watch_disconnect(receive)
        piece = b"a" * (1 << 20)
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            await send({"type": "http.response.body", "body": self.head, "more_body": True})
            left = self.size
            while left > 0 and not gone.is_set():
                out = piece if left >= len(piece) else piece[:left]
                await send({"type": "http.response.body", "body": out, "more_body": True})
                left -= len(out)
                with self.api._lock:
                    self.api.huge_sent += len(out)
                await asyncio.sleep(0)  # let the disconnect be seen
            if gone.is_set():
                return
            await send({"type": "http.response.body", "body": self.tail, "more_body": False})
        finally:
            watcher.cancel()


class FakeAPI:
    """An OpenAI-compatible server on ``host:port`` (port 0 picks a free one)."""

    reply: str
    latency_s: float
    per_token_s: float
    fail_status: int | None
    fail_times: int
    retry_after: float | str | None
    error_message: str | None
    hang: bool
    hold: bool
    cut_stream_after: int | None
    usage: dict[str, Any] | None
    bill_prompt_bytes: bool
    reset_after_request: bool
    require_key: str | None
    models: tuple[str, ...]
    echo_auth: bool
    refusal: str | None
    thinking: str | None

    def __init__(
        self, *, host: str = "127.0.0.1", port: int = 0, record: bool = True, **knobs: Any
    ) -> None:
        self.host = host
        self.port = port
        self.record = record
        self.requests: list[Recorded] = []
        self.request_times: list[float] = []
        self.disconnects = 0
        self.resets = 0
        self.open_streams = 0  # event streams being sent now
        self.huge_sent = 0  # bytes of huge_reply_bytes answers sent
        self.batches_made = 0  # batches created (POST /v1/batches), see tests/fake_batch.py
        self.batch_lines: list[tuple[str, str, Any]] = []  # (custom_id, url, body) of each
        self.batch_api = FakeBatches(self)
        self._lock = threading.Lock()
        self._seq = 0
        self._stopping = False
        self._served: ThreadedServer | None = None
        self.reset()
        self.set(**knobs)
        self._routes = Starlette(
            routes=[
                *(
                    Route(url, answer, methods=["POST"])
                    for url, answer in self.line_handlers().items()
                ),
                Route("/v1/models", self._models, methods=["GET"]),
                Route("/v1/responses/compact", self._compact, methods=["POST"]),
                *self.batch_api.routes(),
                Route("/{path:path}", self._elsewhere, methods=["POST"]),
            ]
        )

        self.app = _KeepSend(self._routes)

    # -- knobs and records -------------------------------------------------------------------

    def set(self, **knobs: Any) -> None:
        unknown = sorted(set(knobs) - set(DEFAULTS))
        if unknown:
            raise TypeError(f"unknown FakeAPI knob {unknown[0]!r}; known: {', '.join(DEFAULTS)}")
        for name, value in knobs.items():
            setattr(self, name, list(value) if name == "tool_script" else value)

    def reset(self) -> None:
        """Default knobs, no recorded requests."""
        with self._lock:
            for name, value in DEFAULTS.items():
                setattr(self, name, list(value) if name == "tool_script" else value)
            self.disconnects = self.resets = self.huge_sent = self.batches_made = 0
            self.requests.clear()
            self.request_times.clear()
            self.batch_lines.clear()
            self.batch_api.reset()

    @property
    def count(self) -> int:
        return len(self.requests)

    @property
    def single_calls(self) -> int:
        """Requests to the answering endpoints (chat, completions, responses, embeddings) made
        one by one, not as lines of a batch."""
        return sum(1 for r in self.requests if r.path in ENDPOINTS)

    def line_handlers(self) -> dict[str, Any]:
        """The endpoint that answers each ``url`` of :data:`~tests.fake_batch.ENDPOINTS`: a
        request to it (a POST route of its own), and a batch line that names it."""
        return {
            "/v1/chat/completions": self._chat,
            "/v1/completions": self._completions,
            "/v1/responses": self._responses,
            "/v1/embeddings": self._embeddings,
        }

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    # -- life cycle --------------------------------------------------------------------------

    def start(self) -> FakeAPI:
        config = quiet_config(self.app, graceful_s=2)
        self._stopping = False
        self._served = ThreadedServer(config, host=self.host, port=self.port, name="fake-api")
        self.port = self._served.start()
        return self

    def stop(self) -> None:
        if self._served is None:
            return
        self._stopping = True
        self._served.stop()
        self._served = None

    def __enter__(self) -> FakeAPI:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- behaviour shared by every endpoint --------------------------------------------------

    async def _enter(
        self, request: Request, *, json_body: bool = True
    ) -> tuple[Any, Response | None]:
        """Record the request and apply the fault knobs; a Response means answer that instead.
        ``json_body=False``: the body is not read here (a multipart upload, a cancel). A batch's
        line (:data:`tests.fake_batch.LINE_SCOPE`) is neither recorded nor faulted."""
        body: Any = None
        if request.method == "POST" and json_body:
            raw = await request.body()
            try:
                body = json.loads(raw) if raw else None
            except ValueError:
                body = None
        if request.scope.get(LINE_SCOPE):
            bad = JSONResponse(_error(400, "the body is not a JSON object"), 400)
            return body, None if isinstance(body, dict) else bad
        with self._lock:
            if self.record:
                self.requests.append(Recorded(request.url.path, dict(request.headers), body))
                self.request_times.append(time.monotonic())
            failing = self.fail_status is not None and self.fail_times != 0
            if failing and self.fail_times > 0:
                self.fail_times -= 1
        if self.latency_s:
            await asyncio.sleep(self.latency_s)
        if self.reset_after_request:
            _reset(request)
            with self._lock:
                self.resets += 1
            return body, Response(status_code=204)  # never reaches the aborted connection
        while self.hold and not self._stopping:
            await asyncio.sleep(0.02)
        if self.hang:
            while not self._stopping:
                if await request.is_disconnected():
                    with self._lock:
                        self.disconnects += 1
                    break
                await asyncio.sleep(0.02)
            return body, JSONResponse(_error(503, "the fake API is shutting down"), 503)
        key = self.require_key
        if key is not None and request.headers.get("authorization") != f"Bearer {key}":
            shown = (request.headers.get("authorization") or "")[7:]
            shown = shown[:3] + "*" * 4 + shown[-4:] if shown else "(none)"
            message = f"Incorrect API key provided: {shown}."
            return body, JSONResponse(_error(401, message), 401)
        if failing and self.fail_status is not None:
            status = self.fail_status
            message = self.error_message or f"the fake API was told to fail with {status}"
            headers = {}
            if self.retry_after is not None and status in (429, 503):
                headers["retry-after"] = str(self.retry_after)
            error = _error(status, message)
            if self.echo_auth:
                error = _echoed(error, request)
            return body, JSONResponse(error, status, headers=headers)
        if request.method == "POST" and json_body and not isinstance(body, dict):
            return body, JSONResponse(_error(400, "the body is not a JSON object"), 400)
        return body, None

    def _next_id(self, prefix: str) -> str:
        with self._lock:
            self._seq += 1
            return f"{prefix}-fake-{self._seq}"

    def _pieces(self, body: dict[str, Any]) -> tuple[list[str], str]:
        reply = self.oracle.reply_for(body) if self.oracle is not None else None
        pieces = words(self.reply if reply is None else reply)
        limit = body.get("max_completion_tokens") or body.get("max_tokens")
        if isinstance(limit, int) and 0 < limit < len(pieces):
            return pieces[:limit], "length"
        return pieces, "stop"

    def _tool_call(self, body: dict[str, Any]) -> dict[str, Any] | None:
        """The knob ``tool_call`` (``{"name": ..., "arguments": {...}}``): a request that
        offers tools and whose last message is the user's is answered with that call, as a
        model that decides to use a tool; once the tool's result is in, the text reply."""
        messages = body.get("messages")
        tools = [t for t in body.get("tools") or [] if isinstance(t, dict)]
        scripted = self._scripted([(t.get("function") or {}).get("name") for t in tools])
        if scripted is not None:
            return {"id": self._next_id("call"), "type": "function", "function": scripted}
        if self.tool_call is None or not body.get("tools") or not isinstance(messages, list):
            return None
        if not messages or not isinstance(messages[-1], dict):
            return None
        if messages[-1].get("role") != "user" and not self.tool_call_loop:
            return None
        arguments = json.dumps(self.tool_call["arguments"])
        function = {"name": self.tool_call["name"], "arguments": arguments}
        return {"id": self._next_id("call"), "type": "function", "function": function}

    def _scripted(self, offered: list[Any]) -> dict[str, str] | None:
        """The knob ``tool_script``: its next call (name and JSON arguments) if the request
        offers that function, taken off the script; else None."""
        with self._lock:
            if not self.tool_script or self.tool_script[0]["name"] not in offered:
                return None
            call = self.tool_script.pop(0)
        return {"name": call["name"], "arguments": json.dumps(call["arguments"])}

    def _usage(self, body: dict[str, Any], completion_tokens: int) -> dict[str, Any]:
        """The usage an answer reports, as the knobs ``bill_prompt_bytes`` and ``usage`` say."""
        derived = usage_for(body, completion_tokens, by_bytes=self.bill_prompt_bytes)
        return {**derived, **(self.usage or {})}

    # -- endpoints ---------------------------------------------------------------------------

    async def _elsewhere(self, request: Request) -> Response:
        """A POST to any other path (another provider's wire: ``/v1/messages``, ``/api/chat``):
        the ``huge_reply_bytes`` answer when it is set (its bytes are what is tested, not its
        shape), else a 404."""
        if self.huge_reply_bytes is None:
            return JSONResponse({"error": {"message": "not found"}}, status_code=404)
        body, early = await self._enter(request)
        if early is not None:
            return early
        base = {"id": self._next_id("chatcmpl"), "object": "chat.completion", "model": ""}
        asked = isinstance(body, dict) and bool(body.get("stream"))
        stream = asked or "stream" in request.url.path.lower()
        return _Huge(self, base, int(self.huge_reply_bytes), stream=stream)

    async def _chat(self, request: Request) -> Response:
        body, early = await self._enter(request)
        if early is not None:
            return early
        pieces, finish = self._pieces(body)
        base = {
            "id": self._next_id("chatcmpl"),
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model", ""),
            "system_fingerprint": "fp_fake",
            **({"service_tier": self.served_tier} if self.served_tier else {}),
        }
        if self.huge_reply_bytes is not None:
            return _Huge(self, base, int(self.huge_reply_bytes), stream=bool(body.get("stream")))
        call = self._tool_call(body)
        if call is not None and body.get("stream"):
            usage = self._usage(body, len(words(call["function"]["arguments"])))
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            events = list(self._call_chunks(base, call, usage if include_usage else None))
            cut = self.cut_stream_after
            return _SSE(events, per_token_s=self.per_token_s, cut_after=cut, api=self)
        if call is not None:
            message = {"role": "assistant", "content": None, "tool_calls": [call]}
            choice = {"index": 0, "message": message, "logprobs": None}
            usage = self._usage(body, len(words(call["function"]["arguments"])))
            return JSONResponse(
                {**base, "choices": [{**choice, "finish_reason": "tool_calls"}], "usage": usage}
            )
        if not body.get("stream"):
            message = {"role": "assistant", "content": "".join(pieces), "refusal": None}
            if self.refusal is not None:
                message = {"role": "assistant", "content": None, "refusal": self.refusal}
            if self.thinking is not None:
                message = {**message, "reasoning_content": self.thinking}
            choices = [
                {"index": i, "message": message, "logprobs": None, "finish_reason": finish}
                for i in range(_count(body, "n"))
            ]  # each choice is billed, as OpenAI bills them
            usage = self._usage(body, len(pieces) * len(choices))
            return JSONResponse({**base, "choices": choices, "usage": usage})
        usage = self._usage(body, len(pieces))
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        events = list(self._chunks(base, pieces, finish, usage if include_usage else None))
        if self.echo_auth:  # the text, then an error event that repeats the key, then [DONE]
            error = _echoed(_error(500, "the stream failed"), request)
            events[len(pieces) + 1 :] = [
                b"data: " + json.dumps(error).encode() + b"\n\n",
                b"data: [DONE]\n\n",
            ]
        return _SSE(events, per_token_s=self.per_token_s, cut_after=self.cut_stream_after, api=self)

    @staticmethod
    def _call_chunks(
        base: dict[str, Any], call: dict[str, Any], usage: dict[str, int] | None
    ) -> Iterator[bytes]:
        """A tool call as OpenAI streams one: role, the call's id and name with empty
        arguments, the arguments in pieces, finish ``tool_calls``, [usage], [DONE]."""
        head = {**call, "index": 0, "function": {**call["function"], "arguments": ""}}
        arguments = call["function"]["arguments"]
        pieces = [
            {"tool_calls": [{"index": 0, "function": {"arguments": arguments[at : at + 8]}}]}
            for at in range(0, len(arguments), 8)
        ]
        deltas = [{"role": "assistant", "content": None, "refusal": None}, {"tool_calls": [head]}]
        return _chat_chunks(base, [*deltas, *pieces], "tool_calls", usage)

    @staticmethod
    def _chunks(
        base: dict[str, Any], pieces: list[str], finish: str, usage: dict[str, int] | None
    ) -> Iterator[bytes]:
        """The events OpenAI sends: role, one per piece, finish, [usage], [DONE]."""
        role = {"role": "assistant", "content": "", "refusal": None}
        return _chat_chunks(base, [role, *({"content": piece} for piece in pieces)], finish, usage)

    async def _completions(self, request: Request) -> Response:
        body, early = await self._enter(request)
        if early is not None:
            return early
        pieces, finish = self._pieces(body)
        n = _count(body, "n")
        choices = [
            {"text": "".join(pieces), "index": i, "logprobs": None, "finish_reason": finish}
            for i in range(n)
        ]
        generated = max(n, _count(body, "best_of"))  # best_of are all generated and billed
        return JSONResponse(
            {
                "id": self._next_id("cmpl"),
                "object": "text_completion",
                "created": int(time.time()),
                "model": body.get("model", ""),
                "choices": choices,
                "usage": self._usage(body, len(pieces) * generated),
            }
        )

    async def _embeddings(self, request: Request) -> Response:
        body, early = await self._enter(request)
        if early is not None:
            return early
        inputs = body.get("input", "")
        texts = [str(t) for t in inputs] if isinstance(inputs, list) else [str(inputs)]
        as_base64 = body.get("encoding_format") == "base64"
        data = []
        for i, text in enumerate(texts):
            vector = _vector(text)
            embedding: Any = vector
            if as_base64:
                embedding = base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
            data.append({"object": "embedding", "index": i, "embedding": embedding})
        tokens = sum(len(words(t)) for t in texts)
        return JSONResponse(
            {
                "object": "list",
                "data": data,
                "model": body.get("model", ""),
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            }
        )

    async def _models(self, request: Request) -> Response:
        _, early = await self._enter(request)
        if early is not None:
            return early
        data = [{"id": m, "object": "model", "created": 0, "owned_by": "fake"} for m in self.models]
        return JSONResponse({"object": "list", "data": data})

    # -- the Responses API ---------------------------------------------------------------------

    @staticmethod
    def _input_texts(body: dict[str, Any]) -> list[str]:
        given = body.get("input")
        if isinstance(given, str):
            return [given]
        texts = [str(body.get("instructions") or "")]
        for item in given if isinstance(given, list) else []:
            if not isinstance(item, dict):
                continue
            if "content" in item:
                texts.append(_text_of(item["content"]))
            elif item.get("type") == "function_call_output":
                texts.append(_text_of(item.get("output")))
        return texts

    def _responses_output(
        self, body: dict[str, Any], pieces: list[str], status: str
    ) -> list[dict[str, Any]]:
        output: list[dict[str, Any]] = []
        tools = [t for t in body.get("tools") or [] if isinstance(t, dict)]
        if isinstance(body.get("reasoning"), dict):
            thought: dict[str, Any] = {
                "id": self._next_id("rs"),
                "type": "reasoning",
                "summary": [],
            }
            if self.thinking is not None:
                thought["content"] = [{"type": "reasoning_text", "text": self.thinking}]
            output.append(thought)
        for tool in tools:
            if tool.get("type") not in ("function", None):
                kind = str(tool["type"]).removesuffix("_preview")
                call = {"id": self._next_id(kind), "type": f"{kind}_call", "status": "completed"}
                output.append(call)
        given = body.get("input")
        last = given[-1] if isinstance(given, list) and given else {"role": "user"}
        functions = [t for t in tools if t.get("type") == "function"]
        scripted = self._scripted([t.get("name") for t in functions])
        if scripted is not None or (
            self.tool_call is not None and functions and last.get("role") == "user"
        ):
            call = scripted or {
                "name": self.tool_call["name"],
                "arguments": json.dumps(self.tool_call["arguments"]),
            }
            output.append(
                {
                    "id": self._next_id("fc"),
                    "type": "function_call",
                    "status": "completed",
                    "call_id": self._next_id("call"),
                    "name": call["name"],
                    "arguments": call["arguments"],
                }
            )
            return output
        text: dict[str, Any] = {"type": "output_text", "text": "".join(pieces), "annotations": []}
        if self.refusal is not None:
            text = {"type": "refusal", "refusal": self.refusal}
        message = {"id": self._next_id("msg"), "type": "message", "role": "assistant"}
        output.append({**message, "status": status, "content": [text]})
        return output

    async def _compact(self, request: Request) -> Response:
        return await _fake_compact(self, request)

    async def _responses(self, request: Request) -> Response:
        body, early = await self._enter(request)
        if early is not None:
            return early
        pieces = words(self.reply)
        limit = body.get("max_output_tokens")
        cut = isinstance(limit, int) and 0 < limit < len(pieces)
        if cut:
            pieces = pieces[:limit]
        status = "incomplete" if cut else "completed"
        output = self._responses_output(body, pieces, status)
        said = sum(len(words(str(i.get("arguments", "")))) for i in output) + len(pieces)
        prompt = sum(len(words(t)) for t in self._input_texts(body))
        if self.bill_prompt_bytes:
            prompt = body_tokens(body)
        usage: dict[str, Any] = {
            "input_tokens": prompt,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": said,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt + said,
            **(self.usage or {}),
        }
        response = {
            "id": self._next_id("resp"),
            "object": "response",
            "created_at": int(time.time()),
            "status": status,
            "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
            "instructions": body.get("instructions"),
            "model": body.get("model", ""),
            "output": output,
            "store": body.get("store", True),
            "tools": body.get("tools") or [],
            "usage": usage,
        }
        if not body.get("stream"):
            return JSONResponse(response)
        if self.failed_response is not None:  # the stream ends with response.failed
            error = {"code": "server_error", "message": self.failed_response}
            response = {**response, "status": "failed", "error": error}
        if self.echo_auth:
            error = _echoed(_error(500, "the response failed"), request)["error"]
            response = {**response, "status": "failed", "error": error}
        events = list(_response_events(response, pieces))
        return _SSE(events, per_token_s=self.per_token_s, cut_after=self.cut_stream_after, api=self)


async def _fake_compact(api: FakeAPI, request: Request) -> Response:
    """``POST /v1/responses/compact`` as OpenAI answers it: the input's user messages, then one
    ``compaction`` item (its ``encrypted_content`` the count of items compacted), usage billed
    as one input token a word and one output token."""
    body, early = await api._enter(request)
    if early is not None:
        return early
    given = body.get("input") or []
    kept = [i for i in given if i.get("type", "message") == "message" and i.get("role") == "user"]
    prompt = sum(len(words(t)) for t in api._input_texts(body))
    usage = {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": 1,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt + 1,
    }
    compaction = {
        "id": api._next_id("cmp"),
        "type": "compaction",
        "encrypted_content": f"compacted:{len(given)}",
    }
    return JSONResponse(
        {
            "id": api._next_id("resp"),
            "object": "response.compaction",
            "created_at": int(time.time()),
            "output": [*kept, compaction],
            "usage": usage,
        }
    )


def _chat_chunks(
    base: dict[str, Any], deltas: list[dict[str, Any]], finish: str, usage: dict[str, int] | None
) -> Iterator[bytes]:
    """A streamed chat answer's events: a chunk per delta, a last one with ``finish`` and an
    empty delta, a usage chunk where ``usage`` is given (then every chunk carries
    ``"usage": null``, as OpenAI's do), and [DONE]."""
    base = {**base, "object": "chat.completion.chunk"}
    tail = {"usage": None} if usage is not None else {}

    def event(delta: dict[str, Any], finish_reason: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        payload = {**base, "choices": [choice], **tail}
        return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"

    for delta in deltas:
        yield event(delta)
    yield event({}, finish)
    if usage is not None:
        payload = {**base, "choices": [], "usage": usage}
        yield b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"
    yield b"data: [DONE]\n\n"


def _response_events(response: dict[str, Any], pieces: list[str]) -> Iterator[bytes]:
    """A response's typed events as OpenAI streams them, numbered from 0."""
    sequence = 0

    def event(name: str, **payload: Any) -> bytes:
        nonlocal sequence
        data = json.dumps({"type": name, "sequence_number": sequence, **payload})
        sequence += 1
        return f"event: {name}\ndata: {data}\n\n".encode()

    started = {**response, "status": "in_progress", "output": [], "usage": None}
    yield event("response.created", response=started)
    yield event("response.in_progress", response=started)
    for index, item in enumerate(response["output"]):
        at = {"output_index": index, "item_id": item["id"]}
        parts = item.get("content") or [{}]
        if item["type"] == "message" and parts[0].get("type") == "refusal":
            yield event(
                "response.output_item.added", output_index=index, item={**item, "content": []}
            )
            said = item["content"][0]
            empty = {"type": "refusal", "refusal": ""}
            yield event("response.content_part.added", **at, content_index=0, part=empty)
            yield event("response.refusal.delta", **at, content_index=0, delta=said["refusal"])
            yield event("response.refusal.done", **at, content_index=0, refusal=said["refusal"])
            yield event("response.content_part.done", **at, content_index=0, part=said)
        elif item["type"] == "reasoning" and item.get("content"):
            yield event(
                "response.output_item.added", output_index=index, item={**item, "content": []}
            )
            text = item["content"][0]["text"]
            empty = {"type": "reasoning_text", "text": ""}
            yield event("response.content_part.added", **at, content_index=0, part=empty)
            yield event("response.reasoning_text.delta", **at, content_index=0, delta=text)
            yield event("response.reasoning_text.done", **at, content_index=0, text=text)
            yield event(
                "response.content_part.done", **at, content_index=0, part=item["content"][0]
            )
        elif item["type"] == "message":
            yield event(
                "response.output_item.added", output_index=index, item={**item, "content": []}
            )
            part = {"type": "output_text", "text": "", "annotations": []}
            yield event("response.content_part.added", **at, content_index=0, part=part)
            for piece in pieces:
                yield event("response.output_text.delta", **at, content_index=0, delta=piece)
            text = item["content"][0]["text"]
            yield event("response.output_text.done", **at, content_index=0, text=text)
            yield event(
                "response.content_part.done", **at, content_index=0, part=item["content"][0]
            )
        elif item["type"] == "function_call":
            yield event(
                "response.output_item.added", output_index=index, item={**item, "arguments": ""}
            )
            yield event("response.function_call_arguments.delta", **at, delta=item["arguments"])
            yield event("response.function_call_arguments.done", **at, arguments=item["arguments"])
        else:
            yield event("response.output_item.added", output_index=index, item=item)
        yield event("response.output_item.done", output_index=index, item=item)
    last = {"incomplete": "response.incomplete", "failed": "response.failed"}.get(
        response["status"], "response.completed"
    )
    yield event(last, response=response)


class DevSetOracle:
    """The stand-in API of ``bench/audit_loop.py``: knows the dev set (``quality/dev/devset.py``).

    * A dev-set prompt (found by its last user message) gets its right answer: the number, the
      label or the option the checker wants, else the text ``(reference answer)``.
    * A judge request (the protocol of ``docs/audit.md``: the last user message is a JSON
      object with ``request``, ``reference`` and ``candidate``) gets a verdict on the candidate,
      as ``{"correct": ..., "reason": ...}``, under the notion its system message names (the
      texts of ``proxy.audit.judge.SYSTEM_MESSAGES``): ``strict``, the prompt's own checker
      (``devset.is_correct``); ``content``, the content-only grader
      (``quality.dev.content.is_content_correct``). A case for a prompt it does not know gets
      ``{"correct": false}``; a judge request whose system message is neither text gets no
      verdict (a plain-text reply), as a judge told nothing about correctness should.
    """

    def __init__(self, path: str | None = None) -> None:
        from proxy.audit.judge import SYSTEM_MESSAGES
        from quality.dev import content, devset

        prompts = devset.load(path) if path else devset.load()
        self.by_text = {self._last_user(p.request["messages"]): p for p in prompts}
        self.graders = {
            SYSTEM_MESSAGES["strict"]: ("strict", devset.is_correct),
            SYSTEM_MESSAGES["content"]: ("content", content.is_content_correct),
        }
        self.judged: dict[str, int] = {"strict": 0, "content": 0}

    @staticmethod
    def _last_user(messages: Any) -> str:
        for message in reversed(messages if isinstance(messages, list) else []):
            if isinstance(message, dict) and message.get("role") == "user":
                return _text_of(message.get("content"))
        return ""

    @staticmethod
    def _system(messages: Any) -> str:
        for message in messages if isinstance(messages, list) else []:
            if isinstance(message, dict) and message.get("role") == "system":
                return _text_of(message.get("content"))
        return ""

    def reply_for(self, body: dict[str, Any]) -> str | None:
        last = self._last_user(body.get("messages"))
        try:
            case = json.loads(last)
        except ValueError:
            case = None
        if isinstance(case, dict) and {"request", "reference", "candidate"} <= set(case):
            grader = self.graders.get(self._system(body.get("messages")))
            if grader is None:
                return "I cannot tell what correct means here."
            notion, is_correct = grader
            self.judged[notion] += 1
            prompt = self.by_text.get(self._last_user(case["request"]))
            correct = prompt is not None and is_correct(prompt.check, str(case["candidate"]))
            return json.dumps({"correct": correct, "reason": f"dev set, {notion}"})
        prompt = self.by_text.get(last)
        if prompt is None:
            return None
        check = prompt.check
        if check["type"] == "number":
            value = float(check["value"])
            return str(int(value)) if value.is_integer() else str(value)
        if check["type"] in ("label", "last_of"):
            return str(check["answer"])
        return "(reference answer)"


class _KeepSend:
    """The ASGI app: the routes, with the server's own ``send`` kept in the scope (uvicorn's
    request cycle, whose transport ``reset_after_request`` aborts)."""

    def __init__(self, app: Starlette) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        scope["fake_api.raw_send"] = send
        await self.app(scope, receive, send)


def _reset(request: Request) -> None:
    """Abort the request's connection with a TCP RST (uvicorn's transport, SO_LINGER 0)."""
    cycle = getattr(request.scope["fake_api.raw_send"], "__self__", None)
    transport = getattr(cycle, "transport", None)
    if transport is None:
        raise RuntimeError("reset_after_request needs uvicorn's request cycle")
    sock = transport.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()


def fake_api(**knobs: Any) -> FakeAPI:
    """A not yet started server: ``with fake_api(latency_s=0.1) as api: ...``."""
    return FakeAPI(**knobs)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Serve the fake OpenAI-compatible API.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9999)
    parser.add_argument("--latency", type=float, default=0.0, help="seconds before each answer")
    parser.add_argument("--per-token", type=float, default=0.0, help="seconds between chunks")
    parser.add_argument("--reply", default=DEFAULT_REPLY)
    parser.add_argument("--require-key", default=None)
    args = parser.parse_args(argv)
    api = FakeAPI(
        host=args.host,
        port=args.port,
        record=False,
        reply=args.reply,
        latency_s=args.latency,
        per_token_s=args.per_token,
        require_key=args.require_key,
    )
    print(f"fake API on {api.url}", flush=True)
    uvicorn.run(
        api.app,
        host=args.host,
        port=args.port,
        loop="asyncio",
        lifespan="off",
        log_level="warning",
        access_log=False,
    )


if __name__ == "__main__":
    main()
