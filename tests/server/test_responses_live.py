"""``/v1/responses`` with ``[router] stream_mode = "live"``: local tokens sent as typed events as
they come, as a ``live`` chat stream sends them (the real SmolLM2, the official ``openai`` SDK on
the in-process app)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import openai

from tests.conftest import settings_for
from tests.fake_api import FakeAPI
from tests.server.test_app import rows
from tests.server.test_responses import assert_a_text_stream
from tests.tool_turns import DESCRIPTION, weather_function

ACCEPT = {"x-frugal-min-quality": "0"}  # any scored answer is accepted
QUESTION = "What is the capital of France?"


def _sdk(http: Any) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        api_key="sk-unused", base_url="http://localhost/v1", http_client=http, max_retries=0
    )


async def test_a_live_stream_sends_the_local_tokens_as_typed_events_and_stores_the_answer(
    tmp_path: Path, fake_api: FakeAPI, make_client: Any
) -> None:
    settings = settings_for(tmp_path, fake_api, router={"stream_mode": "live"})
    async with make_client(settings) as http:
        client = _sdk(http)
        async with client.responses.with_streaming_response.create(
            model="gpt-4o-mini",
            input=QUESTION,
            max_output_tokens=16,
            stream=True,
            metadata={"run": "live"},
        ) as raw:
            headers = raw.headers
            events = [event async for event in await raw.parse()]
        final = events[-1].response
        stored = await client.responses.retrieve(final.id)
    assert (headers["x-frugal-route"], headers["x-frugal-reason"]) == ("local", "live")
    assert_a_text_stream(events)
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert len(deltas) >= 2 and all(deltas)  # token by token, not one replayed answer
    assert "".join(deltas) == final.output_text == events[-4].text
    assert events[0].response.id == final.id and events[0].response.status == "in_progress"
    assert events[2].item.id == final.output[0].id
    assert final.usage is not None and final.usage.output_tokens > 0
    assert final.usage.input_tokens_details.cached_tokens >= 0
    assert final.metadata == {"run": "live"} and final.store is True
    assert stored.output_text == final.output_text and stored.status == final.status
    assert fake_api.count == 0
    [row] = rows(tmp_path / "ledger.db")
    assert (row["endpoint"], row["route"], row["reason"], row["stream"]) == (
        "responses",
        "local",
        "live",
        1,
    )


async def test_a_tool_request_in_live_mode_is_judged_whole_as_on_chat(
    tmp_path: Path, fake_api: FakeAPI, make_client: Any
) -> None:
    """Tools are not streamed live (nor on chat): the answer is made whole, then replayed."""
    settings = settings_for(tmp_path, fake_api, router={"stream_mode": "live"})
    weather: Any = weather_function(DESCRIPTION, strict=True)
    async with make_client(settings) as http:
        client = _sdk(http)
        async with client.responses.with_streaming_response.create(
            model="gpt-4o-mini",
            input="What is the weather in Paris? Use the tool.",
            tools=[weather],
            tool_choice="required",
            stream=True,
            extra_headers=ACCEPT,
        ) as raw:
            headers = raw.headers
            events = [event async for event in await raw.parse()]
    assert (headers["x-frugal-route"], headers["x-frugal-reason"]) == ("local", "accepted")
    final = events[-1].response
    assert events[-1].type == "response.completed"
    assert [item.type for item in final.output] == ["function_call"] * len(final.output)
    assert "response.function_call_arguments.done" in [e.type for e in events]
