"""Several tool calls in one local answer, end to end: on ``/v1/chat/completions`` (JSON and
stream) and on ``/v1/responses`` (with the official SDK, plain and streamed), with the real
SmolLM2 asked to call ``get_weather`` for two cities (greedy, so the answer is the same each
run: tests/engine/test_tool_calls.py pins it at the engine)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.conftest import settings_for
from tests.fake_api import FakeAPI
from tests.server.test_app import rows, sse_events
from tests.tool_turns import DESCRIPTION, weather_function, weather_tool

LOCAL = {"x-frugal-route": "local", "x-frugal-min-quality": "0"}
API = {"x-frugal-route": "api"}
TWO_CITIES = (
    "Get the weather in Paris and the weather in Rome: call get_weather twice, once for each city."
)
WEATHER = weather_tool(DESCRIPTION)
CHAT = {
    "model": "gpt-4o-mini",
    "messages": [{"role": "user", "content": TWO_CITIES}],
    "tools": [WEATHER],
    "tool_choice": "required",
    "max_tokens": 80,
}


def cities(arguments: list[str]) -> list[str]:
    return [json.loads(a)["city"] for a in arguments]


async def test_chat_answers_two_calls_in_one_turn_in_json_and_in_a_stream(
    tmp_path: Path, fake_api: FakeAPI, make_client: Any
) -> None:
    async with make_client(settings_for(tmp_path, fake_api)) as client:
        r = await client.post("/v1/chat/completions", json=CHAT, headers=LOCAL)
        s = await client.post("/v1/chat/completions", json={**CHAT, "stream": True}, headers=LOCAL)
        one = await client.post(
            "/v1/chat/completions", json={**CHAT, "parallel_tool_calls": False}, headers=LOCAL
        )
    assert r.status_code == 200, r.text
    assert r.headers["x-frugal-route"] == "local"
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    calls = choice["message"]["tool_calls"]
    assert [c["function"]["name"] for c in calls] == ["get_weather", "get_weather"]
    assert cities([c["function"]["arguments"] for c in calls]) == ["Paris", "Rome"]
    assert len({c["id"] for c in calls}) == 2 and all(c["id"].startswith("call_") for c in calls)

    # The stream replays the scored answer: each call's head (index, id, name), then its
    # arguments in pieces under the same index.
    assert s.headers["x-frugal-route"] == "local"
    events = sse_events(s.text)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    heads: dict[int, dict[str, Any]] = {}
    arguments: dict[int, str] = {}
    for chunk in chunks:
        for piece in chunk["choices"][0]["delta"].get("tool_calls") or ():
            if "id" in piece:
                heads[piece["index"]] = piece
            arguments[piece["index"]] = (
                arguments.get(piece["index"], "") + piece["function"]["arguments"]
            )
    assert sorted(heads) == [0, 1]
    assert heads[0]["id"] != heads[1]["id"]
    assert {h["function"]["name"] for h in heads.values()} == {"get_weather"}
    assert cities([arguments[0], arguments[1]]) == ["Paris", "Rome"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"

    # parallel_tool_calls false: the grammar allows one call.
    [call] = one.json()["choices"][0]["message"]["tool_calls"]
    assert cities([call["function"]["arguments"]]) == ["Paris"]

    assert fake_api.count == 0
    ledger = rows(tmp_path / "ledger.db")
    assert [row["route"] for row in ledger] == ["local"] * 3
    for row in ledger:
        assert not [r for r in (row["quality_reasons"] or "").split(",") if r.startswith("tool_")]
        assert row["completion_tokens"] > 0


FLAT: Any = weather_function()
# The SDK's arguments for a local answer that must call get_weather for the two cities.
ASK_TWO: Any = {
    "model": "gpt-4o-mini",
    "input": TWO_CITIES,
    "tools": [FLAT],
    "tool_choice": "required",
    "max_output_tokens": 80,
    "extra_headers": LOCAL,
}


async def test_responses_answers_one_function_call_item_per_call(
    translate_sdk: Any, fake_api: FakeAPI
) -> None:
    async with translate_sdk() as client:
        raw = await client.responses.with_raw_response.create(**ASK_TWO)
        response = raw.parse()
        calls = [item for item in response.output if item.type == "function_call"]
        # The calls' results go back as the next turn's input (here to the API): the two
        # function_call items are one assistant turn with both tool calls.
        await client.responses.create(
            model="gpt-4o-mini",
            input=[
                {"role": "user", "content": TWO_CITIES},
                *response.output,  # type: ignore[list-item]
                *(
                    {"type": "function_call_output", "call_id": c.call_id, "output": "sunny"}
                    for c in calls
                ),
            ],
            tools=[FLAT],
            extra_headers=API,
        )
    assert raw.headers["x-frugal-route"] == "local"
    assert response.status == "completed" and response.parallel_tool_calls is True
    assert len(response.output) == 2 and len(calls) == 2
    assert [c.name for c in calls] == ["get_weather", "get_weather"]
    assert cities([c.arguments for c in calls]) == ["Paris", "Rome"]
    assert len({c.call_id for c in calls}) == 2 and len({c.id for c in calls}) == 2
    messages = fake_api.requests[0][2]["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "tool"]
    assert [c["id"] for c in messages[1]["tool_calls"]] == [c.call_id for c in calls]
    assert [m["tool_call_id"] for m in messages[2:]] == [c.call_id for c in calls]


async def test_responses_streams_the_events_of_each_call_item(
    translate_sdk: Any, tmp_path: Path
) -> None:
    async with translate_sdk() as client:
        async with client.responses.stream(**ASK_TWO) as stream:
            events = [event async for event in stream]
            final = await stream.get_final_response()
    assert [e.sequence_number for e in events] == list(range(len(events)))
    added = [e for e in events if e.type == "response.output_item.added"]
    assert [(e.output_index, e.item.type) for e in added] == [
        (0, "function_call"),
        (1, "function_call"),
    ]
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert [e.output_index for e in done] == [0, 1]
    for index, event in enumerate(done):
        deltas = "".join(
            e.delta
            for e in events
            if e.type == "response.function_call_arguments.delta" and e.output_index == index
        )
        assert deltas == event.arguments == final.output[index].arguments  # type: ignore[union-attr]
    assert cities([e.arguments for e in done]) == ["Paris", "Rome"]
    assert events[-1].type == "response.completed"
    [row] = rows(tmp_path / "ledger.db")
    assert (row["endpoint"], row["route"], row["stream"]) == ("responses", "local", 1)
