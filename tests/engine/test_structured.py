"""JSON mode, tools, n > 1, legacy completions and embeddings, in-process with the real engine.

Local answers are forced through the gate with ``x-frugal-min-quality: 0`` where the test is
about their shape, not their quality (SmolLM2-135M is tiny).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from proxy.routing.servable import local_blocker
from tests.conftest import settings_for
from tests.fake_api import FakeAPI
from tests.server.test_app import rows, sse_events
from tests.tool_turns import DESCRIPTION, weather_tool, weather_turns

ACCEPT = {"x-frugal-min-quality": "0"}
REJECT = {"x-frugal-min-quality": "1"}
WEATHER = weather_tool(DESCRIPTION, unit=True)
REPLY_JSON = (
    'Reply with a JSON object with one key, "answer", whose value is the capital of France.'
)
ASK_WEATHER = [{"role": "user", "content": "What is the weather in Paris?"}]
CAT_SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


def chunks_of(text: str) -> list[dict[str, Any]]:
    events = sse_events(text)
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


async def test_json_schema_answer_is_valid_by_construction(
    tmp_path: Path, fake_api: FakeAPI, make_client: Any
) -> None:
    body = {
        "model": "gpt-4o-mini",
        "messages": [{"role": "user", "content": "Give a cat's name and age as JSON."}],
        "max_tokens": 60,
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "cat", "schema": CAT_SCHEMA, "strict": True},
        },
    }
    async with make_client(settings_for(tmp_path, fake_api)) as client:
        r = await client.post("/v1/chat/completions", json=body, headers=ACCEPT)
        plain = await client.post(
            "/v1/chat/completions",
            json={
                **body,
                "messages": [{"role": "user", "content": REPLY_JSON}],
                "response_format": {"type": "json_object"},
            },
            headers=ACCEPT,
        )
    assert r.status_code == 200, r.text
    assert r.headers["x-frugal-route"] == "local"
    jsonschema.validate(json.loads(r.json()["choices"][0]["message"]["content"]), CAT_SCHEMA)
    # Greedy and deterministic: this object closes within the limit (a cut one would not parse,
    # and the gate would send it to the API).
    assert plain.json()["choices"][0]["finish_reason"] == "stop"
    assert isinstance(json.loads(plain.json()["choices"][0]["message"]["content"]), dict)
    assert fake_api.count == 0


async def test_invalid_schema_is_a_400_naming_it(
    tmp_path: Path, fake_api: FakeAPI, make_client: Any
) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "cat"}}}
    async with make_client(settings_for(tmp_path, fake_api)) as client:
        r = await client.post(
            "/v1/chat/completions",
            json={"model": "gpt-4o-mini", "messages": ASK_WEATHER, "response_format": fmt},
        )
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "response_format.json_schema.schema"
    assert fake_api.count == 0


async def test_required_tool_call_is_made_locally_and_streams_as_deltas(
    tmp_path: Path, fake_api: FakeAPI, make_client: Any
) -> None:
    body = {
        "model": "gpt-4o-mini",
        "messages": ASK_WEATHER,
        "tools": [WEATHER],
        "tool_choice": "required",
        # room for the call and the repeat that the greedy SmolLM2 writes after it, at which
        # the engine stops (tests/engine/test_tool_calls.py)
        "max_tokens": 80,
    }
    settings = settings_for(tmp_path, fake_api, router={"stream_mode": "live"})
    async with make_client(settings) as client:
        r = await client.post("/v1/chat/completions", json=body, headers=ACCEPT)
        s = await client.post("/v1/chat/completions", json={**body, "stream": True}, headers=ACCEPT)
    assert r.status_code == 200, r.text
    assert r.headers["x-frugal-route"] == "local"
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] is None
    [call] = choice["message"]["tool_calls"]
    assert call["function"]["name"] == "get_weather"
    jsonschema.validate(
        json.loads(call["function"]["arguments"]), WEATHER["function"]["parameters"]
    )
    # Live mode cannot stream a call token by token: it is scored, then replayed as deltas.
    assert s.headers["x-frugal-route"] == "local" and s.headers["x-frugal-reason"] != "live"
    deltas = [c["choices"][0]["delta"] for c in chunks_of(s.text) if c["choices"]]
    head = deltas[0]["tool_calls"][0]
    assert head["function"]["name"] == "get_weather" and head["id"].startswith("call_")
    arguments = "".join(
        d["tool_calls"][0]["function"]["arguments"] for d in deltas if d.get("tool_calls")
    )
    jsonschema.validate(json.loads(arguments), WEATHER["function"]["parameters"])
    assert chunks_of(s.text)[-1]["choices"][0]["finish_reason"] == "tool_calls"


async def test_tool_results_come_back_in_tool_messages(
    tmp_path: Path, fake_api: FakeAPI, make_client: Any
) -> None:
    messages = [
        *ASK_WEATHER,
        *weather_turns("22 C and sunny"),
    ]
    body = {"model": "local", "messages": messages, "tools": [WEATHER], "max_tokens": 30}
    async with make_client(settings_for(tmp_path, fake_api)) as client:
        r = await client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    message = r.json()["choices"][0]["message"]
    # "auto": the model chose text or a call; either way the answer is well formed.
    if message.get("tool_calls"):
        json.loads(message["tool_calls"][0]["function"]["arguments"])
        assert r.json()["choices"][0]["finish_reason"] == "tool_calls"
    else:
        assert message["content"] and not message["content"].lstrip().startswith("{")


async def test_n_answers_locally_in_json_and_in_a_stream(
    tmp_path: Path, fake_api: FakeAPI, make_client: Any
) -> None:
    body = {
        "model": "gpt-4o-mini",
        "messages": [{"role": "user", "content": "Name a color."}],
        "max_tokens": 6,
        "n": 2,
        "seed": 1,
    }
    async with make_client(settings_for(tmp_path, fake_api)) as client:
        r = await client.post("/v1/chat/completions", json=body, headers=ACCEPT)
        s = await client.post(
            "/v1/chat/completions",
            json={**body, "stream": True, "stream_options": {"include_usage": True}},
            headers=ACCEPT,
        )
    assert r.status_code == 200, r.text
    answer = r.json()
    assert [c["index"] for c in answer["choices"]] == [0, 1]
    assert all(c["message"]["content"] for c in answer["choices"])
    assert answer["usage"]["completion_tokens"] <= 12
    chunks = chunks_of(s.text)
    texts = {0: "", 1: ""}
    for chunk in chunks[:-1]:
        for choice in chunk["choices"]:
            texts[choice["index"]] += choice["delta"].get("content") or ""
    assert all(texts.values())
    assert chunks[-1]["usage"]["completion_tokens"] > 0
    assert fake_api.count == 0


async def test_requests_the_local_model_cannot_serve_go_to_the_api_unchanged(
    tmp_path: Path, fake_api: FakeAPI, make_client: Any
) -> None:
    image = {
        "role": "user",
        "content": [
            {"type": "text", "text": "What is in this picture?"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
        ],
    }
    bodies = [
        {"model": "gpt-4o-mini", "messages": [image]},
        {"model": "gpt-4o-mini", "messages": ASK_WEATHER, "n": 9},
        {"model": "gpt-4o-mini", "messages": ASK_WEATHER, "web_search_options": {}},
    ]
    async with make_client(settings_for(tmp_path, fake_api)) as client:
        answers = [await client.post("/v1/chat/completions", json=b) for b in bodies]
        local_only = await client.post("/v1/chat/completions", json={**bodies[0], "model": "local"})
        # A key outside OpenAI's parameters is no longer forwarded: it is a 400, as on OpenAI.
        unknown = await client.post("/v1/chat/completions", json={**bodies[1], "top_k": 3})
    for r in answers:
        assert r.status_code == 200, r.text
        assert (r.headers["x-frugal-route"], r.headers["x-frugal-reason"]) == (
            "api",
            "unsupported",
        )
    assert [req.body for req in fake_api.requests] == bodies
    assert local_only.status_code == 400
    assert local_only.json()["error"]["code"] == "unsupported_locally"
    assert unknown.status_code == 400 and unknown.json()["error"]["param"] == "top_k"


async def test_legacy_completions_local_first_with_logprobs_echo_and_stream(
    tmp_path: Path, fake_api: FakeAPI, make_client: Any
) -> None:
    body = {"model": "gpt-3.5-turbo-instruct", "prompt": "The capital of France is"}
    async with make_client(settings_for(tmp_path, fake_api)) as client:
        r = await client.post(
            "/v1/completions",
            json={**body, "max_tokens": 5, "logprobs": 2},
            headers={**ACCEPT, "x-request-id": "legacy-1"},
        )
        echo = await client.post(
            "/v1/completions", json={**body, "max_tokens": 3, "echo": True}, headers=ACCEPT
        )
        default = await client.post("/v1/completions", json=body, headers=ACCEPT)
        s = await client.post(
            "/v1/completions",
            json={
                **body,
                "max_tokens": 4,
                "stream": True,
                "stream_options": {"include_usage": True},
            },
            headers=ACCEPT,
        )
    assert r.status_code == 200, r.text
    assert (r.headers["x-frugal-route"], r.headers["x-request-id"]) == ("local", "legacy-1")
    answer = r.json()
    assert answer["object"] == "text_completion"
    [choice] = answer["choices"]
    lp = choice["logprobs"]
    assert "".join(lp["tokens"]) == choice["text"]
    assert len(lp["token_logprobs"]) == len(lp["tokens"]) == answer["usage"]["completion_tokens"]
    assert all(len(top) == 2 for top in lp["top_logprobs"])
    assert lp["text_offset"][0] == len(body["prompt"])
    assert echo.json()["choices"][0]["text"].startswith(body["prompt"])
    assert echo.json()["choices"][0]["logprobs"] is None
    assert default.json()["usage"]["completion_tokens"] <= 16  # OpenAI's default max_tokens
    chunks = chunks_of(s.text)
    assert all(c["object"] == "text_completion" for c in chunks)
    streamed = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
    assert streamed and chunks[-1]["usage"]["completion_tokens"] == len(
        [c for c in chunks if c["choices"] and c["choices"][0]["text"]]
    )
    ledger = rows(tmp_path / "ledger.db")
    assert {row["endpoint"] for row in ledger} == {"completions"}
    assert ledger[0]["request_id"] == "legacy-1" and ledger[0]["route"] == "local"
    assert fake_api.count == 0


async def test_legacy_completions_fall_back_to_the_api(
    tmp_path: Path, fake_api: FakeAPI, make_client: Any
) -> None:
    fake_api.set(reply="Paris, of course.")
    body = {"model": "gpt-3.5-turbo-instruct", "prompt": "The capital of France is", "suffix": "!"}
    async with make_client(settings_for(tmp_path, fake_api)) as client:
        unsupported = await client.post("/v1/completions", json=body)
        rejected = await client.post(
            "/v1/completions", json={"model": "m", "prompt": "Hi", "stream": True}, headers=REJECT
        )
    assert (unsupported.headers["x-frugal-route"], unsupported.headers["x-frugal-reason"]) == (
        "api",
        "unsupported",
    )
    assert unsupported.json()["choices"][0]["text"] == "Paris, of course."
    assert fake_api.requests[0].path == "/v1/completions"
    assert fake_api.requests[0].body == body
    assert (rejected.headers["x-frugal-route"], rejected.headers["x-frugal-reason"]) == (
        "api",
        "low_quality",
    )
    text = "".join(c["choices"][0]["text"] for c in chunks_of(rejected.text) if c["choices"])
    assert text == "Paris, of course."
    assert "stream" not in fake_api.requests[1].body  # asked as JSON, replayed as a stream
    ledger = rows(tmp_path / "ledger.db")
    assert [(r["endpoint"], r["route"]) for r in ledger] == [("completions", "api")] * 2
    assert ledger[0]["api_cost_pusd"] is not None


async def test_embeddings_pass_through_to_the_api(
    tmp_path: Path, fake_api: FakeAPI, make_client: Any
) -> None:
    body = {"model": "text-embedding-3-small", "input": ["hello", "world"]}
    async with make_client(settings_for(tmp_path, fake_api)) as client:
        r = await client.post("/v1/embeddings", json=body, headers={"x-request-id": "emb-1"})
        local = await client.post("/v1/embeddings", json={**body, "model": "local"})
        bad = await client.post("/v1/embeddings", json={"model": "m"})
    assert r.status_code == 200, r.text
    assert (r.headers["x-frugal-route"], r.headers["x-frugal-reason"]) == ("api", "unsupported")
    assert r.headers["x-request-id"] == "emb-1"
    assert [d["index"] for d in r.json()["data"]] == [0, 1]
    assert fake_api.requests[0].body == body
    assert local.status_code == 400 and local.json()["error"]["param"] == "model"
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "input"
    ledger = rows(tmp_path / "ledger.db")
    assert [(r["endpoint"], r["status"]) for r in ledger] == [
        ("embeddings", 200),
        ("embeddings", 400),
        ("embeddings", 400),
    ]
    assert ledger[0]["request_id"] == "emb-1"
    assert ledger[0]["prompt_tokens"] == 2 and ledger[0]["api_cost_pusd"] is not None


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/embeddings"])
async def test_new_endpoints_without_a_fallback(
    tmp_path: Path, make_client: Any, path: str
) -> None:
    body = (
        {"model": "m", "prompt": "Hi", "max_tokens": 2}
        if path == "/v1/completions"
        else {"model": "m", "input": "Hi"}
    )
    async with make_client(settings_for(tmp_path, None)) as client:
        r = await client.post(path, json=body, headers=REJECT)
    if path == "/v1/completions":
        assert r.status_code == 200 and r.headers["x-frugal-reason"] == "no_fallback"
    else:
        assert r.status_code == 503 and r.json()["error"]["code"] == "local_unavailable"


async def test_openapi_document_lists_the_endpoints(
    tmp_path: Path, fake_api: FakeAPI, make_client: Any
) -> None:
    async with make_client(settings_for(tmp_path, fake_api)) as client:
        r = await client.get("/openapi.json")
    assert r.status_code == 200
    spec = r.json()
    assert spec["openapi"].startswith("3.1")
    assert {
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/embeddings",
        "/v1/models",
    } <= set(spec["paths"])
    chat = spec["components"]["schemas"]["ChatCompletionRequest"]["properties"]
    from proxy.protocol.params import CHAT_PARAMETERS

    assert set(CHAT_PARAMETERS) <= set(chat)


async def test_a_schema_the_converter_refuses_in_the_worker_goes_to_the_api_as_unsupported(
    tmp_path: Path, fake_api: FakeAPI, make_client: Any
) -> None:
    """The converter runs only in the engine worker: a schema it cannot turn into a grammar (a
    ``not`` inside a property) passes the planning-time size check, fails in the worker, and goes
    to the API with reason ``unsupported``; model ``local`` gets a 400 saying why."""
    schema = {"type": "object", "properties": {"name": {"not": {}}}}
    body = {
        "model": "gpt-4o-mini",
        "messages": [{"role": "user", "content": "A cat, as JSON."}],
        "max_tokens": 16,
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "cat", "schema": schema},
        },
    }
    assert local_blocker(body) is None  # planning lets it through: only the worker can tell
    async with make_client(settings_for(tmp_path, fake_api)) as client:
        routed = await client.post("/v1/chat/completions", json=body)
        local_only = await client.post("/v1/chat/completions", json={**body, "model": "local"})
        health = (await client.get("/healthz")).json()
    assert routed.status_code == 200, routed.text
    assert (routed.headers["x-frugal-route"], routed.headers["x-frugal-reason"]) == (
        "api",
        "unsupported",
    )
    assert local_only.status_code == 400, local_only.text
    assert local_only.json()["error"]["code"] == "unsupported_locally"
    assert health["engine"]["crashes"] == 0  # a refused grammar fails its request, not the worker
    first, second = rows(tmp_path / "ledger.db")
    assert (first["route"], first["reason"], first["status"]) == ("api", "unsupported", 200)
    assert second["status"] == 400
