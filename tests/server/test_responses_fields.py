"""``include``, ``truncation``, ``user`` and ``metadata`` on ``/v1/responses``, with the official
``openai`` SDK against the in-process app: accepted and echoed on the local route, passed to the
upstream's own ``/v1/responses`` on the API route (and ``user`` to Chat Completions with
``"translate"``), a 400 naming the field when malformed or past its length (``client_metadata``,
Codex CLI's, too); the ``x-frugal-*`` headers and ``/metrics`` of each route; and a big body's
tool schemas checked once, in the body checker's thread."""

from __future__ import annotations

import json
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import openai
import pytest

from proxy.serving.body_check import INLINE_BYTES
from tests.conftest import settings_for
from tests.fake_api import FakeAPI
from tests.server.test_app import rows

LOCAL = {"x-frugal-min-quality": "0"}  # any scored answer is accepted
API = {"x-frugal-route": "api"}
QUESTION = "What is the capital of France?"
FIELDS: dict[str, Any] = {
    "include": ["message.output_text.logprobs"],
    "truncation": "auto",
    "user": "user-42",
    "metadata": {"team": "a"},
}


@pytest.fixture
def sdk(tmp_path: Path, fake_api: FakeAPI, make_client: Any) -> Callable[..., Any]:
    """``async with sdk(mode) as (client, http)``, ``mode`` the ``[fallback] responses``."""

    @asynccontextmanager
    async def factory(mode: str | None = None) -> AsyncIterator[Any]:
        fallback = {} if mode is None else {"responses": mode}
        async with make_client(settings_for(tmp_path, fake_api, fallback=fallback)) as http:
            client = openai.AsyncOpenAI(
                api_key="sk-unused", base_url="http://localhost/v1", http_client=http, max_retries=0
            )
            yield client, http

    return factory


async def test_on_the_local_route_they_are_accepted_and_echoed(
    sdk: Any, fake_api: FakeAPI, tmp_path: Path
) -> None:
    async with sdk() as (client, http):
        raw = await client.responses.with_raw_response.create(
            model="gpt-4o-mini",
            input=QUESTION,
            max_output_tokens=12,
            extra_headers=LOCAL,
            **FIELDS,
        )
        metrics = (await http.get("/metrics")).text
    response = raw.parse()
    assert (raw.headers["x-frugal-route"], raw.headers["x-frugal-reason"]) == ("local", "accepted")
    assert 0 <= float(raw.headers["x-frugal-quality"]) <= 1
    assert (response.truncation, response.user, response.metadata) == (
        "auto",
        "user-42",
        FIELDS["metadata"],
    )
    assert response.output_text and fake_api.count == 0
    [row] = rows(tmp_path / "ledger.db")
    assert (row["endpoint"], row["route"], row["reason"]) == ("responses", "local", "accepted")
    assert row["request_id"] == raw.headers["x-request-id"]
    counted = [
        line
        for line in metrics.splitlines()
        if line.startswith("frugal_requests_total{") and 'endpoint="responses"' in line
    ]
    assert [line.rsplit(" ", 1)[1] for line in counted] == ["1.0"]
    assert 'route="local"' in counted[0] and 'reason="accepted"' in counted[0]


async def test_on_the_api_route_they_reach_the_upstreams_own_responses(
    sdk: Any, fake_api: FakeAPI
) -> None:
    async with sdk() as (client, _http):
        raw = await client.responses.with_raw_response.create(
            model="gpt-4o-mini", input=QUESTION, extra_headers=API, **FIELDS
        )
    response = raw.parse()
    assert (raw.headers["x-frugal-route"], raw.headers["x-frugal-reason"]) == ("api", "forced")
    assert raw.headers["x-frugal-quality"] == "none"
    assert response.metadata == FIELDS["metadata"] and response.output_text == fake_api.reply
    [(path, _headers, sent)] = fake_api.requests
    assert path == "/v1/responses"
    assert {name: sent.get(name) for name in FIELDS} == FIELDS
    assert sent["store"] is False and "previous_response_id" not in sent


async def test_with_translate_the_user_reaches_chat_and_the_rest_stays_here(
    sdk: Any, fake_api: FakeAPI
) -> None:
    async with sdk("translate") as (client, _http):
        response = await client.responses.create(
            model="gpt-4o-mini", input=QUESTION, extra_headers=API, **FIELDS
        )
    assert (response.truncation, response.user, response.metadata) == (
        "auto",
        "user-42",
        FIELDS["metadata"],
    )
    [(path, _headers, sent)] = fake_api.requests
    assert path == "/v1/chat/completions" and sent["user"] == "user-42"
    assert not {"include", "truncation", "metadata", "store"} & set(sent)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("truncation", "sometimes"),
        ("include", "message.output_text.logprobs"),
        ("include", [1]),
        ("user", 42),
        ("metadata", {"team": 1}),
        ("metadata", "team"),
        ("user", "u" * 65),
        ("safety_identifier", "s" * 65),
        ("prompt_cache_key", "p" * 65),
        ("client_metadata", {f"k{i}": "v" for i in range(17)}),
        ("client_metadata", {"k": "v" * 4097}),
        ("client_metadata", {"k": 1}),
    ],
)
async def test_a_malformed_field_is_a_400_naming_it(
    sdk: Any, fake_api: FakeAPI, tmp_path: Path, field: str, value: Any
) -> None:
    async with sdk() as (client, _http):
        with pytest.raises(openai.BadRequestError) as caught:
            await client.responses.create(
                model="gpt-4o-mini", input=QUESTION, extra_body={field: value}
            )
    assert caught.value.status_code == 400
    error: Any = caught.value.body
    assert error["param"] is not None and error["param"].split(".")[0] == field, error
    assert fake_api.count == 0
    [row] = rows(tmp_path / "ledger.db")
    assert (row["endpoint"], row["status"]) == ("responses", 400)


async def test_client_metadata_is_accepted_and_reaches_the_upstreams_own_responses(
    sdk: Any, fake_api: FakeAPI
) -> None:
    """Codex CLI sends ``client_metadata``, a map of strings: accepted, bounded as
    ``metadata`` (the 400s above), and sent on to the upstream's own /v1/responses."""
    tags = {"session_id": "s-1", "originator": "codex_cli_rs"}
    async with sdk() as (client, _http):
        raw = await client.responses.with_raw_response.create(
            model="gpt-4o-mini",
            input=QUESTION,
            extra_headers=API,
            extra_body={"client_metadata": tags},
        )
    assert raw.status_code == 200
    [(path, _headers, sent)] = fake_api.requests
    assert path == "/v1/responses" and sent["client_metadata"] == tags


async def test_a_big_bodys_tool_schemas_are_checked_once_and_off_the_event_loop(
    sdk: Any, fake_api: FakeAPI, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A body past body_check's INLINE_BYTES is checked in a thread of its own pool; the tool's
    JSON Schema (about 1 s of CPU at 60,000 properties) is checked there, once, and not again
    on the event loop when the request becomes a chat request (issue 39, finding 5)."""
    import quality

    threads: list[str] = []
    check = quality.check_schema

    def spied(schema: Any) -> str | None:
        threads.append(threading.current_thread().name)
        return check(schema)

    monkeypatch.setattr(quality, "check_schema", spied)
    schema = {"type": "object", "properties": {f"p{i}": {} for i in range(10_000)}}
    tool = {"type": "function", "name": "wide", "parameters": schema}
    assert len(json.dumps(tool)) > INLINE_BYTES
    async with sdk() as (client, _http):
        raw = await client.responses.with_raw_response.create(
            model="gpt-4o-mini", input=QUESTION, extra_headers=API, tools=[tool]
        )
    assert raw.status_code == 200
    assert len(threads) == 1 and threads[0].startswith("frugal-body"), threads
