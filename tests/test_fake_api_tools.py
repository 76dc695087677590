"""The fake API answers tool turns as OpenAI does where agent clients depend on it (issue 42):
a call streamed as ``delta.tool_calls``, a new call id each time, and text once the result is
in, so that an agent loop run against it on the API route ends."""

from __future__ import annotations

import json
from typing import Any

import openai

from tests.fake_api import FakeAPI
from tests.tool_turns import weather_tool

CALL = {"name": "get_weather", "arguments": {"city": "Paris"}}
QUESTION = {"role": "user", "content": "Weather in Paris?"}


def streamed(client: openai.OpenAI, messages: list[dict[str, Any]]) -> dict[str, Any]:
    """One streamed answer put together as the openai client's users do."""
    content, calls, finish = "", {}, None
    stream = client.chat.completions.create(
        model="gpt-4o-mini",
        messages=messages,
        tools=[weather_tool()],
        stream=True,  # type: ignore[arg-type]
    )
    for chunk in stream:
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for piece in delta.tool_calls or ():
            call = calls.setdefault(piece.index, {"id": None, "name": "", "arguments": ""})
            call["id"] = piece.id or call["id"]
            if piece.function is not None:
                call["name"] += piece.function.name or ""
                call["arguments"] += piece.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    return {"content": content, "calls": list(calls.values()), "finish": finish}


def test_a_streamed_call_is_a_call_with_a_new_id_and_the_result_gets_text() -> None:
    with FakeAPI(reply="It is 18C and sunny.", tool_call=CALL) as api:
        client = openai.OpenAI(base_url=api.url, api_key="sk-fake", max_retries=0)
        first, second = streamed(client, [QUESTION]), streamed(client, [QUESTION])
        for answer in (first, second):
            assert answer["finish"] == "tool_calls" and answer["content"] == ""
            [call] = answer["calls"]
            assert call["name"] == "get_weather"
            assert json.loads(call["arguments"]) == {"city": "Paris"}
        assert first["calls"][0]["id"] != second["calls"][0]["id"]
        call = first["calls"][0]
        turns = [
            QUESTION,
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": call["id"],
                        "type": "function",
                        "function": {"name": call["name"], "arguments": call["arguments"]},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": call["id"], "content": "18C and sunny"},
        ]
        final = streamed(client, turns)
        assert (final["content"], final["calls"], final["finish"]) == (
            "It is 18C and sunny.",
            [],
            "stop",
        )
