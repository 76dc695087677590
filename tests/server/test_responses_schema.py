"""The published Responses schema on every route: real answers of ``/v1/responses`` (the real
SmolLM2 on the local route, the fake upstream's own ``/v1/responses`` on the API route, which
leaves out fields as llama-server and vLLM do), as JSON and as streams, each object and event
validated with ``jsonschema`` against ``tests/data/responses_schema.json`` (OpenAI's OpenAPI
``Response`` and event schemas, with the fields Open Responses requires; the file says where
each came from). The conformance table of ``docs/openai-compatibility.md`` lists what these
tests check."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from proxy.config import LocalSettings
from proxy.engine.local_engine import LocalEngine
from tests.conftest import settings_for
from tests.fake_api import FakeAPI
from tests.in_process import in_process
from tests.server.test_app import rows
from tests.thinking_model import thinking_gguf

SCHEMA = Path(__file__).parent.parent / "data" / "responses_schema.json"
LOCAL = {"x-frugal-route": "local", "x-frugal-min-quality": "0"}  # any answer is sent
API = {"x-frugal-route": "api"}
QUESTION = "What is the capital of France?"


@cache
def _document() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(SCHEMA.read_text())
    return loaded


@cache
def _validator(name: str) -> jsonschema.Draft202012Validator:
    """The validator of the schema ``$defs[name]``."""
    schema = {"$defs": _document()["$defs"], "$ref": f"#/$defs/{name}"}
    return jsonschema.Draft202012Validator(schema)


def _errors(name: str, value: Any) -> list[str]:
    return [
        f"{name} at {'/'.join(map(str, e.absolute_path)) or '.'}: {e.message[:300]}"
        for e in _validator(name).iter_errors(value)
    ]


def response_errors(response: Any) -> list[str]:
    """What in ``response`` breaks the published ``Response`` schema (empty: nothing)."""
    return _errors("Response", response)


def event_errors(events: list[dict[str, Any]]) -> list[str]:
    """What in a stream's ``events`` breaks the schema of its type (an unknown type too)."""
    found: list[str] = []
    for event in events:
        ref = _document()["events"].get(event.get("type"))
        if ref is None:
            found.append(f"an event of unknown type {event.get('type')!r}")
            continue
        found += _errors(ref["$ref"].rsplit("/", 1)[1], event)
    return found


def sse_events(body: bytes) -> list[dict[str, Any]]:
    """The JSON payloads of a Responses stream's events, in order."""
    events = []
    for block in body.split(b"\n\n"):
        lines = block.split(b"\n")
        data = b"".join(line[5:].strip() for line in lines if line.startswith(b"data:"))
        if data.startswith(b"{"):
            events.append(json.loads(data))
    return events


async def _post(http: Any, body: dict[str, Any], headers: dict[str, str]) -> Any:
    made = await http.post("/v1/responses", json=body, headers=headers)
    assert made.status_code == 200, made.text
    return made


async def _local_both_ways(
    make_client: Any, settings: Any, asked: dict[str, Any]
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """``asked`` answered locally as JSON and as a stream, both checked against the schema:
    the answer and the stream's events."""
    async with make_client(settings) as http:
        plain = await _post(http, asked, LOCAL)
        streamed = await _post(http, {**asked, "stream": True}, LOCAL)
    response = plain.json()
    events = sse_events(streamed.content)
    assert (plain.headers["x-frugal-route"], streamed.headers["x-frugal-route"]) == (
        "local",
        "local",
    )
    assert not (errors := response_errors(response)), errors
    assert not (errors := event_errors(events)), errors
    return response, events


async def test_a_local_answer_and_its_stream_follow_the_published_schema(
    tmp_path: Path, fake_api: FakeAPI, make_client: Any
) -> None:
    """No temperature nor top_p asked: the values the engine used are echoed (greedy: 0 and
    1), in the object and in every event (the default limit: the test below)."""
    settings = settings_for(tmp_path, fake_api)
    asked = {"model": "gpt-4o-mini", "input": QUESTION, "max_output_tokens": 24}
    response, events = await _local_both_ways(make_client, settings, asked)
    final = events[-1]["response"]
    assert [e["type"] for e in events[:2]] == ["response.created", "response.in_progress"]
    for made in (response, final):
        assert (made["temperature"], made["top_p"]) == (0.0, 1.0)
        assert made["max_output_tokens"] == 24
        assert (made["presence_penalty"], made["frequency_penalty"], made["top_logprobs"]) == (
            0.0,
            0.0,
            0,
        )
        if made["status"] == "completed":
            assert made["completed_at"] >= made["created_at"]
    assert events[0]["response"]["completed_at"] is None
    assert fake_api.count == 0


async def test_a_live_local_stream_follows_the_published_schema(
    tmp_path: Path, fake_api: FakeAPI, make_client: Any
) -> None:
    settings = settings_for(tmp_path, fake_api, router={"stream_mode": "live"})
    asked = {"model": "gpt-4o-mini", "input": QUESTION, "max_output_tokens": 12, "stream": True}
    async with make_client(settings) as http:
        streamed = await _post(http, {**asked, "temperature": 0.5}, {})
    events = sse_events(streamed.content)
    assert (streamed.headers["x-frugal-route"], streamed.headers["x-frugal-reason"]) == (
        "local",
        "live",
    )
    assert not (errors := event_errors(events)), errors
    for event in (events[0], events[-1]):
        made = event["response"]
        assert (made["temperature"], made["top_p"], made["max_output_tokens"]) == (0.5, 1.0, 12)


async def test_an_answer_cut_by_the_default_limit_echoes_that_limit(
    tmp_path: Path, fake_api: FakeAPI, make_client: Any
) -> None:
    """``[local] default_max_tokens`` cut the answer: ``incomplete``, ``max_output_tokens`` that
    limit (not null beside a reason that names it)."""
    settings = settings_for(tmp_path, fake_api, local={"default_max_tokens": 4, "parallel": 1})
    asked = {"model": "gpt-4o-mini", "input": "Write a long story about a lighthouse keeper."}
    async with make_client(settings, own_engine=True) as http:
        plain = await _post(http, asked, LOCAL)
    response = plain.json()
    assert plain.headers["x-frugal-route"] == "local"
    assert not (errors := response_errors(response)), errors
    assert (response["status"], response["incomplete_details"]) == (
        "incomplete",
        {"reason": "max_output_tokens"},
    )
    assert response["max_output_tokens"] == 4 == response["usage"]["output_tokens"]
    assert response["completed_at"] is None


async def test_an_api_answer_that_leaves_fields_out_is_completed(
    tmp_path: Path, fake_api: FakeAPI, make_client: Any
) -> None:
    """The fake upstream's ``response`` lacks ``temperature``, ``top_p``, ``tool_choice``,
    ``parallel_tool_calls`` and more, its text parts ``logprobs``, its stream's deltas
    ``logprobs`` and its ``function_call_arguments.done`` the ``name``: the proxy fills them in
    (JSON and stream, a text answer and a tool call), and keeps what it sent."""
    fake_api.set(reply="Paris is the capital.")
    settings = settings_for(tmp_path, fake_api)
    asked = {"model": "gpt-4o-mini", "input": QUESTION, "temperature": 0.25}
    tools = [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}]
    async with make_client(settings) as http:
        plain = await _post(http, asked, API)
        streamed = await _post(http, {**asked, "stream": True}, API)
        fake_api.set(tool_call={"name": "get_weather", "arguments": {"city": "Paris"}})
        called = await _post(http, {**asked, "tools": tools, "stream": True}, API)
    upstream = [body for path, _h, body in fake_api.requests if path == "/v1/responses"]
    assert len(upstream) == 3
    response = plain.json()
    assert plain.headers["x-frugal-route"] == "api"
    assert not (errors := response_errors(response)), errors
    assert (response["temperature"], response["top_p"], response["tool_choice"]) == (
        0.25,
        1.0,
        "auto",
    )
    assert response["output"][0]["content"][0]["text"] == "Paris is the capital."
    events = sse_events(streamed.content)
    tool_events = sse_events(called.content)
    assert not (errors := event_errors(events)), errors
    assert not (errors := event_errors(tool_events)), errors
    assert events[-1]["response"]["temperature"] == 0.25
    [done] = [e for e in tool_events if e["type"] == "response.function_call_arguments.done"]
    assert (done["name"], json.loads(done["arguments"])) == ("get_weather", {"city": "Paris"})


async def test_a_forced_local_answer_past_its_deadline_is_failed_not_incomplete(
    tmp_path: Path, fake_api: FakeAPI, make_client: Any
) -> None:
    """``model: "local"`` and a deadline (``[local] timeout_s``) far too short for the answer:
    ``failed`` with ``error.code`` ``server_error`` (JSON, and a stream ending with
    ``response.failed``), never ``incomplete`` with ``max_output_tokens``, a limit not reached."""
    settings = settings_for(tmp_path, fake_api, local={"timeout_s": 0.1})
    asked = {
        "model": "local",
        "input": "Write a very long story about a lighthouse keeper.",
        "max_output_tokens": 400,
    }
    async with make_client(settings) as http:
        plain = await _post(http, asked, {})
        streamed = await _post(http, {**asked, "stream": True}, {})
    response = plain.json()
    events = sse_events(streamed.content)
    assert plain.headers["x-frugal-route"] == "local"
    assert not (errors := response_errors(response)), errors
    assert not (errors := event_errors(events)), errors
    for made in (response, events[-1]["response"]):
        assert (made["status"], made["incomplete_details"]) == ("failed", None)
        assert made["error"]["code"] == "server_error"
        assert "deadline" in made["error"]["message"]
        assert made["usage"]["output_tokens"] < 400
    assert events[-1]["type"] == "response.failed"
    assert fake_api.count == 0
    logged = rows(tmp_path / "ledger.db")
    assert [(r["route"], r["error"]) for r in logged] == [("local", "local_timeout")] * 2


async def test_a_translated_api_answer_and_its_tool_call_stream_follow_the_schema(
    tmp_path: Path, fake_api: FakeAPI, make_client: Any
) -> None:
    """``[fallback] responses = "translate"``: the upstream's chat answers are built into the
    Responses object and events here (a text answer as JSON, a function call as a stream), with
    the API's documented sampling defaults echoed (1 and 1) where none was asked."""
    settings = settings_for(tmp_path, fake_api, fallback={"responses": "translate"})
    tools = [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}]
    asked = {"model": "gpt-4o-mini", "input": QUESTION}
    async with make_client(settings) as http:
        plain = await _post(http, asked, API)
        fake_api.set(tool_call={"name": "get_weather", "arguments": {"city": "Paris"}})
        called = await _post(http, {**asked, "tools": tools, "stream": True}, API)
    response = plain.json()
    events = sse_events(called.content)
    assert [path for path, _h, _b in fake_api.requests] == ["/v1/chat/completions"] * 2
    assert not (errors := response_errors(response)), errors
    assert not (errors := event_errors(events)), errors
    assert (response["temperature"], response["top_p"], response["max_output_tokens"]) == (
        1.0,
        1.0,
        None,
    )
    kinds = [e["type"] for e in events]
    assert "response.function_call_arguments.done" in kinds
    assert events[-1]["response"]["output"][0]["name"] == "get_weather"


WEATHER = [
    {
        "type": "function",
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    }
]


def _kinds(events: list[dict[str, Any]]) -> list[str]:
    return [e["type"] for e in events]


def _streamed(events: list[dict[str, Any]], part: str) -> tuple[str, str]:
    """A streamed ``part`` (``refusal``, ``reasoning_text``): its deltas joined, and the whole
    that its one ``.done`` event gives, for the two to be compared."""
    [done] = [e for e in events if e["type"] == f"response.{part}.done"]
    deltas = [e["delta"] for e in events if e["type"] == f"response.{part}.delta"]
    return "".join(deltas), done["refusal" if part == "refusal" else "text"]


async def test_a_local_function_call_and_its_stream_follow_the_schema(
    tmp_path: Path, fake_api: FakeAPI, make_client: Any
) -> None:
    """A forced-local request with a function tool and ``tool_choice: "required"``: the grammar
    makes SmolLM2 call it, as a ``function_call`` item (JSON) and as the item's events with
    ``response.function_call_arguments.delta`` and ``.done`` (a ``verify`` stream)."""
    settings = settings_for(tmp_path, fake_api)
    asked = {
        "model": "gpt-4o-mini",
        "input": "What is the weather in Paris?",
        "tools": WEATHER,
        "tool_choice": "required",
        "max_output_tokens": 64,
    }
    response, events = await _local_both_ways(make_client, settings, asked)
    for made in (response, events[-1]["response"]):
        calls = [i for i in made["output"] if i["type"] == "function_call"]
        assert [c["name"] for c in calls] == ["get_weather"], made["output"]
        assert isinstance(json.loads(calls[0]["arguments"]), dict)
    kinds = _kinds(events)
    added = [e["item"]["type"] for e in events if e["type"] == "response.output_item.added"]
    assert "function_call" in added
    assert kinds.count("response.function_call_arguments.delta") >= 1
    [done] = [e for e in events if e["type"] == "response.function_call_arguments.done"]
    assert done["name"] == "get_weather"
    assert kinds[-1] == "response.completed"
    assert fake_api.count == 0


async def test_the_apis_failed_stream_and_a_cut_stream_follow_the_schema(
    tmp_path: Path, fake_api: FakeAPI, make_client: Any
) -> None:
    """The API's own ``/v1/responses``: a stream the upstream ends with ``response.failed``
    (relayed, its response mended), and one cut before its end (the events relayed as they
    came, one by one, then the proxy's own ``error`` event)."""
    settings = settings_for(tmp_path, fake_api)
    asked = {"model": "gpt-4o-mini", "input": QUESTION, "stream": True}
    async with make_client(settings) as http:
        fake_api.set(failed_response="the model broke down")
        failed = await _post(http, asked, API)
        fake_api.set(failed_response=None, cut_stream_after=3, per_token_s=0.05)
        cut = await _post(http, asked, API)
    failed_events = sse_events(failed.content)
    cut_events = sse_events(cut.content)
    assert (failed.headers["x-frugal-route"], cut.headers["x-frugal-route"]) == ("api", "api")
    assert not (errors := event_errors(failed_events)), errors
    assert not (errors := event_errors(cut_events)), errors
    last = failed_events[-1]
    assert last["type"] == "response.failed"
    assert (last["response"]["status"], last["response"]["error"]["code"]) == (
        "failed",
        "server_error",
    )
    assert _kinds(cut_events)[:2] == ["response.created", "response.in_progress"]
    assert _kinds(cut_events)[-1] == "error"
    assert cut_events[-1]["code"] == "upstream_failed"
    assert [e["sequence_number"] for e in cut_events] == list(range(len(cut_events)))


async def test_a_translated_text_stream_and_a_refusal_follow_the_schema(
    tmp_path: Path, fake_api: FakeAPI, make_client: Any
) -> None:
    """``[fallback] responses = "translate"``: a text answer streamed (its ``message`` item,
    content part and text deltas), and a chat answer that refuses (``refusal``, no content)
    as a ``refusal`` part, JSON and streamed with ``response.refusal.delta`` and ``.done``."""
    settings = settings_for(tmp_path, fake_api, fallback={"responses": "translate"})
    asked = {"model": "gpt-4o-mini", "input": QUESTION}
    said = "I can't help with that."
    async with make_client(settings) as http:
        text = await _post(http, {**asked, "stream": True}, API)
        fake_api.set(refusal=said)
        plain = await _post(http, asked, API)
        streamed = await _post(http, {**asked, "stream": True}, API)
    assert [path for path, _h, _b in fake_api.requests] == ["/v1/chat/completions"] * 3
    text_events = sse_events(text.content)
    response = plain.json()
    events = sse_events(streamed.content)
    assert not (errors := event_errors(text_events)), errors
    assert not (errors := response_errors(response)), errors
    assert not (errors := event_errors(events)), errors
    text_kinds = _kinds(text_events)
    for kind in (
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
    ):
        assert kind in text_kinds
    assert text_events[-1]["response"]["output"][0]["content"][0]["text"] == fake_api.reply
    for made in (response, events[-1]["response"]):
        assert made["output"][0]["content"] == [{"type": "refusal", "refusal": said}]
    assert _streamed(events, "refusal") == (said, said)


async def test_a_live_local_stream_past_its_deadline_ends_failed(
    tmp_path: Path, fake_api: FakeAPI, make_client: Any
) -> None:
    """``stream_mode = "live"``, ``model: "local"`` and a deadline far too short for a long
    answer: the tokens already sent stay, and the stream ends with ``response.failed``
    (``server_error``), validated with the rest of its events."""
    settings = settings_for(
        tmp_path, fake_api, router={"stream_mode": "live"}, local={"timeout_s": 1.0}
    )
    asked = {
        "model": "local",
        "input": "Write a very long story about a lighthouse keeper.",
        "max_output_tokens": 400,
        "stream": True,
    }
    async with make_client(settings) as http:
        streamed = await _post(http, asked, {})
    events = sse_events(streamed.content)
    assert (streamed.headers["x-frugal-route"], streamed.headers["x-frugal-reason"]) == (
        "local",
        "forced",  # a forced-local live stream says so, not "live"
    )
    assert not (errors := event_errors(events)), errors
    assert "response.output_text.delta" in _kinds(events)
    last = events[-1]
    assert last["type"] == "response.failed"
    made = last["response"]
    assert (made["status"], made["error"]["code"]) == ("failed", "server_error")
    assert made["usage"] is None or made["usage"]["output_tokens"] < 400
    assert fake_api.count == 0


@pytest.fixture(scope="module")
async def thinker(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[LocalEngine]:
    """The bundled SmolLM2 with a template that opens a ``<think>`` block
    (``tests/thinking_model.py``), as ``tests/server/test_reasoning.py`` runs it."""
    path = thinking_gguf(tmp_path_factory.mktemp("thinking"))
    engine = LocalEngine(LocalSettings(model_path=str(path), n_threads=1, parallel=1))
    await engine.start()
    yield engine
    await engine.stop()


async def test_a_local_reasoning_item_and_its_events_follow_the_schema(
    tmp_path: Path, thinker: LocalEngine
) -> None:
    """A local model that thinks: its ``reasoning`` item (JSON), and its
    ``response.reasoning_text.delta`` and ``.done`` events in a ``verify`` stream and in a
    ``live`` one (the item streamed as the tokens come, before the message)."""
    asked = {"model": "gpt-4o-mini", "input": "What is 2+2?", "max_output_tokens": 5}
    answers = []
    for mode in ("verify", "live"):
        (tmp_path / mode).mkdir()
        settings = settings_for(tmp_path / mode, router={"stream_mode": mode})
        async with in_process(settings, thinker) as http:
            if mode == "verify":
                answers.append(await _post(http, asked, LOCAL))
            answers.append(await _post(http, {**asked, "stream": True}, LOCAL))
    plain, verify, live = answers
    assert [a.headers["x-frugal-route"] for a in answers] == ["local"] * 3
    assert live.headers["x-frugal-reason"] == "forced"  # a forced-local live stream says so
    response = plain.json()
    assert not (errors := response_errors(response)), errors
    assert response["output"][0]["type"] == "reasoning"
    for streamed in (verify, live):
        events = sse_events(streamed.content)
        assert not (errors := event_errors(events)), errors
        kinds = _kinds(events)
        assert "response.reasoning_text.delta" in kinds
        deltas, done = _streamed(events, "reasoning_text")
        assert deltas == done
        added = [e["item"]["type"] for e in events if e["type"] == "response.output_item.added"]
        assert added[0] == "reasoning"
        assert events[-1]["response"]["output"][0]["type"] == "reasoning"


async def test_a_reasoning_item_on_the_api_routes_follows_the_schema(
    tmp_path: Path, fake_api: FakeAPI, make_client: Any
) -> None:
    """The API's own ``/v1/responses`` asked for ``reasoning``: the upstream's ``reasoning``
    item, relayed (a summary and no text, then with its text streamed); and on the translate
    route (which refuses ``reasoning``) a chat answer with ``reasoning_content`` (as vLLM
    sends a thinking model's): a ``reasoning`` item with its ``reasoning_text`` part, JSON and
    streamed with ``response.reasoning_text.delta`` and ``.done``."""
    thought = "The user asks for a capital. Paris."
    asked = {"model": "gpt-4o-mini", "input": QUESTION, "reasoning": {"effort": "low"}}
    (tmp_path / "own").mkdir()
    (tmp_path / "chat").mkdir()
    async with make_client(settings_for(tmp_path / "own", fake_api)) as http:
        own = await _post(http, asked, API)
        own_streamed = await _post(http, {**asked, "stream": True}, API)
        fake_api.set(thinking=thought)
        thinking = await _post(http, {**asked, "stream": True}, API)
    translate = settings_for(tmp_path / "chat", fake_api, fallback={"responses": "translate"})
    async with make_client(translate) as http:
        chat = {"model": "gpt-4o-mini", "input": QUESTION}  # translate takes no reasoning
        plain = await _post(http, chat, API)
        streamed = await _post(http, {**chat, "stream": True}, API)
    paths = [path for path, _h, _b in fake_api.requests]
    assert paths == ["/v1/responses"] * 3 + ["/v1/chat/completions"] * 2
    for made in (own.json(), plain.json()):
        assert not (errors := response_errors(made)), errors
        assert made["output"][0]["type"] == "reasoning"
    own_events = sse_events(own_streamed.content)
    thinking_events = sse_events(thinking.content)
    events = sse_events(streamed.content)
    assert not (errors := event_errors(own_events)), errors
    assert not (errors := event_errors(thinking_events)), errors
    assert not (errors := event_errors(events)), errors
    for stream in (own_events, thinking_events, events):
        added = [e["item"]["type"] for e in stream if e["type"] == "response.output_item.added"]
        assert added[0] == "reasoning"
    assert plain.json()["output"][0]["content"] == [{"type": "reasoning_text", "text": thought}]
    for stream in (thinking_events, events):
        assert _streamed(stream, "reasoning_text") == (thought, thought)


async def test_the_apis_own_refusal_follows_the_schema(
    tmp_path: Path, fake_api: FakeAPI, make_client: Any
) -> None:
    """The API's own ``/v1/responses`` refuses: its ``refusal`` part (JSON) and its
    ``response.refusal.delta`` and ``.done`` events, relayed and mended."""
    said = "I can't help with that."
    fake_api.set(refusal=said)
    asked = {"model": "gpt-4o-mini", "input": QUESTION}
    async with make_client(settings_for(tmp_path, fake_api)) as http:
        plain = await _post(http, asked, API)
        streamed = await _post(http, {**asked, "stream": True}, API)
    assert [path for path, _h, _b in fake_api.requests] == ["/v1/responses"] * 2
    response = plain.json()
    events = sse_events(streamed.content)
    assert not (errors := response_errors(response)), errors
    assert not (errors := event_errors(events)), errors
    for made in (response, events[-1]["response"]):
        assert made["output"][0]["content"] == [{"type": "refusal", "refusal": said}]
    assert _streamed(events, "refusal") == (said, said)
