"""A third-party server as a remote backend: ``python -m llama_cpp.server`` 0.3.36 (the
OpenAI-compatible server of llama-cpp-python, ``kind = "llama-cpp-python"``) serving the bundled
SmolLM2 on loopback, started by the tests (``tests/llama_cpp_server.py``).

First what the server itself does with each request (the facts the kind is written from), then
the proxy in front of it: each request is answered by that server (route ``local``, backend
``srv`` in its ledger row) where the kind honours it, and by the bundled engine where it does
not. What reached the server is read from its own access log, not from the proxy.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from proxy.routing.remote import RemoteBackend
from tests import llama_cpp_server
from tests.conftest import settings_for
from tests.fake_api import FakeAPI
from tests.llama_cpp_server import LlamaCppServer

pytestmark = pytest.mark.skipif(
    llama_cpp_server.missing() is not None, reason=str(llama_cpp_server.missing())
)

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
STORY = [{"role": "user", "content": "Write a long story about a dragon."}]
ASK = {"model": "gpt-4o-mini", "messages": QUESTION, "max_tokens": 24, "temperature": 0}
ACCEPT_ANY = {"x-frugal-min-quality": "0"}
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
JSON_SCHEMA = {"type": "json_schema", "json_schema": {"name": "city", "schema": SCHEMA}}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": SCHEMA}}]
NAMED = {"type": "function", "function": {"name": "get_weather"}}
CHATS = "POST /v1/chat/completions"
COMPLETIONS = "POST /v1/completions"
PROMPT = {"model": "gpt-4o-mini", "prompt": "The capital of France is", "max_tokens": 8}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaCppServer]:
    started = llama_cpp_server.start(tmp_path_factory.mktemp("llama_cpp_server"))
    try:
        yield started
    finally:
        started.stop()


def chats(server: LlamaCppServer, path: str = CHATS) -> int:
    """How many chat requests (or ``path`` ones) the server has been sent (its uvicorn access
    log)."""
    return server.log.read_text(errors="replace").count(path)


def direct(server: LlamaCppServer, **body: Any) -> httpx.Response:
    return httpx.post(
        server.api_base + "/chat/completions", json={**ASK, "model": "x", **body}, timeout=120
    )


def streamed_lines(
    server: LlamaCppServer, body: dict[str, Any], during: Callable[[], Any] | None = None
) -> list[str]:
    """A stream's ``data:`` lines; ``during`` is called on a thread after the 5th."""
    lines: list[str] = []
    request = {"model": "x", "messages": STORY, "temperature": 0, "stream": True, **body}
    with httpx.stream(
        "POST", server.api_base + "/chat/completions", json=request, timeout=120
    ) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: "):
                lines.append(line[6:])
                if during is not None and len(lines) == 5:
                    threading.Thread(target=during).start()
    return lines


def finish_of(lines: list[str]) -> str | None:
    events = [json.loads(line) for line in lines if line != "[DONE]"]
    return next(
        (c["finish_reason"] for e in events for c in e["choices"] if c["finish_reason"]), None
    )


# -- the server on its own ------------------------------------------------------------------------


def test_what_llama_cpp_server_does_with_each_request(server: LlamaCppServer) -> None:
    # response_format json_schema: its pydantic model knows text and json_object only, and the
    # validation error comes back as HTTP 500
    assert direct(server, response_format=JSON_SCHEMA).status_code == 500
    # its own form takes the schema, and the answer fits it
    answer = direct(server, response_format={"type": "json_object", "schema": SCHEMA}).json()
    assert set(json.loads(answer["choices"][0]["message"]["content"])) == {"city"}
    # tools: ignored unless tool_choice names one
    for choice in ("auto", "required"):
        message = direct(server, tools=TOOLS, tool_choice=choice).json()["choices"][0]["message"]
        assert not message.get("tool_calls"), choice
    message = direct(server, tools=TOOLS, tool_choice=NAMED).json()["choices"][0]["message"]
    assert message["tool_calls"][0]["function"]["name"] == "get_weather"
    # n is ignored: one choice
    assert len(direct(server, n=2, temperature=0.8).json()["choices"]) == 1
    # max_completion_tokens is ignored (max_tokens is honoured)
    long = direct(server, max_tokens=None, max_completion_tokens=3).json()
    assert long["usage"]["completion_tokens"] > 3
    assert direct(server, max_tokens=3).json()["usage"]["completion_tokens"] == 3
    # logprobs only with top_logprobs
    assert direct(server, logprobs=True).json()["choices"][0]["logprobs"] is None
    with_top = direct(server, logprobs=True, top_logprobs=1).json()["choices"][0]["logprobs"]
    assert with_top["content"][0]["logprob"] <= 0


def test_its_streams_have_no_usage_and_a_request_during_one_cuts_it(
    server: LlamaCppServer,
) -> None:
    lines = streamed_lines(server, {"max_tokens": 12, "stream_options": {"include_usage": True}})
    assert lines[-1] == "[DONE]" and finish_of(lines) == "length"
    assert not any(json.loads(line).get("usage") for line in lines[:-1])
    # One model lock: a GET /v1/models sent during a stream ends it with [DONE] and no finish
    # reason (max_tokens 400 is far more than it writes before the probe arrives)
    models = server.api_base + "/models"
    cut = streamed_lines(server, {"max_tokens": 400}, during=lambda: httpx.get(models, timeout=60))
    assert cut[-1] == "[DONE]" and finish_of(cut) is None and len(cut) < 400
    # ... and GET /docs (FastAPI's page, where the proxy probes it) does not
    docs = server.root + "/docs"
    whole = streamed_lines(server, {"max_tokens": 60}, during=lambda: httpx.get(docs, timeout=60))
    assert finish_of(whole) == "length"


def test_its_legacy_completions_take_one_prompt_and_ignore_n(server: LlamaCppServer) -> None:
    ask = {"model": "x", "prompt": "The capital of France is", "max_tokens": 4, "temperature": 0}
    url = server.api_base + "/completions"
    plain = httpx.post(url, json=ask, timeout=120).json()
    [choice] = plain["choices"]
    assert plain["object"] == "text_completion" and choice["text"].strip()
    assert choice["logprobs"] is None and plain["usage"]["completion_tokens"] == 4
    # n is ignored here too: one choice
    two = httpx.post(url, json={**ask, "n": 2, "temperature": 0.8}, timeout=120).json()
    assert len(two["choices"]) == 1
    # logprobs (a count) come back in the legacy layout, offsets counted from the prompt's end
    lp = httpx.post(url, json={**ask, "logprobs": 1}, timeout=120).json()["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == 4
    assert lp["text_offset"][0] == len(ask["prompt"])


# -- the proxy in front of it ---------------------------------------------------------------------


def backend_entry(server: LlamaCppServer) -> dict[str, Any]:
    """The server as [[local.backends]], with assumed rates that make it the first choice."""
    return {
        "name": "srv",
        "kind": "llama-cpp-python",
        "api_base": server.api_base,
        "prefill_tok_s": 1e6,
        "decode_tok_s": 1e6,
    }


def through(
    tmp_path: Path, api: FakeAPI, server: LlamaCppServer, stream_mode: str | None = None
) -> Any:
    """Settings whose one local backend is ``server`` (:func:`backend_entry`), in
    ``stream_mode`` where one is given."""
    router = {"stream_mode": stream_mode} if stream_mode is not None else {}
    return settings_for(tmp_path, api, local={"backends": [backend_entry(server)]}, router=router)


def ledger(tmp_path: Path) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(tmp_path / "ledger.db")
    try:
        return conn.execute(
            "SELECT route, reason, backend, error FROM requests ORDER BY id"
        ).fetchall()
    finally:
        conn.close()


async def wait_up(client: httpx.AsyncClient) -> RemoteBackend:
    pool = client.app.state.services.router.pool  # type: ignore[attr-defined]
    backend = next(b for b in pool.backends if b.name == "srv")
    for _ in range(400):
        if backend.state == "up":
            return backend
        await asyncio.sleep(0.05)
    raise AssertionError(f"backend srv never came up: {backend.health()}")


def sse(text: str) -> list[dict[str, Any]]:
    return [
        json.loads(line[6:])
        for line in text.split("\n")
        if line.startswith("data: ") and line != "data: [DONE]"
    ]


async def test_each_request_is_answered_there_when_its_kind_honours_it_and_else_by_the_engine(
    tmp_path: Path, fake_api: FakeAPI, make_client: Callable[..., Any], server: LlamaCppServer
) -> None:
    s = through(tmp_path, fake_api, server)
    cases: list[tuple[str, dict[str, Any], str]] = [
        ("plain", {}, "srv"),
        ("json_schema", {"response_format": JSON_SCHEMA}, "srv"),
        ("named tool", {"tools": TOOLS, "tool_choice": NAMED}, "srv"),
        ("max_completion_tokens", {"max_tokens": None, "max_completion_tokens": 4}, "srv"),
        ("auto tools", {"tools": TOOLS}, "engine"),  # ignored there
        # n is ignored there: the proxy asks twice, one answer each, and scores both
        ("n = 2", {"n": 2, "temperature": 0.8}, "srv"),
    ]
    answers: dict[str, dict[str, Any]] = {}
    async with make_client(s) as client:
        await wait_up(client)
        for label, extra, where in cases:
            before = chats(server)
            body = {k: v for k, v in {**ASK, **extra}.items() if v is not None}
            r = await client.post("/v1/chat/completions", json=body, headers=ACCEPT_ANY)
            assert r.status_code == 200, (label, r.text)
            assert r.headers["x-frugal-route"] == "local", label
            calls = (extra.get("n") or 1) if where == "srv" else 0
            assert chats(server) - before == calls, label
            answers[label] = r.json()
    assert [row[2] for row in ledger(tmp_path)] == [where for _, _, where in cases]
    assert all(row[0] == "local" for row in ledger(tmp_path))
    content = answers["json_schema"]["choices"][0]["message"]["content"]
    assert set(json.loads(content)) == {"city"}
    [call] = answers["named tool"]["choices"][0]["message"]["tool_calls"]
    assert call["function"]["name"] == "get_weather" and "city" in json.loads(
        call["function"]["arguments"]
    )
    assert answers["max_completion_tokens"]["usage"]["completion_tokens"] <= 4
    two = answers["n = 2"]
    assert [c["index"] for c in two["choices"]] == [0, 1]
    assert all(c["message"]["content"] for c in two["choices"])
    assert 2 <= two["usage"]["completion_tokens"] <= 2 * 24  # both answers counted


@pytest.mark.parametrize("mode", ["verify", "live"])
async def test_a_stream_through_it_is_answered_there(
    tmp_path: Path,
    fake_api: FakeAPI,
    make_client: Callable[..., Any],
    server: LlamaCppServer,
    mode: str,
) -> None:
    s = through(tmp_path, fake_api, server, mode)
    body = {**ASK, "stream": True, "stream_options": {"include_usage": True}}
    async with make_client(s) as client:
        backend = await wait_up(client)
        r = await client.post("/v1/chat/completions", json=body, headers=ACCEPT_ANY)
        health = backend.health()
    assert r.status_code == 200
    assert r.headers["x-frugal-route"] == "local"
    assert r.headers["x-frugal-reason"] == ("live" if mode == "live" else "accepted")
    assert r.text.rstrip().endswith("data: [DONE]")
    chunks = sse(r.text)
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text.strip()
    tokens = chunks[-1]["usage"]["completion_tokens"]
    assert 0 < tokens <= 24
    # live: asked as a stream and relayed piece by piece (no usage chunk comes from that
    # server: the proxy counts one token a piece); verify: one whole answer, scored first
    assert health["streamed"] == (1 if mode == "live" else 0)
    assert health["streamed_pieces"] == (tokens if mode == "live" else 0)
    [(route, _, where, error)] = ledger(tmp_path)
    assert (route, where, error) == ("local", "srv", None)


@pytest.fixture
def killable(tmp_path: Path) -> Iterator[LlamaCppServer]:
    """A server of the test's own, which the test kills."""
    own = llama_cpp_server.start(tmp_path)
    try:
        yield own
    finally:
        own.stop()


async def test_a_server_killed_mid_stream_and_mid_queue_answers_each_request_once(
    tmp_path: Path, fake_api: FakeAPI, make_client: Callable[..., Any], killable: LlamaCppServer
) -> None:
    # One live stream runs on the server, a second request waits in its queue (one slot).
    body = {"model": "gpt-4o-mini", "messages": STORY, "max_tokens": 400, "stream": True}
    async with make_client(through(tmp_path, fake_api, killable, "live")) as client:
        backend = await wait_up(client)
        streaming = asyncio.create_task(
            client.post("/v1/chat/completions", json=body, headers=ACCEPT_ANY)
        )
        while backend.stats.streamed_pieces < 3 and not streaming.done():
            await asyncio.sleep(0.01)
        queued = asyncio.create_task(
            client.post("/v1/chat/completions", json=ASK, headers=ACCEPT_ANY)
        )
        while backend.health()["queue_depth"] < 1 and not queued.done():
            await asyncio.sleep(0.01)
        assert backend.health()["queue_depth"] == 1
        killable.stop()  # SIGKILL, once three tokens have gone to the client
        r, waited = await streaming, await queued
        relayed = backend.stats.streamed_pieces
        assert backend.state == "down"
    # the stream: the server's tokens up to the kill, once, then an error event
    assert r.status_code == 200 and r.headers["x-frugal-route"] == "local"
    events = r.text.rstrip().split("\n\n")
    assert events[-1] == "data: [DONE]"
    assert json.loads(events[-2][6:])["error"]["code"] == "local_error"
    pieces = [
        c["choices"][0]["delta"]["content"]
        for c in sse(r.text)
        if c.get("choices") and c["choices"][0]["delta"].get("content")
    ]
    assert 3 <= len(pieces) == relayed < 400
    # the queued request: handed on to the bundled engine, answered there
    assert waited.status_code == 200 and waited.headers["x-frugal-route"] == "local"
    assert waited.json()["choices"][0]["message"]["content"]
    assert fake_api.count == 0
    assert sorted(ledger(tmp_path), key=str) == [  # one row each, in either order
        ("local", "accepted", "engine", None),
        ("local", "live", "srv", "local_error"),
    ]


async def test_a_server_killed_before_a_stream_leaves_it_to_the_engine_with_one_row(
    tmp_path: Path, fake_api: FakeAPI, make_client: Callable[..., Any], killable: LlamaCppServer
) -> None:
    async with make_client(through(tmp_path, fake_api, killable, "live")) as client:
        backend = await wait_up(client)
        killable.stop()  # the proxy has not noticed: the backend is still up
        assert backend.state == "up"
        r = await client.post(
            "/v1/chat/completions", json={**ASK, "stream": True}, headers=ACCEPT_ANY
        )
        assert backend.state == "down"
    assert r.status_code == 200 and r.headers["x-frugal-route"] == "local"
    assert "error" not in r.text
    [(route, _, where, error)] = ledger(tmp_path)
    assert (route, where, error) == ("local", "engine", None)  # moved before its first byte


async def test_legacy_completions_are_answered_there_plain_and_streamed_and_else_by_the_engine(
    tmp_path: Path, fake_api: FakeAPI, make_client: Callable[..., Any], server: LlamaCppServer
) -> None:
    s = through(tmp_path, fake_api, server)
    cases: list[tuple[str, dict[str, Any], str]] = [
        ("plain", {"temperature": 0}, "srv"),
        ("streamed", {"temperature": 0, "stream": True}, "srv"),
        ("logprobs", {"temperature": 0, "logprobs": 2}, "srv"),
        ("n = 2", {"n": 2, "temperature": 0.8}, "srv"),  # ignored there: asked twice
        ("echo", {"echo": True, "temperature": 0}, "engine"),  # the engine's own
    ]
    answers: dict[str, httpx.Response] = {}
    async with make_client(s) as client:
        await wait_up(client)
        for label, extra, where in cases:
            before = chats(server, COMPLETIONS)
            r = await client.post("/v1/completions", json={**PROMPT, **extra}, headers=ACCEPT_ANY)
            assert r.status_code == 200, (label, r.text)
            assert r.headers["x-frugal-route"] == "local", label
            calls = (extra.get("n") or 1) if where == "srv" else 0
            assert chats(server, COMPLETIONS) - before == calls, label
            answers[label] = r
    conn = sqlite3.connect(tmp_path / "ledger.db")
    try:
        rows = conn.execute(
            "SELECT route, reason, backend, endpoint, quality FROM requests ORDER BY id"
        ).fetchall()
    finally:
        conn.close()
    assert [(r[0], r[2], r[3]) for r in rows] == [
        ("local", where, "completions") for _, _, where in cases
    ]
    assert all(r[4] is not None for r in rows)  # scored by the gate, each
    plain = answers["plain"].json()
    [choice] = plain["choices"]
    assert plain["object"] == "text_completion" and "paris" in choice["text"].lower()
    assert choice["logprobs"] is None  # not asked for, none given
    assert 0 < plain["usage"]["completion_tokens"] <= 8
    # streamed: the whole answer scored, then replayed as text_completion chunks
    events = sse(answers["streamed"].text)
    assert answers["streamed"].text.rstrip().endswith("data: [DONE]")
    assert all(e["object"] == "text_completion" for e in events)
    assert "".join(e["choices"][0]["text"] for e in events if e["choices"]).strip()
    assert events[-1]["choices"][0]["finish_reason"] in ("stop", "length")
    lp = answers["logprobs"].json()["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) > 0
    two = answers["n = 2"].json()
    assert [c["index"] for c in two["choices"]] == [0, 1]  # one a call, both scored
    assert all(c["text"] for c in two["choices"])


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "live stream"])
async def test_a_responses_request_is_answered_there_and_stored(
    tmp_path: Path,
    fake_api: FakeAPI,
    make_client: Callable[..., Any],
    server: LlamaCppServer,
    stream: bool,
) -> None:
    # /v1/responses runs the chat cascade locally: the backend gets a chat request, the client
    # a Responses object (or its typed events), and the proxy keeps it for previous_response_id
    s = through(tmp_path, fake_api, server, "live")
    body: dict[str, Any] = {
        "model": "gpt-4o-mini",
        "input": "What is the capital of France?",
        "max_output_tokens": 24,
        "temperature": 0,
        "stream": stream,
    }
    async with make_client(s) as client:
        await wait_up(client)
        before = chats(server)
        r = await client.post("/v1/responses", json=body, headers=ACCEPT_ANY)
        assert r.status_code == 200, r.text
        assert r.headers["x-frugal-route"] == "local"
        assert chats(server) - before == 1
        if stream:
            events = sse(r.text)
            kinds = [e["type"] for e in events]
            assert kinds[0] == "response.created"
            assert kinds[-1] == f"response.{events[-1]['response']['status']}"
            assert [e["sequence_number"] for e in events] == list(range(len(events)))
            deltas = "".join(
                e["delta"] for e in events if e["type"] == "response.output_text.delta"
            )
            response = events[-1]["response"]
        else:
            response = r.json()
            deltas = None
        [message] = response["output"]
        text = message["content"][0]["text"]
        assert text.strip() and (deltas is None or deltas == text)
        tokens = response["usage"]["output_tokens"]
        assert 0 < tokens <= 24
        if response["status"] == "incomplete":  # SmolLM2 talks on: cut at max_output_tokens
            assert response["incomplete_details"] == {"reason": "max_output_tokens"}
            assert tokens == 24
        else:
            assert response["status"] == "completed"
        stored = await client.get(f"/v1/responses/{response['id']}")
        assert stored.status_code == 200
        assert stored.json()["output"][0]["content"][0]["text"] == text
    conn = sqlite3.connect(tmp_path / "ledger.db")
    try:
        rows = conn.execute("SELECT endpoint, route, backend, error FROM requests").fetchall()
    finally:
        conn.close()
    assert rows == [("responses", "local", "srv", None)]
