"""The OpenAPI request schemas and the validator read one description: the tables of
proxy.protocol.params.

These fail when a parameter is in a table but missing from the served OpenAPI document (or the
other way round), when a nested row names a shape without a fragment or without a check, and when
the validator and the document disagree about a scalar value: every row's bounds, types and enums
are tried on both, the document through a real JSON-Schema validator (``jsonschema``).
"""

from __future__ import annotations

from typing import Any

import pytest
from jsonschema import Draft202012Validator

from proxy.errors import BadRequest
from proxy.protocol import responses_shapes, shapes
from proxy.protocol.params import (
    CHAT,
    CHAT_RULES,
    COMPLETIONS,
    COMPLETIONS_RULES,
    EMBEDDINGS,
    HONOURED,
    Param,
    Rule,
)
from proxy.protocol.request_schema import ALL_SHAPES
from proxy.protocol.responses_params import RESPONSES
from proxy.protocol.validate import (
    CHECKS,
    chat_request,
    completions_request,
    embeddings_request,
    responses_request,
)
from proxy.server.routes import openapi_spec

MSG = [{"role": "user", "content": "hi"}]
ENDPOINTS: list[tuple[str, tuple[Param, ...], tuple[Rule, ...], Any, dict[str, Any]]] = [
    ("ChatCompletionRequest", CHAT, CHAT_RULES, chat_request, {"model": "m", "messages": MSG}),
    (
        "CompletionRequest",
        COMPLETIONS,
        COMPLETIONS_RULES,
        completions_request,
        {"model": "m", "prompt": "x"},
    ),
    ("EmbeddingsRequest", EMBEDDINGS, (), embeddings_request, {"model": "m", "input": "x"}),
    ("ResponsesRequest", RESPONSES, (), responses_request, {"model": "m", "input": "x"}),
]
TABLES = (CHAT, COMPLETIONS, EMBEDDINGS, RESPONSES)
IDS = [e[0] for e in ENDPOINTS]


def served_schema(name: str) -> dict[str, Any]:
    schema: dict[str, Any] = openapi_spec()["components"]["schemas"][name]
    return schema


def fits(name: str, body: dict[str, Any]) -> bool:
    return Draft202012Validator(served_schema(name)).is_valid(body)


def accepted(validate: Any, body: dict[str, Any]) -> bool:
    try:
        validate(body)
    except BadRequest:
        return False
    return True


@pytest.mark.parametrize(("name", "table", "rules", "validate", "base"), ENDPOINTS, ids=IDS)
def test_the_served_document_lists_exactly_the_tables_parameters(
    name: str, table: tuple[Param, ...], rules: tuple[Rule, ...], validate: Any, base: Any
) -> None:
    schema = served_schema(name)
    assert list(schema["properties"]) == [p.name for p in table]
    assert schema["required"] == [p.name for p in table if p.required]
    assert schema["additionalProperties"] is False
    for param in table:
        assert schema["properties"][param.name]["description"] == param.doc, param.name
    clauses = schema.get("allOf", [])
    assert [c["if"]["required"] for c in clauses] == [[r.name] for r in rules]


def test_every_shape_a_table_names_has_one_fragment_and_one_check() -> None:
    named = {p.shape for table in TABLES for p in table if p.shape}
    assert not set(shapes.SHAPES) & set(responses_shapes.SHAPES)
    assert named == set(ALL_SHAPES) == set(CHECKS)


def _fragment_types(schema: dict[str, Any]) -> set[str]:
    if "anyOf" in schema:
        return set().union(*(_fragment_types(s) for s in schema["anyOf"]))
    assert "type" in schema, schema
    return {schema["type"]}


@pytest.mark.parametrize(
    "param",
    [p for table in TABLES for p in table if p.shape],
    ids=lambda p: p.name,
)
def test_a_nested_row_says_the_json_types_its_fragment_allows(param: Param) -> None:
    declared = {param.type} if isinstance(param.type, str) else set(param.type)
    assert _fragment_types(ALL_SHAPES[str(param.shape)]) == declared


def _samples(param: Param) -> list[Any]:
    """Values around a scalar row's edges, of its type and of others."""
    values: list[Any] = ["x", True, 1, 1.5, [], {}]
    if param.enum:
        values += [*param.enum, param.enum[0].upper()]
    for edge in (param.low, param.high):
        if edge is not None:
            values += [edge, edge - 1, edge + 1, edge - 0.5, edge + 0.5]
    # JSON Schema counts 2.0 as an integer; the proxy, stricter, does not: leave those out.
    return [v for v in values if not (isinstance(v, float) and v.is_integer())]


SCALARS = [
    (name, validate, base, p)
    for name, table, _rules, validate, base in ENDPOINTS
    for p in table
    if p.shape is None
]


@pytest.mark.parametrize(
    ("name", "validate", "base", "param"), SCALARS, ids=[f"{s[0]}.{s[3].name}" for s in SCALARS]
)
def test_the_validator_and_the_document_agree_on_every_scalar_row(
    name: str, validate: Any, base: dict[str, Any], param: Param
) -> None:
    companions = {"top_logprobs": {"logprobs": True}}.get(param.name, {})
    agreed = 0
    for value in _samples(param):
        body = {**base, **companions, param.name: value}
        ours = accepted(validate, dict(body))
        assert ours == fits(name, body), (param.name, value)
        agreed += ours
    assert agreed >= 1  # at least one value is valid, or the samples prove nothing


def test_a_rule_holds_in_both() -> None:
    body = {"model": "m", "messages": MSG, "top_logprobs": 2}
    assert not fits("ChatCompletionRequest", body)
    with pytest.raises(BadRequest) as info:
        chat_request(body)
    assert info.value.param == "top_logprobs"
    body["logprobs"] = True
    assert fits("ChatCompletionRequest", body) and chat_request(body) is body


def test_the_handling_of_every_row_is_one_of_the_four() -> None:
    for table in TABLES:
        for param in table:
            assert param.handling in (HONOURED, "ignored", "depends", "api"), param.name
            assert param.doc.strip(), param.name


@pytest.mark.parametrize(
    "extra",
    [
        {"input": []},
        {"input": [{"role": "user"}]},
        {"input": [{"role": "user", "content": "hi", "status": 3}]},
        {"input": [{"type": "function_call", "call_id": "c", "name": "f"}]},
        {"input": [{"type": "function_call_output", "call_id": "c", "output": 1}]},
        {"tools": [{"type": "function", "name": "f", "description": 1}]},
        {"tools": [{"type": "function", "name": "f f"}]},
        {"tool_choice": {"type": "function"}},
        {"tool_choice": {"type": "function", "name": {}}, "tools": []},
        {"tools": [{"type": {}, "name": "f"}]},
        {"input": [{"type": [], "role": "user", "content": "hi"}]},
        {"input": [{"role": "user", "content": [{"type": {}, "text": "hi"}]}]},
        {"text": {"format": {"type": "json_schema", "name": "x"}}},
        {"text": {"format": {"type": "json_schema", "name": "x", "schema": {}, "strict": 1}}},
        {"text": {"verbosity": "loud"}},
        {"stream_options": {"include_obfuscation": "yes"}},
        {"include": [1]},
    ],
)
def test_a_responses_body_the_document_refuses_the_validator_refuses(
    extra: dict[str, Any],
) -> None:
    body = {"model": "m", "input": "x", **extra}
    assert not fits("ResponsesRequest", body)
    assert not accepted(responses_request, body)


def test_a_full_responses_body_fits_both() -> None:
    body = {
        "model": "m",
        "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "hi"}]},
            {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}", "id": None},
            {"type": "function_call_output", "call_id": "c", "output": "ok"},
        ],
        "tools": [{"type": "function", "name": "f", "parameters": None, "description": None}],
        "tool_choice": {"type": "function", "name": "f"},
        "text": {"format": None, "verbosity": None},
    }
    assert fits("ResponsesRequest", body) and accepted(responses_request, body)
