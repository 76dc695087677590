"""How a ``/v1/responses`` stream ends other than ``response.completed``: ``response.incomplete``
(an answer cut by ``max_output_tokens``: local in ``verify`` and ``live`` mode, and the API's own
relayed) and ``response.failed`` (the API's own, relayed under our id, stored as failed and
recorded). The official ``openai`` SDK against the in-process app, the real SmolLM2, the fake
API's ``/v1/responses``."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.conftest import settings_for
from tests.fake_api import FakeAPI
from tests.server.test_app import rows

API = {"x-frugal-route": "api"}
QUESTION = "Tell me about the history of Paris, the capital of France."


@pytest.fixture
def sdk(tmp_path: Path, fake_api: FakeAPI, make_client: Any) -> Callable[..., Any]:
    """``async with sdk(stream_mode) as client``: the default fallback (the API's own)."""

    @asynccontextmanager
    async def factory(stream_mode: str = "verify") -> AsyncIterator[openai.AsyncOpenAI]:
        settings = settings_for(tmp_path, fake_api, router={"stream_mode": stream_mode})
        async with make_client(settings) as http:
            yield openai.AsyncOpenAI(
                api_key="sk-unused", base_url="http://localhost/v1", http_client=http, max_retries=0
            )

    return factory


async def _events(client: openai.AsyncOpenAI, headers: dict[str, str], **more: Any) -> Any:
    stream = await client.responses.create(
        model="gpt-4o-mini", input=QUESTION, stream=True, extra_headers=headers, **more
    )
    return [event async for event in stream]


@pytest.mark.parametrize(
    ("mode", "headers", "route"),
    [
        ("verify", {"x-frugal-route": "local"}, "local"),
        ("live", {}, "local"),
        ("verify", API, "api"),
    ],
    ids=["local-verify", "local-live", "api"],
)
async def test_an_answer_cut_by_max_output_tokens_ends_with_response_incomplete(
    sdk: Any,
    fake_api: FakeAPI,
    tmp_path: Path,
    mode: str,
    headers: dict[str, str],
    route: str,
) -> None:
    async with sdk(mode) as client:
        events = await _events(client, headers, max_output_tokens=2)
        last = events[-1]
        stored = await client.responses.retrieve(last.response.id)
    assert last.type == "response.incomplete"
    assert [e.type for e in events].count("response.completed") == 0
    assert last.response.status == "incomplete" == stored.status
    assert last.response.incomplete_details is not None
    assert last.response.incomplete_details.reason == "max_output_tokens"
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas and deltas == last.response.output_text == stored.output_text
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert fake_api.count == (1 if route == "api" else 0)
    [row] = rows(tmp_path / "ledger.db")
    assert (row["endpoint"], row["route"], row["status"]) == ("responses", route, 200)


async def test_the_apis_response_failed_is_relayed_under_our_id_stored_and_recorded(
    sdk: Any, fake_api: FakeAPI, tmp_path: Path
) -> None:
    fake_api.set(failed_response="the model is overloaded")
    async with sdk() as client:
        events = await _events(client, API)
        failed = events[-1]
        stored = await client.responses.retrieve(failed.response.id)
    assert failed.type == "response.failed"
    assert events[0].type == "response.created"
    assert {e.response.id for e in events if hasattr(e, "response")} == {failed.response.id}
    assert failed.response.id.startswith("resp_") and failed.response.status == "failed"
    assert failed.response.error is not None
    assert failed.response.error.message == "the model is overloaded"
    assert stored.status == "failed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    [row] = rows(tmp_path / "ledger.db")
    assert (row["endpoint"], row["route"], row["error"]) == ("responses", "api", "server_error")
