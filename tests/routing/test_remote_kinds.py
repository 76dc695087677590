"""What each kind of remote server is sent and refused, and a remote's live stream, with the
server played by ``httpx.MockTransport`` (the real ``llama_cpp.server`` is in
``test_llama_cpp_server.py``)."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import structlog

from proxy import config
from proxy.errors import ConfigError, EngineCrashed
from proxy.routing.base import BackendDown
from proxy.routing.remote_kinds import KINDS
from proxy.routing.remote_stream import StreamCut, StreamedAnswer
from proxy.routing.remote_wire import Wire, request_body
from tests.conftest import settings_for
from tests.routing.test_backends import QUESTION, REQUEST, remote

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
JSON_SCHEMA = {"type": "json_schema", "json_schema": {"name": "city", "schema": SCHEMA}}
TOOLS = [
    {
        "type": "function",
        "function": {"name": "get_weather", "parameters": SCHEMA},
    }
]
NAMED = {"type": "function", "function": {"name": "get_weather"}}


def test_every_configurable_kind_has_its_facts() -> None:
    assert set(KINDS) == set(config.BACKEND_KINDS)
    entry = {"name": "a", "api_base": "http://a"}
    assert settings_for(Path("/tmp"), local={"backends": [entry]}).local.backends[0].kind == (
        "openai-compatible"
    )
    for bad, needle in (
        ({**entry, "kind": "tgi"}, "kind = 'tgi': expected one of llama-server, llama-cpp-python"),
        (
            {**entry, "kind": "llama-cpp-python", "max_concurrency": 2},
            'max_concurrency = 2: expected 1 for kind "llama-cpp-python"',
        ),
    ):
        with pytest.raises(ConfigError, match=re.escape(needle)):
            settings_for(Path("/tmp"), local={"backends": [bad]})


@pytest.mark.parametrize(
    ("kind", "request_", "refused"),
    [
        # n above what the server answers at once is made up for, by as many calls
        ("openai-compatible", {"n": 2}, None),
        ("vllm", {"n": 2}, None),
        ("frugal", {"n": 2}, None),
        ("llama-cpp-python", {"n": 2}, None),
        ("llama-cpp-python", {"n": 9}, "n = 9 (at most 8)"),
        ("llama-cpp-python", {"response_format": JSON_SCHEMA}, None),
        ("llama-cpp-python", {"tools": TOOLS}, "tools with tool_choice auto"),
        ("llama-cpp-python", {"tools": TOOLS, "tool_choice": "required"}, "tool_choice required"),
        ("llama-cpp-python", {"tools": TOOLS, "tool_choice": NAMED}, None),
        ("llama-cpp-python", {"tools": TOOLS, "tool_choice": "none"}, None),
        ("llama-cpp-python", {"logprobs": True, "top_logprobs": 2}, None),
        ("ollama", {"tools": TOOLS}, None),
        ("ollama", {"tools": TOOLS, "tool_choice": NAMED}, "tool_choice named"),
        ("ollama", {"logprobs": True}, "logprobs"),
        ("llama-server", {"tools": TOOLS, "tool_choice": "required"}, None),
    ],
)
def test_a_kind_refuses_what_its_server_would_not_honour(
    kind: str, request_: dict[str, Any], refused: str | None
) -> None:
    reason = KINDS[kind].refuses({**REQUEST, **request_})
    if refused is None:
        assert reason is None
    else:
        assert reason is not None and refused in reason


def test_llama_cpp_python_is_asked_in_its_own_words() -> None:
    kind = KINDS["llama-cpp-python"]
    request = {
        **REQUEST,
        "response_format": JSON_SCHEMA,
        "max_completion_tokens": 5,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    del request["max_tokens"]
    wire = Wire(model="local", cap=512, logprobs=True, kind=kind)
    body = request_body(request, wire, stream=True)
    # json_schema gets an HTTP 500 there; its own json_object form takes the schema
    assert body["response_format"] == {"type": "json_object", "schema": SCHEMA}
    # max_completion_tokens is ignored there: the cap goes as max_tokens
    assert body["max_tokens"] == 5 and "max_completion_tokens" not in body
    # logprobs come back only with top_logprobs
    assert body["logprobs"] is True and body["top_logprobs"] == 1
    # no usage chunk comes, so none is asked for
    assert body["stream"] is True and "stream_options" not in body
    tools = request_body(
        {**REQUEST, "tools": TOOLS, "tool_choice": "none"},
        Wire(model="m", cap=8, logprobs=False, kind=kind),
    )
    assert "tools" not in tools and "tool_choice" not in tools


def test_an_openai_compatible_server_is_sent_the_request_as_it_came() -> None:
    request = {**REQUEST, "response_format": JSON_SCHEMA, "max_completion_tokens": 5}
    body = request_body(request, Wire(model="local", cap=512, logprobs=True), stream=True)
    assert body["response_format"] == JSON_SCHEMA and body["max_completion_tokens"] == 5
    assert body["logprobs"] is True and "top_logprobs" not in body
    assert body["stream_options"] == {"include_usage": True}


def chunk(content: str | None = None, finish: str | None = None, **extra: Any) -> bytes:
    delta = {} if content is None else {"content": content}
    event = {
        "id": "chatcmpl-s",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "m",
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        **extra,
    }
    return f"data: {json.dumps(event)}\n\n".encode()


def test_a_streamed_answer_is_put_together_and_counted_without_a_usage_chunk() -> None:
    answer = StreamedAnswer(prompt_tokens=30)
    said = [answer.feed(line.decode()[6:].strip()) for line in (chunk("Par"), chunk("is."))]
    assert said == ["Par", "is."]
    answer.feed(chunk(finish="stop").decode()[6:])
    answer.feed("[DONE]")
    completion = answer.completion()
    assert completion["choices"][0]["message"]["content"] == "Paris."
    assert completion["usage"] == {"prompt_tokens": 30, "completion_tokens": 2, "total_tokens": 32}
    cut = StreamedAnswer(prompt_tokens=30)
    cut.feed(chunk("Par").decode()[6:])
    cut.feed("[DONE]")  # llama-cpp-python's model lock ends a stream so
    with pytest.raises(StreamCut):
        cut.completion()


async def test_a_live_stream_hands_on_each_token_before_the_next_comes() -> None:
    # The server sends its second token only once the first has been handed on: an answer
    # replayed whole would never finish.
    handed: list[str] = []
    first_out = asyncio.Event()

    async def body() -> AsyncIterator[bytes]:
        yield chunk("Par")
        await asyncio.wait_for(first_out.wait(), timeout=10)
        yield chunk("is.")
        yield chunk(finish="stop", usage={"prompt_tokens": 9, "completion_tokens": 2})
        yield b"data: [DONE]\n\n"

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/models"):
            return httpx.Response(200, json={"data": []})
        assert json.loads(request.content)["stream"] is True
        return httpx.Response(200, content=body(), headers={"content-type": "text/event-stream"})

    def on_token(text: str) -> None:
        handed.append(text)
        first_out.set()

    async with remote(handler) as backend:
        completion = await backend.chat(REQUEST, deadline=time.monotonic() + 20, on_token=on_token)
        assert handed == ["Par", "is."]
        assert completion["choices"][0]["message"]["content"] == "Paris."
        assert completion["usage"]["completion_tokens"] == 2
        assert "usage_source" not in completion["frugal"]
        health = backend.health()
        assert (health["streamed"], health["streamed_pieces"]) == (1, 2)


@pytest.mark.parametrize("after_first", [False, True], ids=["before", "after"])
async def test_a_stream_that_breaks_fails_so_that_it_moves_only_before_its_first_token(
    after_first: bool,
) -> None:
    async def body() -> AsyncIterator[bytes]:
        if after_first:
            yield chunk("Par")
        raise httpx.ReadError("the server died")

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/models"):
            return httpx.Response(200, json={"data": []})
        return httpx.Response(200, content=body(), headers={"content-type": "text/event-stream"})

    handed: list[str] = []
    async with remote(handler) as backend:
        with pytest.raises(EngineCrashed) as caught:
            await backend.chat(REQUEST, deadline=time.monotonic() + 20, on_token=handed.append)
        # BackendDown lets the pool move the request; after a token it must stay and fail
        assert isinstance(caught.value, BackendDown) is not after_first
        assert handed == (["Par"] if after_first else [])
        assert backend.state == "down"


async def test_a_stream_cut_without_a_finish_is_a_failure_not_an_answer() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/models"):
            return httpx.Response(200, json={"data": []})
        content = chunk("Par") + b"data: [DONE]\n\n"
        return httpx.Response(200, content=content, headers={"content-type": "text/event-stream"})

    async with remote(handler) as backend:
        with pytest.raises(EngineCrashed, match="broke off") as caught:
            await backend.chat(REQUEST, deadline=time.monotonic() + 20, on_token=lambda _: None)
        assert not isinstance(caught.value, BackendDown)
        assert backend.state == "up"  # the server is fine: another request cut it


async def test_a_llama_cpp_python_backend_is_probed_where_its_model_lock_is_not() -> None:
    paths: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        paths.append(request.url.path)
        return httpx.Response(200, text="<html></html>")

    async with remote(handler, kind="llama-cpp-python") as backend:
        assert backend.state == "up"
        assert backend.logprobs is False  # too dear there for the gate; a client's still go
        assert not backend.admits({**REQUEST, "n": 9}, "chat")
        assert backend.admits({"model": "m", "messages": QUESTION}, "chat")
    assert paths and set(paths) == {"/docs"}  # api_base http://gpu.test/v1, less its /v1


async def test_a_llama_cpp_python_server_left_as_openai_compatible_gets_a_hint() -> None:
    models = {"object": "list", "data": [{"id": "m.gguf", "object": "model", "owned_by": "me"}]}

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json=models)

    with structlog.testing.capture_logs() as logs:
        async with remote(handler) as backend:
            assert backend.state == "up"
            await backend.probe()
    hints = [entry for entry in logs if entry["event"] == "backend_kind_hint"]
    assert len(hints) == 1 and 'kind = "llama-cpp-python"' in hints[0]["hint"]
