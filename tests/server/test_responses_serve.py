"""Stored Responses on a real ``frugal serve`` process, driven by the official ``openai`` client:
create then retrieve, input_items and delete; ``responses.stream`` (the final text is the joined
deltas) on both routes and ``responses.parse`` into a pydantic model; a function-tool round trip
with ``previous_response_id``; ``store: false``; a chain local -> API in which the fake API is sent
the earlier turns; another key's 404; and no stored content in the server's log."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import openai
import pydantic
import pytest

from tests.conftest import module_api
from tests.fake_api import FakeAPI
from tests.server.test_serve import Served, start_server, stop_server
from tests.tool_turns import DESCRIPTION, weather_function

pytestmark = pytest.mark.serve

ADMIN, BOB, CAROL = "sk-serve-admin-0001", "sk-serve-bob-00002", "sk-serve-carol-0003"
LOCAL = {"x-frugal-route": "local", "x-frugal-min-quality": "0"}
API = {"x-frugal-route": "api"}
SECRET = "Zanzibar-marmalade-4471"  # a word of content that must never reach the log
WEATHER: dict[str, object] = weather_function(DESCRIPTION, strict=True)


api = module_api(reply="Rome is the capital of Italy.")


@pytest.fixture(scope="module")
def served(api: FakeAPI, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    server = start_server(
        tmp_path_factory.mktemp("responses-serve"),
        api,
        server_toml='api_keys_env = "FRUGAL_TEST_RESPONSES_KEYS"',
        env={"FRUGAL_TEST_RESPONSES_KEYS": f"admin;admin:{ADMIN},bob:{BOB},carol:{CAROL}"},
        client_key=ADMIN,
        router_toml="predictive = false",
    )
    yield server
    stop_server(server)


@pytest.fixture(scope="module")
def clients(served: Served) -> Iterator[dict[str, openai.OpenAI]]:
    made = {
        name: openai.OpenAI(base_url=served.base + "/v1", api_key=key, max_retries=0)
        for name, key in (("admin", ADMIN), ("bob", BOB), ("carol", CAROL))
    }
    yield made
    for client in made.values():
        client.close()


def test_create_then_retrieve_input_items_and_delete(clients: dict[str, openai.OpenAI]) -> None:
    bob = clients["bob"]
    made = bob.responses.create(
        model="gpt-4o-mini",
        input=f"Repeat the word {SECRET}.",
        max_output_tokens=16,
        extra_headers=LOCAL,
    )
    assert made.store is True
    again = bob.responses.retrieve(made.id)
    assert again.id == made.id and again.output_text == made.output_text
    [item] = bob.responses.input_items.list(made.id).data
    assert item.type == "message" and item.role == "user"  # type: ignore[union-attr]
    assert item.content[0].text == f"Repeat the word {SECRET}."  # type: ignore[union-attr]
    deleted = bob.responses.delete(made.id)
    assert deleted is None  # the SDK reads the deleted object and returns None
    with pytest.raises(openai.NotFoundError):
        bob.responses.retrieve(made.id)


def test_store_false_cannot_be_retrieved(clients: dict[str, openai.OpenAI]) -> None:
    bob = clients["bob"]
    made = bob.responses.create(model="gpt-4o-mini", input="Hi", store=False, extra_headers=API)
    assert made.store is False
    with pytest.raises(openai.NotFoundError):
        bob.responses.retrieve(made.id)


def test_a_function_tool_round_trip_with_previous_response_id(
    clients: dict[str, openai.OpenAI], api: FakeAPI
) -> None:
    bob = clients["bob"]
    first = bob.responses.create(
        model="gpt-4o-mini",
        input="What is the weather in Paris?",
        tools=[WEATHER],  # type: ignore[list-item]
        tool_choice={"type": "function", "name": "get_weather"},
        extra_headers=LOCAL,
    )
    [call] = [item for item in first.output if item.type == "function_call"]
    assert isinstance(json.loads(call.arguments)["city"], str)
    sent_before = api.count
    second = bob.responses.create(
        model="gpt-4o-mini",
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 21C"}],
        tools=[WEATHER],  # type: ignore[list-item]
        extra_headers=API,
    )
    assert second.output_text == api.reply and second.previous_response_id == first.id
    [(path, _headers, sent)] = api.requests[sent_before:]
    assert path == "/v1/responses" and sent["store"] is False
    assert [item["type"] for item in sent["input"]] == [
        "message",
        "function_call",
        "function_call_output",
    ]
    assert sent["input"][1]["call_id"] == call.call_id
    assert sent["input"][2] == {
        "type": "function_call_output",
        "call_id": call.call_id,
        "output": "sunny, 21C",
    }


def test_a_chain_local_then_api_sends_the_earlier_turns(
    clients: dict[str, openai.OpenAI], api: FakeAPI
) -> None:
    bob = clients["bob"]
    raw = bob.responses.with_raw_response.create(
        model="gpt-4o-mini",
        input="What is the capital of France?",
        max_output_tokens=16,
        extra_headers=LOCAL,
    )
    assert raw.headers["x-frugal-route"] == "local"
    local = raw.parse()
    sent_before = api.count
    second = bob.responses.create(
        model="gpt-4o-mini",
        input="And of Italy?",
        previous_response_id=local.id,
        extra_headers=API,
    )
    assert second.output_text == api.reply
    [(path, _headers, sent)] = api.requests[sent_before:]
    assert path == "/v1/responses" and sent["store"] is False
    assert "previous_response_id" not in sent
    assert [(item["role"], item["content"][0]["text"]) for item in sent["input"]] == [
        ("user", "What is the capital of France?"),
        ("assistant", local.output_text),
        ("user", "And of Italy?"),
    ]
    assert local.id not in json.dumps(sent)


def test_another_keys_response_is_a_404_and_an_admin_reads_it(
    clients: dict[str, openai.OpenAI],
) -> None:
    made = clients["bob"].responses.create(model="gpt-4o-mini", input="Hi", extra_headers=API)
    carol = clients["carol"]
    with pytest.raises(openai.NotFoundError):
        carol.responses.retrieve(made.id)
    with pytest.raises(openai.NotFoundError):
        carol.responses.input_items.list(made.id)
    with pytest.raises(openai.NotFoundError):
        carol.responses.delete(made.id)
    with pytest.raises(openai.NotFoundError) as caught:
        carol.responses.create(
            model="gpt-4o-mini", input="Hi", previous_response_id=made.id, extra_headers=API
        )
    assert caught.value.body["param"] == "previous_response_id"  # type: ignore[index]
    assert clients["admin"].responses.retrieve(made.id).id == made.id


class Capital(pydantic.BaseModel):
    country: str
    capital: str


@pytest.mark.parametrize("headers", [LOCAL, API], ids=["local", "api"])
def test_stream_final_text_is_the_joined_deltas(
    clients: dict[str, openai.OpenAI], headers: dict[str, str]
) -> None:
    bob = clients["bob"]
    with bob.responses.stream(
        model="gpt-4o-mini",
        input="What is the capital of Italy?",
        max_output_tokens=16,
        extra_headers=headers,
    ) as stream:
        events = list(stream)
        final = events[-1].response  # type: ignore[union-attr]
    assert events[0].type == "response.created"
    assert events[-1].type in ("response.completed", "response.incomplete")
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas and deltas == final.output_text
    assert bob.responses.retrieve(final.id).output_text == deltas


def test_parse_fills_a_pydantic_model_from_a_local_answer(
    clients: dict[str, openai.OpenAI],
) -> None:
    parsed = clients["bob"].responses.parse(
        model="gpt-4o-mini",
        input="France: which country, and what is its capital?",
        text_format=Capital,
        max_output_tokens=48,
        extra_headers=LOCAL,
    )
    assert isinstance(parsed.output_parsed, Capital)
    assert parsed.output_parsed.country and parsed.output_parsed.capital


def test_stored_content_never_reaches_the_log(served: Served) -> None:
    """Last: the server is stopped, then its whole log is searched."""
    stop_server(served)
    log = Path(served.log).read_text()
    assert log and SECRET not in log
