"""``POST /v1/responses`` with the official ``openai`` SDK against the in-process app: on the
local route (the real SmolLM2, let through the gate) and on the API route (the fake API, which
is asked for a chat completion: ``[fallback] responses = "translate"``; the default, the API's
own ``/v1/responses``, is ``tests/server/test_responses_fallback.py``'s)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import openai
import pydantic
import pytest
from jsonschema import Draft202012Validator

from proxy.ledger.db.location import parse
from proxy.ledger.reports.build import Period, build
from proxy.ledger.tenants import keys
from proxy.protocol.responses_params import RESPONSES_PARAMETERS
from tests.conftest import settings_for
from tests.fake_api import FakeAPI
from tests.server.test_app import rows
from tests.tool_turns import DESCRIPTION, weather_function

LOCAL = {"x-frugal-route": "local", "x-frugal-min-quality": "0"}
API = {"x-frugal-route": "api"}
QUESTION = "What is the capital of France?"
WEATHER: Any = weather_function(DESCRIPTION, strict=True)


class Capital(pydantic.BaseModel):
    country: str
    capital: str


async def test_create_on_the_local_route_is_a_response_the_sdk_parses(
    translate_sdk: Any, tmp_path: Path, fake_api: FakeAPI
) -> None:
    async with translate_sdk() as client:
        raw = await client.responses.with_raw_response.create(
            model="gpt-4o-mini", input=QUESTION, max_output_tokens=24, extra_headers=LOCAL
        )
    response = raw.parse()
    assert raw.headers["x-frugal-route"] == "local"
    assert response.id.startswith("resp_") and response.object == "response"
    assert response.status in ("completed", "incomplete")
    [item] = response.output
    assert item.type == "message" and item.role == "assistant"
    assert response.output_text == item.content[0].text and response.output_text
    usage = response.usage
    assert usage is not None and usage.input_tokens > 0 and usage.output_tokens > 0
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert usage.input_tokens_details.cached_tokens >= 0
    assert usage.output_tokens_details.reasoning_tokens == 0
    assert fake_api.count == 0
    [row] = rows(tmp_path / "ledger.db")
    assert (row["endpoint"], row["route"], row["status"]) == ("responses", "local", 200)
    assert row["completion_tokens"] == usage.output_tokens


async def test_create_on_the_api_route_sends_the_translated_chat_request(
    translate_sdk: Any, tmp_path: Path, fake_api: FakeAPI
) -> None:
    async with translate_sdk() as client:
        response = await client.responses.create(
            model="gpt-4o-mini",
            instructions="Answer briefly.",
            input=[{"role": "user", "content": [{"type": "input_text", "text": QUESTION}]}],
            temperature=0.5,
            metadata={"team": "a"},
            store=True,
            extra_headers=API,
        )
    assert response.output_text == fake_api.reply
    assert response.status == "completed" and response.incomplete_details is None
    assert response.metadata == {"team": "a"} and response.store is True
    [(path, _headers, sent)] = fake_api.requests
    assert path == "/v1/chat/completions"
    assert sent["messages"] == [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": [{"type": "text", "text": QUESTION}]},
    ]
    assert sent["temperature"] == 0.5
    assert "store" not in sent and "metadata" not in sent
    [row] = rows(tmp_path / "ledger.db")
    assert (row["endpoint"], row["route"], row["reason"]) == ("responses", "api", "forced")
    assert row["prompt_tokens"] == response.usage.input_tokens  # type: ignore[union-attr]
    assert row["api_cost_pusd"] > 0
    # The report counts it as any other request, under its model.
    report = build(str(tmp_path / "ledger.db"), Period.month(None), 0, by="model")
    [group] = report["groups"]
    assert (group["model"], group["requests"], group["local_requests"]) == ("gpt-4o-mini", 1, 0)


async def test_an_answer_cut_by_max_output_tokens_is_incomplete(
    translate_sdk: Any, fake_api: FakeAPI
) -> None:
    async with translate_sdk() as client:
        response = await client.responses.create(
            model="gpt-4o-mini", input=QUESTION, max_output_tokens=2, extra_headers=API
        )
    assert fake_api.requests[0][2]["max_completion_tokens"] == 2
    assert response.status == "incomplete"
    assert response.incomplete_details is not None
    assert response.incomplete_details.reason == "max_output_tokens"
    assert response.output_text == " ".join(fake_api.reply.split()[:2]) or response.output_text


# The typed events that open a text answer's stream, and those that close it before its last.
OPENING_EVENTS = [
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.content_part.added",
]
CLOSING_EVENTS = [
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
]


def assert_a_text_stream(events: list[Any]) -> None:
    """The SDK's typed events of one text answer: opened and closed in order, the last one the
    response completed (or incomplete, when max_output_tokens cut it), numbered from 0 on."""
    kinds = [e.type for e in events]
    final = events[-1].response
    last = "response.completed" if final.status == "completed" else "response.incomplete"
    assert kinds[:4] == OPENING_EVENTS
    assert kinds[-4:] == [*CLOSING_EVENTS, last]
    assert [e.sequence_number for e in events] == list(range(len(events)))


@pytest.mark.parametrize("headers", [LOCAL, API], ids=["local", "api"])
async def test_stream_sends_the_typed_events_in_order_and_the_deltas_make_the_text(
    translate_sdk: Any, tmp_path: Path, headers: dict[str, str]
) -> None:
    async with translate_sdk() as client:
        async with client.responses.stream(
            model="gpt-4o-mini", input=QUESTION, max_output_tokens=24, extra_headers=headers
        ) as stream:
            events = [event async for event in stream]
            # The SDK's final response is the completed one's; an answer cut by
            # max_output_tokens ends with response.incomplete, which carries it.
            final = events[-1].response
            if final.status == "completed":
                assert (await stream.get_final_response()).output_text == final.output_text
    assert_a_text_stream(events)
    assert events[4].type == "response.output_text.delta"  # the text starts at once
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == final.output_text and deltas
    [row] = rows(tmp_path / "ledger.db")
    assert (row["endpoint"], row["route"], row["stream"]) == (
        "responses",
        headers["x-frugal-route"],
        1,
    )


async def test_create_with_stream_true_yields_the_sdks_event_types(
    translate_sdk: Any, fake_api: FakeAPI
) -> None:
    async with translate_sdk() as client:
        stream = await client.responses.create(
            model="gpt-4o-mini", input=QUESTION, stream=True, extra_headers=API
        )
        events = [event async for event in stream]
    assert isinstance(events[0], openai.types.responses.ResponseCreatedEvent)
    last = events[-1]
    assert isinstance(last, openai.types.responses.ResponseCompletedEvent)
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert len(deltas) == len(fake_api.reply.split())  # one a word
    assert "".join(deltas) == last.response.output_text == fake_api.reply
    assert fake_api.requests[0][2].get("stream") is not True  # the API is asked for JSON


async def test_json_schema_format_constrains_the_local_answer(translate_sdk: Any) -> None:
    async with translate_sdk() as client:
        parsed = await client.responses.parse(
            model="gpt-4o-mini",
            input="Which country has Paris as its capital? Answer in JSON.",
            text_format=Capital,
            max_output_tokens=64,
            extra_headers=LOCAL,
        )
    assert isinstance(parsed.output_parsed, Capital)
    assert Capital.model_validate_json(parsed.output_text) == parsed.output_parsed


async def test_json_schema_format_reaches_the_api_as_response_format(
    translate_sdk: Any, fake_api: FakeAPI
) -> None:
    fake_api.set(reply='{"country": "France", "capital": "Paris"}')
    async with translate_sdk() as client:
        parsed = await client.responses.parse(
            model="gpt-4o-mini", input=QUESTION, text_format=Capital, extra_headers=API
        )
    assert parsed.output_parsed == Capital(country="France", capital="Paris")
    response_format = fake_api.requests[0][2]["response_format"]
    assert response_format["type"] == "json_schema"
    assert response_format["json_schema"]["name"] == "Capital"
    assert response_format["json_schema"]["strict"] is True


async def test_a_local_function_call_and_its_output_sent_back_in_input(
    translate_sdk: Any, fake_api: FakeAPI
) -> None:
    question = {"role": "user", "content": "What is the weather in Paris?"}
    async with translate_sdk() as client:
        first = await client.responses.create(
            model="gpt-4o-mini",
            input=[question],
            tools=[WEATHER],
            tool_choice={"type": "function", "name": "get_weather"},
            extra_headers=LOCAL,
        )
        [call] = [item for item in first.output if item.type == "function_call"]
        assert call.name == "get_weather"
        assert isinstance(json.loads(call.arguments)["city"], str)
        assert call.call_id
        second = await client.responses.create(
            model="gpt-4o-mini",
            input=[
                question,
                *first.output,  # type: ignore[list-item]
                {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"},
            ],
            tools=[WEATHER],
            extra_headers=API,
        )
    assert second.output_text == fake_api.reply
    messages = fake_api.requests[0][2]["messages"]
    assert messages[0] == question
    assert messages[1]["role"] == "assistant"
    assert messages[1]["tool_calls"] == [
        {
            "id": call.call_id,
            "type": "function",
            "function": {"name": "get_weather", "arguments": call.arguments},
        }
    ]
    assert messages[2] == {"role": "tool", "tool_call_id": call.call_id, "content": "sunny"}
    assert fake_api.requests[0][2]["tools"][0]["function"]["name"] == "get_weather"


async def test_a_function_call_streams_its_arguments(translate_sdk: Any) -> None:
    async with translate_sdk() as client:
        async with client.responses.stream(
            model="gpt-4o-mini",
            input="What is the weather in Paris?",
            tools=[WEATHER],
            tool_choice="required",
            extra_headers=LOCAL,
        ) as stream:
            events = [event async for event in stream]
            final = await stream.get_final_response()
    [call] = final.output
    assert call.type == "function_call"
    deltas = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    [done] = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert deltas == done.arguments == call.arguments


async def test_unknown_field_is_a_400_naming_it(translate_sdk: Any, tmp_path: Path) -> None:
    async with translate_sdk() as client:
        with pytest.raises(openai.BadRequestError) as caught:
            await client.responses.create(
                model="gpt-4o-mini", input="hi", extra_body={"top_k": 3}, extra_headers=API
            )
    assert caught.value.body["param"] == "top_k"  # type: ignore[index]
    assert caught.value.body["code"] == "unknown_parameter"  # type: ignore[index]
    [row] = rows(tmp_path / "ledger.db")
    assert (row["endpoint"], row["status"], row["reason"]) == ("responses", 400, "bad_request")


async def _refused(translate_sdk: Any, fake_api: FakeAPI, extra: dict[str, Any], param: str) -> Any:
    """The 400's error body for a Responses request of ``extra`` fields, which names ``param``;
    nothing of it reached the API."""
    body = {"model": "gpt-4o-mini", "input": "hi", **extra}
    async with translate_sdk() as client:
        with pytest.raises(openai.BadRequestError) as caught:
            await client.post("/responses", body=body, cast_to=dict)
    error = caught.value.body
    assert error["param"] == param
    assert fake_api.count == 0
    return error


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"conversation": "conv_123"}, "conversation"),
        ({"reasoning": {"effort": "low"}}, "reasoning"),
        ({"background_options": {}}, "background_options"),  # background itself is served
        ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
        (
            {
                "input": [
                    {
                        "role": "user",
                        "content": [{"type": "input_image", "image_url": "https://x/y.png"}],
                    }
                ]
            },
            "input[0].content[0].type",
        ),
    ],
)
async def test_what_cannot_be_translated_is_a_400_that_says_so(
    translate_sdk: Any, fake_api: FakeAPI, extra: dict[str, Any], param: str
) -> None:
    error = await _refused(translate_sdk, fake_api, extra, param)
    assert error["code"] == "unsupported_parameter"
    assert "not supported yet" in error["message"]


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"max_output_tokens": 0}, "max_output_tokens"),
        (
            {"tools": [{"type": "function", "name": "f", "parameters": {"type": "nope"}}]},
            "tools[0].parameters",
        ),
        (
            {"text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": 1}}}},
            "text.format.schema",
        ),
    ],
)
async def test_a_bad_value_is_a_400_naming_the_responses_field(
    translate_sdk: Any, fake_api: FakeAPI, extra: dict[str, Any], param: str
) -> None:
    error = await _refused(translate_sdk, fake_api, extra, param)
    assert param in error["message"]


@pytest.mark.parametrize("headers", [LOCAL, API], ids=["local", "api"])
async def test_the_answer_fits_the_openapi_documents_response_schema(
    tmp_path: Path, fake_api: FakeAPI, make_client: Any, headers: dict[str, str]
) -> None:
    async with make_client(settings_for(tmp_path, fake_api)) as client:
        spec = (await client.get("/openapi.json")).json()
        r = await client.post(
            "/v1/responses",
            json={"model": "gpt-4o-mini", "input": QUESTION, "max_output_tokens": 8},
            headers=headers,
        )
    assert r.status_code == 200, r.text
    assert r.headers["x-frugal-route"] == headers["x-frugal-route"]
    operation = spec["paths"]["/v1/responses"]["post"]
    assert operation["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/ResponsesRequest"
    }
    schemas = spec["components"]["schemas"]
    assert list(schemas["ResponsesRequest"]["properties"]) == list(RESPONSES_PARAMETERS)
    Draft202012Validator(schemas["Response"]).validate(r.json())


async def test_a_spent_budget_refuses_the_api_call_before_it_is_made(
    tmp_path: Path, fake_api: FakeAPI, make_client: Any
) -> None:
    """The key's budget is reserved for the whole body the API is sent, as on chat."""
    db = parse(str(tmp_path / "ledger.db"))
    key = keys.create(db, "tiny", monthly_budget_pusd=1)  # a millionth of a micro-dollar
    headers = {"authorization": f"Bearer {key}", **API}
    async with make_client(settings_for(tmp_path, fake_api)) as client:
        r = await client.post(
            "/v1/responses", json={"model": "gpt-4o-mini", "input": QUESTION}, headers=headers
        )
    assert r.status_code == 429, r.text
    assert r.json()["error"]["code"] == "insufficient_quota"
    assert fake_api.count == 0
    [row] = rows(tmp_path / "ledger.db")
    assert (row["endpoint"], row["reason"], row["key_name"]) == (
        "responses",
        "budget_exhausted",
        "tiny",
    )
