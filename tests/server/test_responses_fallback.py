"""``[fallback] responses``: the API route of ``/v1/responses`` goes to the upstream's own
``/v1/responses`` by default (the fake API answers it as OpenAI does), or, with
``"translate"``, to its Chat Completions. With the official ``openai`` SDK against the
in-process app."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.conftest import settings_for
from tests.fake_api import FakeAPI
from tests.server.test_app import rows
from tests.server.test_responses import OPENING_EVENTS
from tests.server.test_responses_chain import local_then_api
from tests.tool_turns import weather_function

LOCAL = {"x-frugal-route": "local", "x-frugal-min-quality": "0"}
API = {"x-frugal-route": "api"}
QUESTION = "What is the capital of France?"
WEATHER: Any = weather_function()


@pytest.fixture
def sdk(tmp_path: Path, fake_api: FakeAPI, make_client: Any) -> Callable[..., Any]:
    """``async with sdk(mode) as (client, http)``: an ``AsyncOpenAI`` and an httpx client on
    the in-process app (``http.app``) whose ``[fallback] responses`` is ``mode`` (None: the
    default)."""

    @asynccontextmanager
    async def factory(mode: str | None = None, **more: Any) -> AsyncIterator[Any]:
        fallback = ({} if mode is None else {"responses": mode}) | more
        async with make_client(settings_for(tmp_path, fake_api, fallback=fallback)) as http:
            yield (
                openai.AsyncOpenAI(
                    api_key="sk-unused",
                    base_url="http://localhost/v1",
                    http_client=http,
                    max_retries=0,
                ),
                http,
            )

    return factory


def _stored(http: Any, response_id: str) -> Any:
    return http.app.state.services.responses.store.get(response_id)


@pytest.mark.parametrize("mode", [None, "responses", "translate"])
async def test_the_api_route_goes_where_the_setting_says(
    sdk: Any, fake_api: FakeAPI, tmp_path: Path, mode: str | None
) -> None:
    async with sdk(mode) as (client, _app):
        response = await client.responses.create(
            model="gpt-4o-mini", input=QUESTION, metadata={"team": "a"}, extra_headers=API
        )
    assert response.output_text == fake_api.reply and response.id.startswith("resp_")
    assert response.metadata == {"team": "a"} and response.store is True
    [(path, _headers, sent)] = fake_api.requests
    assert path == ("/v1/chat/completions" if mode == "translate" else "/v1/responses")
    [row] = rows(tmp_path / "ledger.db")
    assert (row["endpoint"], row["route"], row["status"]) == ("responses", "api", 200)
    assert row["prompt_tokens"] == response.usage.input_tokens  # type: ignore[union-attr]
    assert row["completion_tokens"] == response.usage.output_tokens  # type: ignore[union-attr]
    assert row["api_cost_pusd"] > 0


async def test_the_api_answer_is_stored_under_our_id_and_in_the_ledger(
    sdk: Any, fake_api: FakeAPI, tmp_path: Path
) -> None:
    async with sdk() as (client, app):
        response = await client.responses.create(
            model="gpt-4o-mini", input=QUESTION, extra_headers=API
        )
        stored = _stored(app, response.id)
        again = await client.responses.retrieve(response.id)
    assert stored is not None and stored.route == "api"
    assert stored.response["output"][0]["content"][0]["text"] == fake_api.reply
    assert again.id == response.id and again.output_text == fake_api.reply
    assert not response.id.startswith("resp-fake")  # the upstream's id stays upstream
    [row] = rows(tmp_path / "ledger.db")
    assert (row["endpoint"], row["reason"]) == ("responses", "forced")


async def test_a_chain_local_then_api_sends_store_false_and_the_whole_conversation(
    sdk: Any, fake_api: FakeAPI
) -> None:
    async with sdk() as (client, _app):
        first, local, second = await local_then_api(client, LOCAL, 16)
        assert first.headers["x-frugal-route"] == "local"
        third = await client.responses.create(
            model="gpt-4o-mini", input="Thanks.", previous_response_id=second.id, extra_headers=API
        )
    assert third.previous_response_id == second.id and third.output_text == fake_api.reply
    paths = [path for path, _headers, _body in fake_api.requests]
    assert paths == ["/v1/responses", "/v1/responses"]
    sent = [body for _path, _headers, body in fake_api.requests]
    texts = [
        [part["text"] for part in item["content"]] for item in sent[1]["input"]
    ]  # every turn, in order: user, local answer, user, API answer, user
    assert texts == [
        [QUESTION],
        [local.output_text],
        ["And of Italy?"],
        [fake_api.reply],
        ["Thanks."],
    ]
    assert [item["role"] for item in sent[1]["input"]] == [
        "user",
        "assistant",
        "user",
        "assistant",
        "user",
    ]
    for body in sent:  # store: false, and our ids never leave the proxy
        assert body["store"] is False
        assert "previous_response_id" not in body
        assert "resp_" not in json.dumps(body)
        assert all("id" not in item for item in body["input"])


@pytest.mark.parametrize(
    ("extra", "taken"),
    [
        ({"tools": [{"type": "web_search"}]}, "web_search_call"),
        ({"reasoning": {"effort": "low"}}, "reasoning"),
        (
            {
                "input": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "input_text", "text": "What is in it?"},
                            {"type": "input_image", "image_url": "https://x.test/y.png"},
                        ],
                    }
                ]
            },
            None,
        ),
    ],
    ids=["web_search", "reasoning", "image"],
)
async def test_what_only_the_api_can_do_goes_to_its_responses_as_unsupported(
    sdk: Any, fake_api: FakeAPI, tmp_path: Path, extra: dict[str, Any], taken: str | None
) -> None:
    """Without any route header: the local model is not even asked."""
    body = {"model": "gpt-4o-mini", "input": QUESTION, **extra}
    async with sdk() as (_client, http):
        raw = await http.post("/v1/responses", json=body)
    assert raw.status_code == 200, raw.text
    answer = raw.json()
    assert raw.headers["x-frugal-route"] == "api"
    [(path, _headers, sent)] = fake_api.requests
    assert path == "/v1/responses"
    for name, value in extra.items():  # as it was asked (input items in their full form)
        if name == "input":
            assert [item["content"] for item in sent["input"]] == [value[0]["content"]]
        else:
            assert sent[name] == value
    types = [item["type"] for item in answer["output"]]
    if taken is not None:
        assert taken in types
    assert types[-1] == "message"
    [row] = rows(tmp_path / "ledger.db")
    assert (row["endpoint"], row["route"], row["reason"]) == ("responses", "api", "unsupported")


async def test_what_only_the_api_can_do_is_a_400_with_translate(
    sdk: Any, fake_api: FakeAPI
) -> None:
    body = {"model": "gpt-4o-mini", "input": QUESTION, "tools": [{"type": "web_search"}]}
    async with sdk("translate") as (client, _app):
        with pytest.raises(openai.BadRequestError) as caught:
            await client.post("/responses", body=body, cast_to=dict)
    error = caught.value.body
    assert error["param"] == "tools[0].type"  # type: ignore[index]
    assert "web_search" in error["message"]  # type: ignore[index]
    assert fake_api.count == 0


async def test_with_model_local_what_only_the_api_can_do_is_a_400(
    sdk: Any, fake_api: FakeAPI
) -> None:
    body = {"model": "gpt-4o-mini", "input": QUESTION, "reasoning": {"effort": "low"}}
    async with sdk() as (client, _app):
        with pytest.raises(openai.BadRequestError) as caught:
            await client.post("/responses", body=body, cast_to=dict, options={"headers": LOCAL})
    error = caught.value.body
    assert error["code"] == "unsupported_locally"  # type: ignore[index]
    assert "reasoning" in error["message"]  # type: ignore[index]
    assert fake_api.count == 0


async def test_a_streamed_api_answer_is_relayed_in_order_with_our_id(
    sdk: Any, fake_api: FakeAPI, tmp_path: Path
) -> None:
    async with sdk() as (client, app):
        async with client.responses.stream(
            model="gpt-4o-mini", input=QUESTION, extra_headers=API
        ) as stream:
            seen = [event async for event in stream]
            final = await stream.get_final_response()
        stored = _stored(app, final.id)
    [(path, _headers, sent)] = fake_api.requests
    assert path == "/v1/responses" and sent["stream"] is True and sent["store"] is False
    assert [e.sequence_number for e in seen] == list(range(len(seen)))
    assert seen[0].type == "response.created" and seen[-1].type == "response.completed"
    deltas = "".join(e.delta for e in seen if e.type == "response.output_text.delta")
    assert deltas == final.output_text == fake_api.reply
    ids = {e.response.id for e in seen if hasattr(e, "response")}
    assert ids == {final.id} and final.id.startswith("resp_")
    assert final.store is True
    assert stored is not None and stored.route == "api"
    [row] = rows(tmp_path / "ledger.db")
    assert (row["endpoint"], row["route"], row["status"]) == ("responses", "api", 200)
    assert row["completion_tokens"] == final.usage.output_tokens  # type: ignore[union-attr]


async def test_a_function_tool_round_trip_on_the_apis_responses(
    sdk: Any, fake_api: FakeAPI
) -> None:
    fake_api.set(tool_call={"name": "get_weather", "arguments": {"city": "Paris"}})
    async with sdk() as (client, _app):
        first = await client.responses.create(
            model="gpt-4o-mini", input="Weather in Paris?", tools=[WEATHER], extra_headers=API
        )
        [call] = first.output
        assert call.type == "function_call" and json.loads(call.arguments) == {"city": "Paris"}
        second = await client.responses.create(
            model="gpt-4o-mini",
            previous_response_id=first.id,
            input=[{"type": "function_call_output", "call_id": call.call_id, "output": "Sunny"}],
            tools=[WEATHER],
            extra_headers=API,
        )
    assert second.output_text == fake_api.reply
    sent = fake_api.requests[1][2]
    assert [item.get("type", "message") for item in sent["input"]] == [
        "message",
        "function_call",
        "function_call_output",
    ]
    assert sent["input"][1]["call_id"] == call.call_id


async def test_a_model_routed_through_litellm_is_translated(
    sdk: Any, fake_api: FakeAPI, monkeypatch: pytest.MonkeyPatch
) -> None:
    """litellm's providers have no /v1/responses: the API route asks for a chat completion
    (litellm's hosted_vllm provider, pointed at the fake API), and a built-in tool is a 400."""
    monkeypatch.setenv("HOSTED_VLLM_API_BASE", fake_api.url)
    models = {"gpt-4o-mini": "hosted_vllm/served-model"}
    async with sdk(models=models) as (client, _http):
        response = await client.responses.create(
            model="gpt-4o-mini", input=QUESTION, extra_headers=API
        )
        with pytest.raises(openai.BadRequestError) as caught:
            await client.responses.create(
                model="gpt-4o-mini",
                input=QUESTION,
                tools=[{"type": "web_search"}],
                extra_headers=API,
            )
    assert response.output_text == fake_api.reply
    assert [(path, body["model"]) for path, _h, body in fake_api.requests] == [
        ("/v1/chat/completions", "served-model")
    ]
    assert caught.value.body["param"] == "tools[0].type"  # type: ignore[index]


async def test_an_upstream_429_is_passed_on_and_recorded(
    sdk: Any, fake_api: FakeAPI, tmp_path: Path
) -> None:
    fake_api.set(fail_status=429, retry_after=0)
    async with sdk() as (client, _http):
        with pytest.raises(openai.RateLimitError) as caught:
            await client.responses.create(model="gpt-4o-mini", input=QUESTION, extra_headers=API)
    assert caught.value.status_code == 429
    assert [path for path, _h, _b in fake_api.requests] == ["/v1/responses"] * 2  # one retry
    [row] = rows(tmp_path / "ledger.db")
    assert (row["endpoint"], row["route"], row["status"]) == ("responses", "api", 429)


async def test_a_stream_cut_by_the_upstream_ends_with_an_error_event(
    sdk: Any, fake_api: FakeAPI, tmp_path: Path
) -> None:
    fake_api.set(cut_stream_after=4)
    async with sdk() as (_client, http):
        body = {"model": "gpt-4o-mini", "input": QUESTION, "stream": True}
        r = await http.post("/v1/responses", json=body, headers=API)
    assert r.status_code == 200
    payloads = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: ")]
    assert [p["sequence_number"] for p in payloads] == list(range(len(payloads)))
    # what came before the cut (all of it, or none when the cut came in the same read)
    relayed = [p["type"] for p in payloads[:-1]]
    assert relayed == OPENING_EVENTS[: len(relayed)]
    assert payloads[-1]["type"] == "error" and payloads[-1]["code"] == "upstream_failed"
    [row] = rows(tmp_path / "ledger.db")
    assert (row["endpoint"], row["route"], row["error"]) == ("responses", "api", "upstream_failed")


@pytest.mark.parametrize("mode", [None, "translate"])
@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"tool_choice": {"type": {}, "name": ""}}, "tool_choice.type"),
        ({"tools": [{"type": ["web_search"]}]}, "tools[0].type"),
        ({"input": [{"type": {}, "role": "user", "content": "hi"}]}, "input[0].type"),
    ],
)
async def test_a_type_that_is_not_a_string_is_a_400_naming_it(
    sdk: Any, fake_api: FakeAPI, mode: str | None, extra: dict[str, Any], param: str
) -> None:
    body = {"model": "gpt-4o-mini", "input": QUESTION, **extra}
    async with sdk(mode) as (_client, http):
        r = await http.post("/v1/responses", json=body, headers=API)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param
    assert fake_api.count == 0


async def test_without_a_fallback_what_only_the_api_can_do_is_a_400(
    tmp_path: Path, make_client: Any
) -> None:
    body = {"model": "gpt-4o-mini", "input": QUESTION, "tools": [{"type": "web_search"}]}
    async with make_client(settings_for(tmp_path)) as http:  # no [fallback] api_base
        r = await http.post("/v1/responses", json=body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["code"] == "unsupported_locally" and "web_search" in error["message"]


# Issue 42: the official tool types a coding agent sends (each in the openai SDK's ToolParam),
# with the members each carries; Codex CLI sends `namespace` and `web_search` on every turn.
AGENT_TOOLS: list[dict[str, Any]] = [
    {
        "type": "namespace",
        "name": "multi_agent",
        "description": "Agents to hand work to.",
        "tools": [{"type": "function", "name": "spawn", "parameters": {"type": "object"}}],
    },
    {"type": "tool_search"},
    {"type": "apply_patch"},
    {"type": "shell"},
    {"type": "computer", "display_width": 1024, "display_height": 768, "environment": "linux"},
]


@pytest.mark.parametrize("tool", AGENT_TOOLS, ids=[t["type"] for t in AGENT_TOOLS])
async def test_every_official_tool_type_goes_to_the_apis_responses_as_unsupported(
    sdk: Any, fake_api: FakeAPI, tmp_path: Path, tool: dict[str, Any]
) -> None:
    """Beside a function tool, as Codex sends them: the local model is not asked, the API's
    own /v1/responses gets every tool as it was given."""
    tools = [WEATHER]
    body = {"model": "gpt-4o-mini", "input": QUESTION, "tools": [*tools, tool], "stream": True}
    async with sdk() as (_client, http):
        raw = await http.post("/v1/responses", json=body)
    assert raw.status_code == 200, raw.text
    assert raw.headers["x-frugal-route"] == "api"
    assert raw.headers["x-frugal-reason"] == "unsupported"
    assert "event: response.completed" in raw.text
    [(path, _headers, sent)] = fake_api.requests
    assert path == "/v1/responses"
    assert sent["tools"] == [*tools, tool]
    [row] = rows(tmp_path / "ledger.db")
    assert (row["route"], row["reason"], row["status"]) == ("api", "unsupported", 200)


@pytest.mark.parametrize("mode", [None, "translate"])
async def test_an_unknown_tool_type_is_a_400_that_lists_the_real_allowed_set(
    sdk: Any, fake_api: FakeAPI, mode: str | None
) -> None:
    body = {"model": "gpt-4o-mini", "input": QUESTION, "tools": [{"type": "telepathy"}]}
    async with sdk(mode) as (_client, http):
        r = await http.post("/v1/responses", json=body, headers=API)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "tools[0].type"
    listed = error["message"].split("must be one of ")[1].split(", got")[0].split(", ")
    assert {t["type"] for t in AGENT_TOOLS} | {"function", "web_search", "custom"} <= set(listed)
    assert "'telepathy'" in error["message"]
    assert fake_api.count == 0


@pytest.mark.parametrize(
    "reasoning", [{}, {"effort": None, "summary": None}], ids=["empty", "nulls"]
)
async def test_a_reasoning_that_asks_for_nothing_leaves_the_request_local(
    sdk: Any, fake_api: FakeAPI, tmp_path: Path, reasoning: dict[str, Any]
) -> None:
    """Codex CLI sends ``reasoning: {}`` when it wants no summary: the local model answers."""
    body = {"model": "gpt-4o-mini", "input": QUESTION, "max_output_tokens": 16}
    async with sdk() as (_client, http):
        r = await http.post("/v1/responses", json={**body, "reasoning": reasoning}, headers=LOCAL)
    assert r.status_code == 200, r.text
    assert (r.headers["x-frugal-route"], r.headers["x-frugal-reason"]) == ("local", "forced")
    assert fake_api.count == 0
    [row] = rows(tmp_path / "ledger.db")
    assert (row["route"], row["status"]) == ("local", 200)
