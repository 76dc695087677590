"""Request validation and the local/API classification of every parameter, without a model.

The parameter list comes from the installed ``openai`` SDK, so a new SDK parameter fails here
until it is classified in ``proxy.protocol.params`` and documented in
``docs/openai-compatibility.md``.
"""

from __future__ import annotations

import json
import re
import typing
from pathlib import Path
from typing import Any

import pytest
from openai.types import completion_create_params as legacy_params
from openai.types import embedding_create_params as embedding_params
from openai.types.chat import completion_create_params as chat_params
from openai.types.responses import response_create_params as response_params

from proxy.engine import grammar, tools
from proxy.errors import BadRequest
from proxy.protocol.params import (
    API,
    CHAT_PARAMETERS,
    COMPLETIONS_PARAMETERS,
    DEPENDS,
    EMBEDDINGS_PARAMETERS,
    HONOURED,
    IGNORED,
)
from proxy.protocol.responses_params import RESPONSES_NOT_YET, RESPONSES_PARAMETERS
from proxy.protocol.validate import (
    chat_request,
    completions_request,
    embeddings_request,
    parse_json,
)
from proxy.routing.servable import chat_blocker, completions_blocker, live_streamable
from proxy.upstream.responses_api import API_ONLY, PARTLY_LOCAL
from tests.tool_turns import weather_turns

DOC = Path(__file__).resolve().parents[2] / "docs" / "openai-compatibility.md"
MSG = [{"role": "user", "content": "hi"}]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


def sdk_parameters(module: Any) -> set[str]:
    base = module.CompletionCreateParamsBase
    streaming = module.CompletionCreateParamsStreaming
    return set(typing.get_type_hints(base)) | set(typing.get_type_hints(streaming))


def doc_table(heading: str) -> dict[str, str]:
    """{parameter: local-route cell} of the table under ``heading`` in the compatibility doc."""
    text = DOC.read_text()
    section = text.split(heading, 1)[1].split("\n## ", 1)[0]
    rows: dict[str, str] = {}
    for line in section.splitlines():
        if not line.startswith("| `"):
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        for name in re.findall(r"`([a-z_]+)`", cells[0]):
            rows[name] = cells[1]
    return rows


# -- every SDK parameter is classified and documented ----------------------------------------


def test_every_sdk_chat_parameter_is_classified_and_documented() -> None:
    sdk = sdk_parameters(chat_params)
    assert {"messages", "model", "audio", "prediction", "verbosity"} <= sdk  # the list is real
    documented = doc_table("## `POST /v1/chat/completions`")
    assert sorted(sdk - set(CHAT_PARAMETERS)) == []
    assert sorted(sdk - set(documented)) == []
    for name, handling in CHAT_PARAMETERS.items():
        assert documented.get(name) == handling, name
        assert handling in (HONOURED, IGNORED, DEPENDS, API)


def test_every_sdk_legacy_completions_parameter_is_classified_and_documented() -> None:
    sdk = sdk_parameters(legacy_params)
    documented = doc_table("## `POST /v1/completions` (legacy)")
    assert sorted(sdk - set(COMPLETIONS_PARAMETERS)) == []
    assert sorted(sdk - set(documented)) == []
    for name, handling in COMPLETIONS_PARAMETERS.items():
        assert documented.get(name) == handling, name


def test_every_sdk_responses_parameter_is_classified_and_documented() -> None:
    sdk = set(typing.get_type_hints(response_params.ResponseCreateParamsBase))
    sdk |= set(typing.get_type_hints(response_params.ResponseCreateParamsStreaming))
    assert {"input", "instructions", "previous_response_id", "text"} <= sdk  # the list is real
    documented = doc_table("## `POST /v1/responses`")
    assert sorted(sdk - set(RESPONSES_PARAMETERS) - set(RESPONSES_NOT_YET)) == []
    assert not set(RESPONSES_PARAMETERS) & set(RESPONSES_NOT_YET)
    assert sorted(sdk - set(documented)) == []
    for name, handling in RESPONSES_PARAMETERS.items():
        assert documented.get(name) == handling, name
    for name in RESPONSES_NOT_YET:  # what only the upstream's own /v1/responses can do: api
        expected = "api" if name in API_ONLY else "not yet"
        assert documented.get(name) == ("depends" if name in PARTLY_LOCAL else expected), name


def test_every_embeddings_parameter_is_documented() -> None:
    sdk = set(typing.get_type_hints(embedding_params.EmbeddingCreateParams))
    documented = doc_table("## `POST /v1/embeddings`")
    assert sorted(sdk - set(EMBEDDINGS_PARAMETERS)) == []
    assert documented == EMBEDDINGS_PARAMETERS


@pytest.mark.parametrize("name", sorted(n for n, h in CHAT_PARAMETERS.items() if h == API))
def test_api_only_parameters_send_the_request_to_the_api(name: str) -> None:
    body = {"model": "gpt-4o-mini", "messages": MSG, name: {}}
    assert chat_blocker(body) == name


@pytest.mark.parametrize("name", sorted(n for n, h in CHAT_PARAMETERS.items() if h == IGNORED))
def test_ignored_parameters_keep_the_request_local(name: str) -> None:
    values: dict[str, Any] = {
        "prediction": {"type": "content", "content": "x"},
        "store": True,
        "metadata": {"k": "v"},
        "prompt_cache_options": {"mode": "implicit"},
    }
    value = values.get(name, "x")
    body = chat_request({"model": "gpt-4o-mini", "messages": MSG, name: value})
    assert chat_blocker(body) is None


def test_unknown_parameters_are_400s_naming_them_rather_than_being_forwarded() -> None:
    """Once sent to the API unchanged; now refused as OpenAI itself refuses them."""
    with pytest.raises(BadRequest) as info:
        chat_request({"model": "gpt-4o-mini", "messages": MSG, "top_k": 5})
    assert (info.value.status, info.value.param) == (400, "top_k")
    assert info.value.code == "unknown_parameter"
    with pytest.raises(BadRequest) as legacy:
        completions_request({"model": "m", "prompt": "Hi", "top_k": 5})
    assert legacy.value.param == "top_k"
    with pytest.raises(BadRequest) as embed:
        embeddings_request({"model": "m", "input": "Hi", "top_k": 5})
    assert embed.value.param == "top_k"


@pytest.mark.parametrize(
    ("extra", "blocked"),
    [
        ({"reasoning_effort": "minimal"}, False),
        ({"reasoning_effort": "high"}, True),
        ({"verbosity": "medium"}, False),
        ({"verbosity": "low"}, True),
        ({"modalities": ["text"]}, False),
        ({"modalities": ["text", "audio"]}, True),
        ({"n": 2}, False),
        ({"n": 9}, True),
        ({"logit_bias": {"15": 5}}, True),
        ({"logit_bias": {"15": 5}, "model": "local"}, False),
        ({"tools": [WEATHER], "tool_choice": "required"}, False),
        ({"tools": [{"type": "custom", "custom": {"name": "x"}}]}, True),
        ({"response_format": {"type": "json_object"}}, False),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "text", "text": "what is this?"},
                            {"type": "image_url", "image_url": {"url": "data:image/png;base64,"}},
                        ],
                    }
                ]
            },
            True,
        ),
    ],
)
def test_values_the_local_engine_cannot_honour_go_to_the_api(
    extra: dict[str, Any], blocked: bool
) -> None:
    body = chat_request({"model": "gpt-4o-mini", "messages": MSG, **extra})
    assert (chat_blocker(body) is not None) is blocked


@pytest.mark.parametrize(
    ("extra", "blocked"),
    [
        ({}, False),
        ({"prompt": ["a", "b"], "n": 2}, False),
        ({"prompt": [1, 2, 3]}, True),
        ({"prompt": [1, 2, 3], "model": "local"}, False),
        ({"suffix": "end"}, True),
        ({"best_of": 2}, True),
        ({"echo": True, "logprobs": 1}, True),
        ({"echo": True}, False),
    ],
)
def test_legacy_completions_blockers(extra: dict[str, Any], blocked: bool) -> None:
    body = completions_request({"model": "gpt-3.5-turbo-instruct", "prompt": "Once", **extra})
    assert (completions_blocker(body) is not None) is blocked


def test_live_streaming_only_for_one_text_answer() -> None:
    assert live_streamable({"messages": MSG})
    assert not live_streamable({"messages": MSG, "n": 2})
    assert not live_streamable({"messages": MSG, "tools": [WEATHER]})
    assert live_streamable({"messages": MSG, "tools": [WEATHER], "tool_choice": "none"})


# -- 400s name the parameter -----------------------------------------------------------------


CHAT_400 = [
    ({"temperature": 2.5}, "temperature"),
    ({"top_p": -0.1}, "top_p"),
    ({"n": 0}, "n"),
    ({"n": True}, "n"),
    ({"max_completion_tokens": 0}, "max_completion_tokens"),
    ({"presence_penalty": 3}, "presence_penalty"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"stop": 5}, "stop"),
    ({"seed": "x"}, "seed"),
    ({"logit_bias": {"abc": 1}}, "logit_bias"),
    ({"logit_bias": {"1": 101}}, "logit_bias"),
    ({"logprobs": "yes"}, "logprobs"),
    ({"top_logprobs": 3}, "top_logprobs"),
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"stream_options": {"include_usage": True}}, "stream_options"),
    ({"stream": True, "stream_options": {"include_usage": 1}}, "stream_options.include_usage"),
    ({"response_format": {"type": "xml"}}, "response_format.type"),
    ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
    (
        {"response_format": {"type": "json_schema", "json_schema": {"name": "bad name!"}}},
        "response_format.json_schema.name",
    ),
    (
        {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": "banana"}},
            }
        },
        "response_format.json_schema.schema",
    ),
    ({"tools": "get_weather"}, "tools"),
    ({"tools": [{"type": "function"}]}, "tools[0].function.name"),
    (
        {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": 7}}}]},
        "tools[0].function.parameters",
    ),
    ({"tool_choice": "auto"}, "tool_choice"),
    ({"tools": [WEATHER], "tool_choice": "always"}, "tool_choice"),
    (
        {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
        "tool_choice",
    ),
    ({"parallel_tool_calls": "no"}, "parallel_tool_calls"),
    ({"function_call": "auto"}, "function_call"),
    ({"user": 5}, "user"),
    ({"metadata": {"k": 1}}, "metadata"),
    ({"store": "yes"}, "store"),
    ({"modalities": ["video"]}, "modalities"),
    ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].tool_call_id"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    (
        {"messages": [{"role": "user", "content": [{"type": "text"}]}]},
        "messages[0].content[0].text",
    ),
    (
        {"messages": [{"role": "user", "content": [{"type": "video"}]}]},
        "messages[0].content[0].type",
    ),
    (
        {"messages": [{"role": "assistant", "tool_calls": [{"id": "c", "function": {}}]}]},
        "messages[0].tool_calls[0].function.name",
    ),
    ({"messages": [{"role": "function", "content": "x"}]}, "messages[0].name"),
]


@pytest.mark.parametrize(("extra", "param"), CHAT_400)
def test_invalid_chat_values_are_400s_naming_the_param(extra: dict[str, Any], param: str) -> None:
    with pytest.raises(BadRequest) as info:
        chat_request({"model": "gpt-4o-mini", "messages": MSG, **extra})
    assert info.value.param == param
    assert info.value.status == 400


def test_a_full_featured_valid_request_passes_unchanged() -> None:
    body = {
        "model": "gpt-4o-mini",
        "messages": [
            {"role": "developer", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]},
            *weather_turns("22 C"),
        ],
        "tools": [WEATHER],
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        "parallel_tool_calls": False,
        "temperature": 0.5,
        "top_p": 0.9,
        "max_completion_tokens": 30,
        "stop": ["\n\n"],
        "seed": 7,
        "n": 2,
        "logprobs": True,
        "top_logprobs": 2,
        "stream": True,
        "stream_options": {"include_usage": True},
        "user": "u1",
        "metadata": {"team": "a"},
        "store": False,
    }
    assert chat_request(json.loads(json.dumps(body))) == body
    assert chat_blocker(body) is None


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "m"}, "prompt"),
        ({"model": "m", "prompt": []}, "prompt"),
        ({"model": "m", "prompt": [1, "a"]}, "prompt"),
        ({"model": "m", "prompt": "x", "logprobs": 6}, "logprobs"),
        ({"model": "m", "prompt": "x", "n": 3, "best_of": 2}, "best_of"),
        ({"model": "m", "prompt": "x", "echo": "yes"}, "echo"),
        ({"prompt": "x"}, "model"),
    ],
)
def test_invalid_legacy_completions_are_400s(body: dict[str, Any], param: str) -> None:
    with pytest.raises(BadRequest) as info:
        completions_request(body)
    assert info.value.param == param


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "m"}, "input"),
        ({"model": "m", "input": ""}, "input"),
        ({"model": "m", "input": []}, "input"),
        ({"model": "m", "input": ["a", 1]}, "input"),
        ({"model": "m", "input": "a", "encoding_format": "hex"}, "encoding_format"),
        ({"model": "m", "input": "a", "dimensions": 0}, "dimensions"),
        ({"model": 3, "input": "a"}, "model"),
    ],
)
def test_invalid_embeddings_are_400s(body: dict[str, Any], param: str) -> None:
    with pytest.raises(BadRequest) as info:
        embeddings_request(body)
    assert info.value.param == param


@pytest.mark.parametrize("raw", [b"", b"  ", b"{", b"[1]", b'"x"', b"\xff", b"[" * 100_000])
def test_unparseable_bodies_are_400s(raw: bytes) -> None:
    with pytest.raises(BadRequest) as info:
        parse_json(raw)
    assert info.value.code == "invalid_json"


@pytest.mark.parametrize(
    ("raw", "param"),
    [
        (
            b'{"model": "m", "messages": [{"role": "user", "content": "a \\ud800"}]}',
            "messages[0].content",
        ),
        (
            b'{"model": "m", "input": [{"role": "user", "content": [{"type": "input_text", '
            b'"text": "\\udfff"}]}]}',
            "input[0].content[0].text",
        ),
        (b'{"model": "m", "metadata": {"\\ud83d": "x"}}', "metadata"),
        (b'{"model": "m", "user": "\xed\xa0\x80"}', "user"),  # the UTF-8 form of \ud800
    ],
)
def test_a_lone_surrogate_anywhere_is_a_400_naming_its_field(raw: bytes, param: str) -> None:
    with pytest.raises(BadRequest) as info:
        parse_json(raw)
    assert info.value.param == param
    assert "surrogate" in str(info.value)


def test_an_escaped_surrogate_pair_is_text() -> None:
    body = parse_json(b'{"model": "m", "input": "\\ud83d\\ude00 \\uD7FF"}')
    assert body["input"] == "\U0001f600 \ud7ff"


@pytest.mark.parametrize(
    "name",
    ["user", "safety_identifier", "prompt_cache_key", "prompt_cache_retention", "service_tier"],
)
def test_a_free_text_identifier_past_64_characters_is_openais_400(name: str) -> None:
    body = {"model": "m", "messages": MSG, name: "u" * 64}
    chat_request(body)
    with pytest.raises(BadRequest) as info:
        chat_request({**body, name: "u" * 65})
    assert (info.value.param, info.value.code) == (name, "string_above_max_length")
    assert "maximum length 64, but got a string with length 65" in str(info.value)


def test_a_message_name_past_64_characters_is_a_400_naming_it() -> None:
    message = {"role": "user", "content": "hi", "name": "n" * 64}
    chat_request({"model": "m", "messages": [message]})
    with pytest.raises(BadRequest) as info:
        chat_request({"model": "m", "messages": [{**message, "name": "n" * 65}]})
    assert info.value.param == "messages[0].name"


# -- grammars and the tool prompt ------------------------------------------------------------


def test_grammar_for_a_schema_and_for_a_required_tool_call() -> None:
    fmt = {
        "type": "json_schema",
        "json_schema": {
            "name": "cat",
            "schema": {"type": "object", "properties": {"age": {"type": "integer"}}},
        },
    }
    gbnf = grammar.gbnf_for({"messages": MSG, "response_format": fmt})
    assert gbnf is not None and "root ::=" in gbnf and "age" in gbnf
    call = grammar.gbnf_for({"messages": MSG, "tools": [WEATHER], "tool_choice": "required"})
    assert call is not None and '\\"get_weather\\"' in call and "text ::=" not in call
    auto = grammar.gbnf_for({"messages": MSG, "tools": [WEATHER]})
    assert auto is not None and "root ::= calls | text" in auto  # one call or several
    one = grammar.gbnf_for({"messages": MSG, "tools": [WEATHER], "parallel_tool_calls": False})
    assert one is not None and "root ::= call | text" in one
    assert grammar.gbnf_for({"messages": MSG}) is None
    assert grammar.gbnf_for({"messages": MSG, "tools": [WEATHER], "tool_choice": "none"}) is None


def test_a_schema_the_converter_cannot_express_goes_to_the_api() -> None:
    fmt = {
        "type": "json_schema",
        "json_schema": {"name": "x", "schema": {"$ref": "https://example.com/schema.json"}},
    }
    body = chat_request({"model": "gpt-4o-mini", "messages": MSG, "response_format": fmt})
    blocker = chat_blocker(body)
    assert blocker is not None and blocker.startswith("a schema the local grammar cannot")


def test_tool_history_is_templated_as_plain_turns() -> None:
    request = {
        "messages": [
            {"role": "user", "content": "Weather in Paris?"},
            *weather_turns("22 C and sunny", arguments='{"city":"Paris"}'),
        ],
        "tools": [WEATHER],
    }
    messages = tools.prompt_messages(request)
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user"]
    assert "get_weather" in messages[0]["content"] and "plain text" in messages[0]["content"]
    assert json.loads(messages[2]["content"]) == {
        "name": "get_weather",
        "arguments": {"city": "Paris"},
    }
    assert messages[3]["content"].startswith("Result of get_weather (call call_1):")
    assert "22 C and sunny" in messages[3]["content"]


def test_generated_call_text_becomes_an_openai_tool_call() -> None:
    plan = tools.call_plan({"tools": [WEATHER], "tool_choice": "required"})
    assert plan is not None and not plan.optional
    message, is_call = tools.to_message(
        '{"name": "get_weather", "arguments": {"city": "Rome"}}', plan
    )
    assert is_call and message["content"] is None
    [call] = message["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert json.loads(call["function"]["arguments"]) == {"city": "Rome"}
    text, is_call = tools.to_message("It is sunny.", plan)
    assert not is_call and text["content"] == "It is sunny."
    legacy = tools.call_plan({"functions": [WEATHER["function"]], "function_call": "auto"})
    message, _ = tools.to_message('{"name": "get_weather", "arguments": {}}', legacy)
    assert message["function_call"] == {"name": "get_weather", "arguments": "{}"}


@pytest.mark.parametrize(
    ("message", "param"),
    [
        ({"role": {}, "content": "x"}, "messages[0].role"),
        ({"role": ["user"], "content": "x"}, "messages[0].role"),
        ({"role": "user", "content": [{"type": {}}]}, "messages[0].content[0].type"),
        ({"role": "user", "content": [{"type": ["text"]}]}, "messages[0].content[0].type"),
    ],
)
def test_unhashable_values_are_400s_not_crashes(message: dict[str, Any], param: str) -> None:
    """Found by schemathesis: a dict where a string belongs once raised TypeError (a 500)."""
    with pytest.raises(BadRequest) as info:
        chat_request({"model": "m", "messages": [message]})
    assert info.value.param == param


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "string", "maxLength": 100_000_000},
        {"type": "array", "items": {"type": "integer"}, "minItems": 5000},
        {"type": "string", "pattern": "^a{1,100000}$"},
    ],
)
def test_schemas_that_would_make_a_huge_grammar_go_to_the_api(schema: dict[str, Any]) -> None:
    """The converter spells repetitions out; an unbounded one would eat the proxy's memory."""
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    body = chat_request({"model": "gpt-4o-mini", "messages": MSG, "response_format": fmt})
    blocker = chat_blocker(body)
    assert blocker is not None
    assert "above 512" in blocker or "more than 512" in blocker
