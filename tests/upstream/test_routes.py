"""The routes to the paid API (proxy/upstream/route.py): which target takes which route, and a
new kind of provider added as one class and its line in the kinds, with nothing else changed:
the client forwards, retries, counts and streams for it as for the shipped routes."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from types import MappingProxyType
from typing import Any

import pytest

from proxy.config import FallbackSettings
from proxy.errors import UpstreamError, UpstreamStatus
from proxy.upstream.client import KINDS, Upstream
from proxy.upstream.route import Answer, Kinds, Opened, Route

MSG = [{"role": "user", "content": "Hi"}]


@pytest.mark.parametrize(
    ("target", "route"),
    [
        ("gpt-4o-mini", ("direct", "gpt-4o-mini")),
        ("openai/gpt-4o-mini", ("direct", "gpt-4o-mini")),
        ("anthropic/claude-3-5-haiku", ("litellm", "anthropic/claude-3-5-haiku")),
        ("hosted_vllm/org/model", ("litellm", "hosted_vllm/org/model")),
    ],
)
def test_each_target_takes_its_route_with_the_model_name_it_sends(
    target: str, route: tuple[str, str]
) -> None:
    assert KINDS.resolve(target) == route


class EchoRoute:
    """A provider kind written for this test: it answers with what it was sent. The first
    ``refuse`` attempts fail as a connection that could not be made (retried), and a body
    asking for model ``reject`` gets a 400 (never retried)."""

    def __init__(self, settings: FallbackSettings) -> None:
        self.settings = settings
        self.refuse = 0
        self.sent: list[tuple[dict[str, Any], str]] = []
        self.started = False

    async def start(self) -> None:
        self.started = True

    async def aclose(self) -> None:
        self.started = False

    def ready(self) -> None:
        assert self.started

    def _attempt(self, forward: dict[str, Any], request_id: str) -> None:
        self.sent.append((forward, request_id))
        if len(self.sent) <= self.refuse:
            raise ConnectionRefusedError("echo is not listening yet")
        if forward["model"] == "reject":
            raise UpstreamStatus(400, {"error": {"message": "no", "type": "x"}}, "no")

    async def complete(self, forward: dict[str, Any], request_id: str) -> Answer:
        self._attempt(forward, request_id)
        data = {"object": "chat.completion", "model": forward["model"], "choices": []}
        return 200, data, json.dumps(data).encode()

    async def open_stream(self, forward: dict[str, Any], request_id: str) -> Opened:
        self._attempt(forward, request_id)

        async def chunks() -> AsyncIterator[bytes]:
            chunk = {"object": "chat.completion.chunk", "choices": []}
            usage = {**chunk, "usage": {"prompt_tokens": 1, "completion_tokens": 2}}
            for event in (chunk, usage):
                yield b"data: " + json.dumps(event).encode() + b"\n\n"
            yield b"data: [DONE]\n\n"

        async def close() -> None:
            pass

        return Opened(chunks(), close)


def _with_echo(**settings: Any) -> tuple[Upstream, dict[str, Route]]:
    made: dict[str, Route] = {}

    def echo(s: FallbackSettings) -> Route:
        made["echo"] = EchoRoute(s)
        return made["echo"]

    kinds = Kinds(
        routes=MappingProxyType({**KINDS.routes, "echo": echo}),
        prefixes=MappingProxyType({**KINDS.prefixes, "echo": "echo"}),
    )
    fallback = FallbackSettings(api_base="", api_key_env="", max_retries=2, **settings)
    return Upstream(fallback, backoff_s=0.01, kinds=kinds), made


async def test_a_new_kind_of_provider_is_one_class_and_its_line_in_the_kinds() -> None:
    client, made = _with_echo(models={"small": "echo/small-v1", "bad": "echo/reject"})
    echo = made["echo"]
    assert isinstance(echo, EchoRoute)
    echo.refuse = 1
    async with client:
        assert echo.started
        body = {"model": "small", "messages": MSG, "base_url": "http://evil/", "top_k": 3}
        reply = await client.chat(body, request_id="req-echo")
        stream = await client.chat_stream({**body, "stream": True}, request_id="req-s")
        async with stream:
            raw = b"".join([chunk async for chunk in stream])
        with pytest.raises(UpstreamStatus) as refused:
            await client.chat({"model": "bad", "messages": MSG}, request_id="req-bad")
    assert not echo.started  # aclose reached it
    # the client's allow-list, model name and request id, the same as for the shipped routes
    assert echo.sent[0] == ({"model": "small-v1", "messages": MSG}, "req-echo")
    assert client.target("small") == "small-v1"
    # the retry policy around its attempts: a refused connection is retried, a 400 is not
    assert (reply.attempts, reply.status, reply.body["model"]) == (2, 200, "small-v1")
    assert (refused.value.status, refused.value.attempts) == (400, 1)
    # its stream relayed, the usage chunk the client did not ask for kept out and counted
    forward, request_id = echo.sent[2]
    assert forward["stream"] is True and forward["stream_options"] == {"include_usage": True}
    assert request_id == "req-s"
    assert b'"usage"' not in raw and raw.endswith(b"data: [DONE]\n\n")
    assert stream.usage == {"prompt_tokens": 1, "completion_tokens": 2}


async def test_a_target_naming_a_route_that_does_not_exist_is_refused_at_construction() -> None:
    kinds = Kinds(routes=KINDS.routes, prefixes={"myco": "myco"})
    with pytest.raises(ValueError, match="no route named 'myco'"):
        Upstream(FallbackSettings(models={"m": "myco/m1"}), kinds=kinds)


async def test_a_direct_call_with_no_api_base_fails_before_any_attempt() -> None:
    async with Upstream(FallbackSettings(api_base="", api_key_env="")) as client:
        with pytest.raises(UpstreamError) as failed:
            await client.chat({"model": "gpt-4o-mini", "messages": MSG}, request_id="r")
    assert failed.value.attempts == 0
    assert "api_base" in failed.value.message
