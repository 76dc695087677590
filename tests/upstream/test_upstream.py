"""The fallback client against a real fake API on loopback: answers, streams, retries, faults.

Retries are only those that cannot bill twice: connections refused, 408, 429, 502, 503, 504.
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
import struct
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from email.utils import formatdate
from typing import Any

import httpx
import pytest

from proxy.config import FallbackSettings
from proxy.config.secrets import MARK
from proxy.errors import UpstreamError, UpstreamRateLimited, UpstreamStatus, UpstreamTimeout
from proxy.upstream import responses_api
from proxy.upstream.client import Upstream, UpstreamStream
from proxy.upstream.direct_route import KEEPALIVE_S
from proxy.upstream.failures import parse_retry_after, translate
from tests.conftest import module_api
from tests.fake_api import FakeAPI
from tests.loopback import Listener

KEY_ENV = "FRUGAL_TEST_UPSTREAM_KEY"
KEY = "sk-test-0123456789"
PROMPT = "What is the capital of France?"
CHAT: dict[str, Any] = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": PROMPT}]}


api = module_api()


@pytest.fixture(autouse=True)
def fresh(api: FakeAPI, monkeypatch: pytest.MonkeyPatch) -> None:
    api.reset()
    monkeypatch.setenv(KEY_ENV, KEY)


def settings(api: FakeAPI, **overrides: Any) -> FallbackSettings:
    values: dict[str, Any] = {
        "api_base": api.url,
        "api_key_env": KEY_ENV,
        "timeout_s": 5.0,
        "connect_timeout_s": 1.0,
        "max_retries": 2,
    }
    return FallbackSettings(**{**values, **overrides})


@asynccontextmanager
async def upstream(api: FakeAPI, **overrides: Any) -> AsyncIterator[Upstream]:
    async with Upstream(settings(api, **overrides), backoff_s=0.01) as client:
        yield client


async def read_all(stream: UpstreamStream) -> list[bytes]:
    async with stream:
        return [chunk async for chunk in stream]


def events(raw: bytes) -> list[bytes]:
    return [e for e in raw.split(b"\n\n") if e]


def payloads(raw: bytes) -> list[Any]:
    """The JSON of every data event except [DONE]."""
    return [json.loads(e[len(b"data: ") :]) for e in events(raw) if e != b"data: [DONE]"]


def streamed_text(raw: bytes) -> str:
    return "".join(
        p["choices"][0]["delta"].get("content") or "" for p in payloads(raw) if p["choices"]
    )


# -- plain answers -------------------------------------------------------------------------------


async def test_chat_returns_the_upstream_completion(api: FakeAPI) -> None:
    api.set(reply="Bonjour tout le monde.")
    async with upstream(api) as client:
        result = await client.chat(CHAT, request_id="req-1")
    assert result.status == 200
    assert result.attempts == 1
    assert result.latency_s > 0
    assert result.body["object"] == "chat.completion"
    assert result.body["choices"][0]["message"]["content"] == "Bonjour tout le monde."
    assert result.body["usage"] == {"prompt_tokens": 6, "completion_tokens": 4, "total_tokens": 10}


async def test_chat_sends_the_key_the_request_id_and_the_body_unchanged(api: FakeAPI) -> None:
    api.set(require_key=KEY)
    async with upstream(api) as client:
        await client.chat(CHAT, request_id="req-42")
    path, headers, body = api.requests[0]
    assert path == "/v1/chat/completions"
    assert headers["authorization"] == f"Bearer {KEY}"
    assert headers["x-request-id"] == "req-42"
    assert headers["content-type"] == "application/json"
    assert body == CHAT


async def test_no_authorization_header_when_no_key_is_needed(api: FakeAPI) -> None:
    async with upstream(api, api_key_env="") as client:
        assert client.enabled
        await client.chat(CHAT, request_id="r")
    assert "authorization" not in api.requests[0].headers


def test_fallback_is_disabled_while_its_key_variable_is_unset_or_empty(
    api: FakeAPI, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert Upstream(settings(api)).enabled
    monkeypatch.delenv(KEY_ENV)
    assert not Upstream(settings(api)).enabled
    monkeypatch.setenv(KEY_ENV, "")
    assert not Upstream(settings(api)).enabled


async def test_model_mapping_sends_the_mapped_name_and_passes_others_unchanged(
    api: FakeAPI,
) -> None:
    models = {"gpt-4o-mini": "openai/fake-small", "big": "fake-big"}
    async with upstream(api, models=models) as client:
        assert client.model_ids() == ["gpt-4o-mini", "big"]
        assert client.target("gpt-4o-mini") == "fake-small"
        assert client.target("big") == "fake-big"
        assert client.target("meta-llama/Llama-3-8b") == "meta-llama/Llama-3-8b"
        await client.chat(CHAT, request_id="r")
        await client.chat({**CHAT, "model": "big"}, request_id="r")
        await client.chat({**CHAT, "model": "meta-llama/Llama-3-8b"}, request_id="r")
    assert [r.body["model"] for r in api.requests] == [
        "fake-small",
        "fake-big",
        "meta-llama/Llama-3-8b",
    ]


async def test_post_json_passes_embeddings_and_legacy_completions_through(api: FakeAPI) -> None:
    async with upstream(api) as client:
        embed = {"model": "text-embedding-3-small", "input": ["a b", "c"]}
        embedded = await client.post_json("/embeddings", embed, request_id="r")
        complete = {"model": "gpt-3.5-turbo-instruct", "prompt": "Say hi"}
        completed = await client.post_json("/completions", complete, request_id="r")
    assert [d["index"] for d in embedded.body["data"]] == [0, 1]
    assert len(embedded.body["data"][0]["embedding"]) == 8
    assert completed.body["choices"][0]["text"] == api.reply
    assert [r.path for r in api.requests] == ["/v1/embeddings", "/v1/completions"]


async def test_every_call_posts_exactly_the_body_sent_says(api: FakeAPI) -> None:
    # A key's budget reserves the worst case of Upstream.sent (issue 39): each call must post
    # that very body, after the model mapping, the allow-list and the stream flags.
    chat = {**CHAT, "model": "small", "stream": True, "stream_options": {"x": 1}, "n": 2}
    complete = {"model": "small", "prompt": ["a", "b"], "max_tokens": 3, "stream": False}
    embed = {"model": "small", "input": ["a b", "c"]}
    responses = {"model": "fake-small", "input": [{"role": "user", "content": PROMPT}]}
    async with upstream(api, models={"small": "openai/fake-small"}) as client:
        await client.chat(chat, request_id="r")
        stream = await client.chat_stream(chat, request_id="r")
        await read_all(stream)
        await client.post_json("/completions", complete, request_id="r")
        await client.post_json("/embeddings", embed, request_id="r")
        await responses_api.create(client, responses, request_id="r")
        await read_all(await responses_api.open_stream(client, responses, request_id="r"))
        expected = [
            client.sent("/chat/completions", chat),
            client.sent("/chat/completions", chat, stream=True),
            client.sent("/completions", complete),
            client.sent("/embeddings", embed),
            client.sent("/responses", responses),
            client.sent("/responses", responses, stream=True),
        ]
    assert [r.body for r in api.requests] == expected
    assert {e["model"] for e in expected} == {"fake-small"}
    assert expected[0]["stream"] is False and "stream_options" not in expected[0]
    assert expected[1]["stream_options"] == {"x": 1, "include_usage": True}
    assert [e.get("stream") for e in expected[4:]] == [False, True]


# -- streams -------------------------------------------------------------------------------------


async def test_stream_relays_whole_events_as_they_come_and_ends_with_done(api: FakeAPI) -> None:
    api.set(reply="one two three", per_token_s=0.01, latency_s=0.05)
    async with upstream(api) as client:
        stream = await client.chat_stream({**CHAT, "stream": True}, request_id="r")
        assert stream.latency_s >= 0.05
        chunks = await read_all(stream)
    assert len(chunks) > 1
    assert all(chunk.endswith(b"\n\n") for chunk in chunks)
    raw = b"".join(chunks)
    assert events(raw)[-1] == b"data: [DONE]"
    assert streamed_text(raw) == "one two three"
    assert payloads(raw)[-1]["choices"][0]["finish_reason"] == "stop"


async def test_stream_usage_is_captured_but_hidden_from_a_client_that_did_not_ask(
    api: FakeAPI,
) -> None:
    body = {**CHAT, "stream": True}
    async with upstream(api) as client:
        stream = await client.chat_stream(body, request_id="r")
        raw = b"".join(await read_all(stream))
    assert api.requests[0].body["stream_options"] == {"include_usage": True}
    assert "stream_options" not in body
    assert b'"usage"' not in raw
    assert streamed_text(raw) == api.reply
    assert stream.usage == {"prompt_tokens": 6, "completion_tokens": 6, "total_tokens": 12}


async def test_stream_keeps_the_usage_chunk_for_a_client_that_asked(api: FakeAPI) -> None:
    body = {**CHAT, "stream": True, "stream_options": {"include_usage": True}}
    async with upstream(api) as client:
        stream = await client.chat_stream(body, request_id="r")
        raw = b"".join(await read_all(stream))
    last = payloads(raw)[-1]
    assert last["choices"] == []
    assert last["usage"] == {"prompt_tokens": 6, "completion_tokens": 6, "total_tokens": 12}
    assert all(p["usage"] is None for p in payloads(raw)[:-1])
    assert stream.usage == last["usage"]


async def test_stream_reassembles_events_split_across_reads() -> None:
    role = b'{"choices":[{"index":0,"delta":{"role":"assistant"}}],"usage":null}'
    text = b'{"choices":[{"index":0,"delta":{"content":"Hi"}}],"usage":null}'
    usage = b'{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}'
    wire = b"".join(b"data: " + e + b"\r\n\r\n" for e in (role, text, usage, b"[DONE]"))

    async def one_byte_at_a_time() -> AsyncIterator[bytes]:
        for i in range(len(wire)):
            yield wire[i : i + 1]

    async def nothing_to_close() -> None:
        return None

    stream = UpstreamStream(
        one_byte_at_a_time(), nothing_to_close, strip_usage=True, latency_s=0.0, attempts=1
    )
    chunks = await read_all(stream)
    assert b"".join(chunks) == (
        b'data: {"choices":[{"index":0,"delta":{"role":"assistant"}}]}\n\n'
        b'data: {"choices":[{"index":0,"delta":{"content":"Hi"}}]}\n\n'
        b"data: [DONE]\n\n"
    )
    assert all(chunk.endswith(b"\n\n") for chunk in chunks)
    assert stream.usage == {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}


async def test_stream_is_retried_until_upstream_answers(api: FakeAPI) -> None:
    api.set(fail_status=503, fail_times=1)
    async with upstream(api) as client:
        stream = await client.chat_stream({**CHAT, "stream": True}, request_id="r")
        raw = b"".join(await read_all(stream))
    assert stream.attempts == 2
    assert streamed_text(raw) == api.reply


async def test_stream_refused_before_the_first_byte_raises_from_chat_stream(api: FakeAPI) -> None:
    api.set(fail_status=400, error_message="'messages' is too short")
    async with upstream(api) as client:
        with pytest.raises(UpstreamStatus) as caught:
            await client.chat_stream({**CHAT, "stream": True}, request_id="r")
    assert caught.value.status == 400
    assert caught.value.message == "'messages' is too short"
    assert api.count == 1


async def test_cut_stream_raises_after_relaying_what_arrived_and_is_not_retried(
    api: FakeAPI,
) -> None:
    api.set(cut_stream_after=3, per_token_s=0.01)
    received: list[bytes] = []
    async with upstream(api) as client:
        stream = await client.chat_stream({**CHAT, "stream": True}, request_id="r")
        with pytest.raises(UpstreamError) as caught:
            async with stream:
                async for chunk in stream:
                    received.append(chunk)
    assert caught.value.status == 502
    assert caught.value.attempts == 1
    assert len(events(b"".join(received))) == 3
    assert streamed_text(b"".join(received)) == "Paris is"
    assert api.count == 1


# -- retries and failures ------------------------------------------------------------------------


async def test_429_waits_for_retry_after_then_succeeds(api: FakeAPI) -> None:
    api.set(fail_status=429, fail_times=1, retry_after=1)
    async with upstream(api) as client:
        result = await client.chat(CHAT, request_id="r")
    assert result.attempts == 2
    assert api.count == 2
    assert api.request_times[1] - api.request_times[0] >= 1.0 - 0.01


async def test_retry_after_beyond_the_cap_fails_at_once_as_a_429(api: FakeAPI) -> None:
    api.set(fail_status=429, retry_after=60)
    started = time.monotonic()
    async with upstream(api, timeout_s=120.0) as client:
        with pytest.raises(UpstreamRateLimited) as caught:
            await client.chat(CHAT, request_id="r")
    assert time.monotonic() - started < 1.0
    error = caught.value
    assert (error.status, error.type, error.code) == (429, "requests", "rate_limit_exceeded")
    assert error.headers == {"retry-after": "60"}
    assert "429" in error.message
    assert error.attempts == 1
    assert api.count == 1


async def test_429_on_every_attempt_is_passed_on_with_the_last_retry_after(api: FakeAPI) -> None:
    api.set(fail_status=429, retry_after=1)
    async with upstream(api, max_retries=1) as client:
        with pytest.raises(UpstreamRateLimited) as caught:
            await client.chat(CHAT, request_id="r")
    assert caught.value.status == 429
    assert caught.value.headers == {"retry-after": "1"}
    assert caught.value.attempts == 2
    assert api.count == 2


async def test_429_without_retry_after_is_a_429_without_the_header(api: FakeAPI) -> None:
    api.set(fail_status=429)
    async with upstream(api, max_retries=0) as client:
        with pytest.raises(UpstreamRateLimited) as caught:
            await client.chat(CHAT, request_id="r")
    assert caught.value.headers == {}
    assert caught.value.attempts == 1


def test_retry_after_is_read_as_seconds_or_as_an_http_date() -> None:
    assert parse_retry_after(httpx.Headers({"retry-after": "7"})) == 7.0
    assert parse_retry_after(httpx.Headers({"retry-after-ms": "250"})) == 0.25
    in_30_s = formatdate(time.time() + 30, usegmt=True)
    wait = parse_retry_after(httpx.Headers({"retry-after": in_30_s}))
    assert wait is not None and 28 <= wait <= 30
    assert parse_retry_after(httpx.Headers({"retry-after": "soon"})) is None
    assert parse_retry_after(httpx.Headers()) is None


class _ProviderError(Exception):
    """A provider's error that carries only a status, as some of litellm's do."""

    def __init__(self, status_code: int) -> None:
        super().__init__(f"status {status_code}")
        self.status_code = status_code


@pytest.mark.parametrize(
    ("status", "kind", "sent"),
    [
        (404, UpstreamStatus, 404),  # the API's refusal, passed on
        (422, UpstreamStatus, 422),
        (401, UpstreamError, 502),  # the proxy's own key: never the client's 401
        (403, UpstreamError, 502),
        (408, UpstreamError, 502),
        (500, UpstreamError, 502),
    ],
)
def test_translate_turns_a_bare_status_into_the_error_the_client_sees(
    status: int, kind: type[UpstreamError | UpstreamStatus], sent: int
) -> None:
    error = translate(_ProviderError(status), 2)
    assert type(error) is kind
    assert (error.status, error.attempts) == (sent, 2)


def test_translate_keeps_a_proxy_error_and_sets_its_attempts() -> None:
    original = UpstreamTimeout("slow")
    assert translate(original, 3) is original and original.attempts == 3
    unknown = translate(ValueError("odd"), 1)
    assert type(unknown) is UpstreamError and "odd" not in unknown.message


@pytest.mark.parametrize("status", [408, 502, 503, 504])
async def test_gateway_errors_are_retried_two_then_success_takes_three_attempts(
    api: FakeAPI, status: int
) -> None:
    api.set(fail_status=status, fail_times=2)
    async with upstream(api) as client:
        result = await client.chat(CHAT, request_id="r")
    assert result.attempts == 3
    assert api.count == 3
    assert result.body["choices"][0]["message"]["content"] == api.reply


async def test_persistent_503_becomes_502_after_every_attempt(api: FakeAPI) -> None:
    api.set(fail_status=503)
    async with upstream(api, max_retries=2) as client:
        with pytest.raises(UpstreamError) as caught:
            await client.chat(CHAT, request_id="r")
    error = caught.value
    assert type(error) is UpstreamError
    assert error.status == 502
    assert "3 attempts" in error.message
    assert error.attempts == 3
    assert PROMPT not in error.message and KEY not in error.message
    assert api.count == 3


@pytest.mark.parametrize("status", [500, 501, 505])
async def test_other_5xx_are_not_retried_since_the_api_may_have_done_the_work(
    api: FakeAPI, status: int
) -> None:
    api.set(fail_status=status)
    async with upstream(api, max_retries=2) as client:
        with pytest.raises(UpstreamError) as caught:
            await client.chat(CHAT, request_id="r")
        with pytest.raises(UpstreamError) as streamed:
            await client.chat_stream({**CHAT, "stream": True}, request_id="r")
    for error in (caught.value, streamed.value):
        assert type(error) is UpstreamError
        assert error.status == 502
        assert str(status) in error.message
        assert error.attempts == 1
        assert PROMPT not in error.message and KEY not in error.message
    assert api.count == 2


class DropAfterRequest(Listener):
    """A loopback HTTP server that reads each whole request, then closes without answering:
    with ``reset`` by a TCP RST (SO_LINGER 0), else with a plain FIN."""

    def __init__(self, *, reset: bool) -> None:
        super().__init__()
        self.reset = reset
        self.requests = 0

    def handle(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(5)
            data = b""
            while b"\r\n\r\n" not in data:
                data += conn.recv(65536)
            head, _, body = data.partition(b"\r\n\r\n")
            match = re.search(rb"(?i)content-length: *(\d+)", head)
            length = int(match.group(1)) if match else 0
            while len(body) < length:
                body += conn.recv(65536)
            self.requests += 1
            if self.reset:
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


@pytest.mark.parametrize("reset", [True, False], ids=["reset", "closed"])
async def test_a_connection_lost_after_the_request_was_sent_is_not_retried(
    api: FakeAPI, reset: bool
) -> None:
    with DropAfterRequest(reset=reset) as server:
        async with upstream(api, api_base=server.url, max_retries=2) as client:
            with pytest.raises(UpstreamError) as caught:
                await client.chat(CHAT, request_id="r")
            with pytest.raises(UpstreamError) as streamed:
                await client.chat_stream({**CHAT, "stream": True}, request_id="r")
        assert server.requests == 2  # one each: the API may have done (and billed) the work
    for error in (caught.value, streamed.value):
        assert error.status == 502
        assert error.attempts == 1
        assert KEY not in error.message and PROMPT not in error.message


class ClosesIdleConnections(Listener):
    """A keep-alive server that answers every request on a connection, except one that arrives
    after the connection was idle for ``idle_close_s``: that one it resets, as a server does when
    its idle timeout closes the connection just as the client writes into it."""

    ANSWER = json.dumps(
        {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 0,
            "model": "gpt-4o-mini",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "Paris."},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 7, "completion_tokens": 2, "total_tokens": 9},
        }
    ).encode()

    def __init__(self, idle_close_s: float) -> None:
        super().__init__()
        self.idle_close_s = idle_close_s
        self.answered = 0
        self.reset = 0

    def handle(self, conn: socket.socket) -> None:
        threading.Thread(target=self._keep_alive, args=(conn,), daemon=True).start()

    def _keep_alive(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(30)
            idle_since: float | None = None
            data = b""
            while True:
                while b"\r\n\r\n" not in data:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    data += chunk
                head, _, data = data.partition(b"\r\n\r\n")
                match = re.search(rb"(?i)content-length: *(\d+)", head)
                length = int(match.group(1)) if match else 0
                while len(data) < length:
                    data += conn.recv(65536)
                data = data[length:]
                if idle_since is not None and time.monotonic() - idle_since >= self.idle_close_s:
                    self.reset += 1
                    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    return
                conn.sendall(
                    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                    + f"content-length: {len(self.ANSWER)}\r\n\r\n".encode()
                    + self.ANSWER
                )
                self.answered += 1
                idle_since = time.monotonic()


async def test_an_idle_connection_is_not_reused_once_the_server_may_have_closed_it(
    api: FakeAPI,
) -> None:
    # uvicorn and llama-server close a connection idle for 5 s. A pooled connection reused
    # later than the client's keep-alive (under 5 s) can meet that close: the request is reset,
    # and since the API might have read it, it is not retried. The CI's schemathesis run once
    # got exactly this 502 from the fake API.
    with ClosesIdleConnections(idle_close_s=KEEPALIVE_S + 0.3) as server:
        async with upstream(api, api_base=server.url) as client:
            first = await client.chat(CHAT, request_id="r1")
            quick = await client.chat(CHAT, request_id="r2")  # reused: not idle for long
            await asyncio.sleep(KEEPALIVE_S + 0.5)
            late = await client.chat(CHAT, request_id="r3")  # a fresh connection
    assert [r.status for r in (first, quick, late)] == [200, 200, 200]
    assert late.attempts == 1
    assert server.answered == 3 and server.reset == 0
    assert server.connections == 2


async def test_hung_upstream_gives_504_within_the_timeout(api: FakeAPI) -> None:
    api.set(hang=True)
    started = time.monotonic()
    async with upstream(api, timeout_s=0.3) as client:
        with pytest.raises(UpstreamTimeout) as caught:
            await client.chat(CHAT, request_id="r")
    assert 0.3 <= time.monotonic() - started < 1.0
    assert caught.value.status == 504
    assert caught.value.attempts == 1
    assert api.count == 1  # a read timeout is never retried: the API has the request


async def test_unreachable_upstream_is_retried_then_gives_502(api: FakeAPI) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # free once closed: nothing listens there
    async with upstream(api, api_base=f"http://127.0.0.1:{port}/v1", max_retries=2) as client:
        with pytest.raises(UpstreamError) as caught:
            await client.chat(CHAT, request_id="r")
    assert caught.value.status == 502
    assert caught.value.attempts == 3  # refused: the request never left, so retrying is safe
    assert KEY not in caught.value.message


async def test_400_passes_upstreams_error_on_and_is_not_retried(api: FakeAPI) -> None:
    message = "Invalid value for 'temperature': must be at most 2."
    api.set(fail_status=400, error_message=message)
    async with upstream(api) as client:
        with pytest.raises(UpstreamStatus) as caught:
            await client.chat({**CHAT, "temperature": 9}, request_id="r")
    error = caught.value
    assert error.status == 400
    assert error.body() == {
        "error": {"message": message, "type": "invalid_request_error", "param": None, "code": None}
    }
    assert error.attempts == 1
    assert api.count == 1


async def test_rejected_proxy_key_gives_502_without_echoing_the_key(api: FakeAPI) -> None:
    api.set(require_key="sk-some-other-key")
    async with upstream(api) as client:
        with pytest.raises(UpstreamError) as caught:
            await client.chat(CHAT, request_id="r")
    assert caught.value.status == 502
    assert KEY[-4:] not in caught.value.message
    assert "api_key_env" in caught.value.message
    assert api.count == 1


# -- other providers through litellm -------------------------------------------------------------


async def test_provider_prefixed_target_goes_through_litellm(
    api: FakeAPI, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOSTED_VLLM_API_BASE", api.url)
    api.set(reply="Via litellm.")
    async with upstream(api, models={"gpt-4o-mini": "hosted_vllm/served-model"}) as client:
        assert client.target("gpt-4o-mini") == "hosted_vllm/served-model"
        result = await client.chat(CHAT, request_id="req-lite")
        stream = await client.chat_stream({**CHAT, "stream": True}, request_id="req-lite")
        raw = b"".join(await read_all(stream))
    assert result.body["choices"][0]["message"]["content"] == "Via litellm."
    assert [r.body["model"] for r in api.requests] == ["served-model", "served-model"]
    assert api.requests[0].headers["x-request-id"] == "req-lite"
    assert streamed_text(raw) == "Via litellm."
    assert events(raw)[-1] == b"data: [DONE]"
    assert stream.usage is not None and stream.usage["completion_tokens"] == 2


async def test_litellm_route_follows_the_same_retry_rules(
    api: FakeAPI, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOSTED_VLLM_API_BASE", api.url)
    models = {"gpt-4o-mini": "hosted_vllm/served-model"}
    async with upstream(api, models=models, max_retries=2) as client:
        api.set(fail_status=503, fail_times=1)
        retried = await client.chat(CHAT, request_id="r")
        assert (retried.attempts, api.count) == (2, 2)
        api.reset()
        api.set(fail_status=500)
        with pytest.raises(UpstreamError) as failed:
            await client.chat(CHAT, request_id="r")
        assert (failed.value.status, failed.value.attempts, api.count) == (502, 1, 1)
        api.reset()
        api.set(fail_status=429, retry_after=30)
        with pytest.raises(UpstreamRateLimited) as limited:
            await client.chat(CHAT, request_id="r")
    assert limited.value.status == 429
    assert limited.value.headers == {"retry-after": "30"}
    assert (limited.value.attempts, api.count) == (1, 1)


# -- the answer's size bound ([fallback] max_answer_bytes) -----------------------------------------


async def test_an_answer_past_max_answer_bytes_is_a_502_that_says_so_and_is_not_retried(
    api: FakeAPI,
) -> None:
    api.set(huge_reply_bytes=8 * 1024 * 1024)  # sent without a Content-Length
    async with upstream(api, max_answer_bytes=1024 * 1024) as client:
        with pytest.raises(UpstreamError) as caught:
            await client.chat(CHAT, request_id="r")
    assert caught.value.status == 502 and caught.value.attempts == 1
    assert "too large: more than 1048576 bytes" in caught.value.message
    assert "[fallback] max_answer_bytes" in caught.value.message
    assert api.count == 1
    print(f"sent {api.huge_sent} of 8 MiB before the client left")


async def test_an_answer_under_max_answer_bytes_is_read_and_parsed_whole(api: FakeAPI) -> None:
    size = 900 * 1024  # parsed in a thread (over PARSE_IN_THREAD_BYTES)
    api.set(huge_reply_bytes=size)
    async with upstream(api, max_answer_bytes=1024 * 1024) as client:
        answer = await client.chat(CHAT, request_id="r")
    assert answer.body["choices"][0]["message"]["content"] == "a" * size
    assert json.loads(answer.raw) == answer.body


async def test_a_stream_event_that_grows_past_max_answer_bytes_ends_the_stream(
    api: FakeAPI,
) -> None:
    api.set(huge_reply_bytes=8 * 1024 * 1024)  # one event, one line, 8 MiB long
    async with upstream(api, max_answer_bytes=1024 * 1024) as client:
        stream = await client.chat_stream({**CHAT, "stream": True}, request_id="r")
        with pytest.raises(UpstreamError) as caught:
            await read_all(stream)
    assert caught.value.status == 502
    assert "stream event was too large: more than 1048576 bytes" in caught.value.message
    assert api.count == 1


async def test_a_long_event_under_the_bound_is_relayed_whole_from_many_reads() -> None:
    content = "b" * 300_000
    event = json.dumps({"choices": [{"index": 0, "delta": {"content": content}}]}).encode()
    wire = b"data: " + event + b"\r\n\r\ndata: [DONE]\r\n\r\n"

    async def small_reads() -> AsyncIterator[bytes]:
        for i in range(0, len(wire), 7):
            yield wire[i : i + 7]

    async def nothing_to_close() -> None:
        return None

    stream = UpstreamStream(
        small_reads(),
        nothing_to_close,
        strip_usage=False,
        latency_s=0.0,
        attempts=1,
        max_event_bytes=len(event) + 100,
    )
    chunks = await read_all(stream)
    assert chunks == [b"data: " + event + b"\n\n", b"data: [DONE]\n\n"]


async def test_an_embeddings_answer_may_take_its_share_per_input_past_max_answer_bytes(
    api: FakeAPI,
) -> None:
    """A batch's vectors are bounded per input (EMBEDDING_BYTES each), not by the chat bound:
    100 inputs answer ~20 KB, over a 1 KiB max_answer_bytes; a legacy completion is held to it."""
    embed = {"model": "text-embedding-3-small", "input": [f"text {i}" for i in range(100)]}
    api.set(reply="word " * 400)
    async with upstream(api, max_answer_bytes=1024) as client:
        embedded = await client.post_json("/embeddings", embed, request_id="r")
        with pytest.raises(UpstreamError, match="too large: more than 1024 bytes"):
            await client.post_json(
                "/completions", {"model": "gpt-3.5-turbo-instruct", "prompt": "x"}, request_id="r"
            )
    assert len(embedded.raw) > 1024 and len(embedded.body["data"]) == 100


async def test_an_answer_whose_content_length_is_past_the_bound_is_refused_unread(
    api: FakeAPI,
) -> None:
    api.set(reply="word " * 5000)  # about 25 KB of JSON, with its Content-Length
    async with upstream(api, max_answer_bytes=4096) as client:
        with pytest.raises(UpstreamError, match="too large: more than 4096 bytes"):
            await client.chat(CHAT, request_id="r")
        api.set(reply="Paris.")
        assert (await client.chat(CHAT, request_id="r")).body["choices"][0]["message"]["content"]
    assert api.count == 2


# -- issue 39: an upstream that echoes the request's Authorization --------------------------------

ECHOED_KEY = "sk-echo+i39/key=0123456789abcdef"
ECHOED_TAIL = "0123456789abcdef"  # the part of the key no mark or prefix shares


@pytest.mark.parametrize("status", [400, 404, 422])
async def test_a_refusal_that_echoes_the_key_is_passed_on_without_it(
    api: FakeAPI, monkeypatch: pytest.MonkeyPatch, status: int
) -> None:
    monkeypatch.setenv(KEY_ENV, ECHOED_KEY)
    api.set(fail_status=status, echo_auth=True)
    async with upstream(api) as client:
        with pytest.raises(UpstreamStatus) as caught:
            await client.chat(CHAT, request_id="echo")
    assert api.requests[0].headers["authorization"] == f"Bearer {ECHOED_KEY}"
    told = json.dumps(caught.value.body())
    print(f"HTTP {status} relayed as {told}")
    assert caught.value.status == status
    assert ECHOED_TAIL not in told and "%2F" not in told
    assert (caught.value.param, caught.value.code) == (MARK, MARK)
    assert caught.value.message.count(MARK) == 3  # the header, the bare key, the query form


async def test_a_stream_error_event_that_echoes_the_key_is_relayed_without_it(
    api: FakeAPI, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(KEY_ENV, ECHOED_KEY)
    api.set(echo_auth=True, reply="Paris is big")
    async with upstream(api) as client:
        stream = await client.chat_stream({**CHAT, "stream": True}, request_id="echo")
        raw = b"".join(await read_all(stream))
    print(raw.decode())
    error = [p for p in payloads(raw) if "error" in p]
    assert len(error) == 1 and error[0]["error"]["code"] == MARK
    assert ECHOED_TAIL.encode() not in raw and MARK.encode() in raw
    assert raw.endswith(b"data: [DONE]\n\n")


async def test_an_answer_that_echoes_the_key_is_relayed_without_it(
    api: FakeAPI, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(KEY_ENV, ECHOED_KEY)
    api.set(reply=f"your key is {ECHOED_KEY}")
    async with upstream(api) as client:
        reply = await client.chat(CHAT, request_id="echo")
    assert ECHOED_TAIL.encode() not in reply.raw
    assert reply.body["choices"][0]["message"]["content"] == f"your key is {MARK}"


# -- the litellm route's answer read up to the bound ----------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_a_litellm_answer_past_max_answer_bytes_is_cut_as_it_is_read(
    api: FakeAPI, monkeypatch: pytest.MonkeyPatch, stream: bool
) -> None:
    """litellm reads a hosted_vllm answer with the route's bounded client: a 64 MiB answer
    against a 1 MiB bound is cut soon after the bound (what the fake counts as sent includes
    what loopback's socket buffers took, a few MiB), a 502 that says so, not retried."""
    monkeypatch.setenv("HOSTED_VLLM_API_BASE", api.url)
    api.set(huge_reply_bytes=64 * 1024 * 1024)  # a MiB a write, no Content-Length
    models = {"gpt-4o-mini": "hosted_vllm/served-model"}
    async with upstream(api, models=models, max_answer_bytes=1024 * 1024, max_retries=2) as client:
        with pytest.raises(UpstreamError) as caught:
            if stream:
                await read_all(await client.chat_stream({**CHAT, "stream": True}, request_id="r"))
            else:
                await client.chat(CHAT, request_id="r")
    print(f"litellm {'stream' if stream else 'json'}: sent {api.huge_sent} of 64 MiB")
    assert caught.value.status == 502 and caught.value.attempts == 1
    what = "stream event" if stream else "answer"
    assert f"{what} was too large: more than 1048576 bytes" in caught.value.message
    assert "[fallback] max_answer_bytes" in caught.value.message
    assert api.count == 1
    assert api.huge_sent <= 16 * 1024 * 1024  # read whole, it would be all 64 MiB
