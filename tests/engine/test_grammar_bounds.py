"""Schemas whose grammar would be huge are refused before llama.cpp's converter builds anything.

The bombs run in a fresh interpreter, which reports its peak RSS before and after: the converter
would write each repetition out in full (gigabytes), so a growth under 50 MB shows it never ran.
"""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from proxy.engine import grammar, grammar_size
from proxy.routing.servable import local_blocker
from tests.conftest import fresh_python

MSG = [{"role": "user", "content": "Answer in JSON."}]
BOMB_PATTERNS = [
    "^a{,300000000}$",
    "^a{+300000000}$",
    "^a{3_000_000_000}$",
    "^a{ 1000000 }$",
    "^a{1000000,}$",
    "^a{0, 1_000_000}$",
    "^(a{1000}){1000}$",
    "^((ab){600})$",
    "^[a-z]{ +99999 }x$",
    "^" + "(a{512})" * 400 + "$",  # each repetition allowed, their sum not
]
BOMB_SCHEMAS: list[dict[str, Any]] = [
    *({"type": "string", "pattern": p} for p in BOMB_PATTERNS),
    {"type": "string", "maxLength": 3_000_000_000},
    {"type": "array", "items": {"type": "integer"}, "maxItems": 1e9},
    # each bound is small, but rule names grow with the nesting and are copied into the rules
    {
        "type": "object",
        "properties": {
            "p" * 30_000: {
                "type": "object",
                "properties": {
                    "q" * 30_000: {"type": "array", "items": {"type": "string"}, "maxItems": 500}
                },
            }
        },
    },
]


def response_format(schema: Any) -> dict[str, Any]:
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}
    return {"messages": MSG, "response_format": fmt}


def tool_call(schema: Any, choice: str = "required") -> dict[str, Any]:
    params = {"type": "object", "properties": {"value": schema}, "required": ["value"]}
    tool = {"type": "function", "function": {"name": "record", "parameters": params}}
    return {"messages": MSG, "tools": [tool], "tool_choice": choice}


def bodies(schema: Any) -> list[dict[str, Any]]:
    return [response_format(schema), tool_call(schema), tool_call(schema, "auto")]


_PROBE = """
import json, resource, sys
from proxy.engine.grammar import grammar_blocker
grammar_blocker({"messages": [], "response_format": {"type": "json_object"}})  # imports llama_cpp
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
reasons = [grammar_blocker(body) for body in json.loads(sys.stdin.read())]
grew = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
print(json.dumps({"reasons": reasons, "grew_mb": grew}))
"""


def run_fresh(requests: list[dict[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = json.loads(fresh_python(_PROBE, requests))
    return result


def test_repetition_bombs_are_refused_without_building_anything() -> None:
    requests = [body for schema in BOMB_SCHEMAS for body in bodies(schema)]
    result = run_fresh(requests)
    for body, reason in zip(requests, result["reasons"], strict=True):
        assert reason is not None, json.dumps(body)[:200]
        assert reason.startswith("a schema the local grammar cannot express")
    assert result["grew_mb"] < 50


@pytest.mark.parametrize("pattern", ["^a}$", "^a]$", "^(a}b)$"])
def test_patterns_the_converter_would_loop_on_are_refused(pattern: str) -> None:
    result = run_fresh(bodies({"type": "string", "pattern": pattern}))
    assert all(r is not None and "unexpected" in r for r in result["reasons"])


def test_quantifiers_are_read_as_the_converter_reads_them() -> None:
    assert grammar_size.quantifier(" +12 ") == (12, 12)
    assert grammar_size.quantifier("1_0") == (10, 10)
    assert grammar_size.quantifier(",7") == (0, 7)
    assert grammar_size.quantifier("3,") == (3, None)
    assert grammar_size.quantifier(" 2 , 5 ") == (2, 5)
    for bad in ("", "a", "1,2,3", "0x10"):
        with pytest.raises(grammar_size.Refused):
            grammar_size.quantifier(bad)


def test_an_oversized_schema_sends_the_request_to_the_api_as_unsupported() -> None:
    body = response_format({"type": "string", "pattern": "^a{+300000000}$"})
    reason = local_blocker(body)
    assert reason is not None and "repeats something more than 512 times" in reason


def test_pattern_properties_are_not_converted_so_their_bounds_cost_nothing() -> None:
    schema = {"type": "object", "patternProperties": {"^a{,300000000}$": {"type": "string"}}}
    result = run_fresh(bodies(schema))
    assert result["reasons"] == [None, None, None]
    assert result["grew_mb"] < 50


EVERYDAY: list[dict[str, Any]] = [
    {"type": "string", "pattern": r"^\d{4}-\d{2}-\d{2}$"},
    {"type": "string", "pattern": r'^(a"b){3,9}(\.|x)+[^"\]]{,20}$'},
    {"type": "string", "pattern": "^(ab{500}){500}$"},
    {"type": "string", "minLength": 2, "maxLength": 512},
    {"type": "array", "items": {"type": "string", "maxLength": 40}, "minItems": 1, "maxItems": 60},
    {
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "tags": {"type": "array", "items": {"enum": ["a", 'b"c', 3]}},
            "where": {"anyOf": [{"type": "string", "format": "date"}, {"type": "number"}]},
        },
        "required": ["name"],
    },
    {"allOf": [{"properties": {"a": {"type": "integer"}}}, {"properties": {"b": {}}}]},
]


REFS = {
    "type": "object",
    "properties": {"at": {"$ref": "#/$defs/point"}, "to": {"$ref": "#/$defs/point"}},
    "$defs": {"point": {"type": "object", "properties": {"x": {"type": "number"}}}},
}


@pytest.mark.parametrize(
    ("schema", "requests"),
    [*((s, bodies(s)) for s in EVERYDAY), (REFS, [response_format(REFS)])],
    ids=lambda s: json.dumps(s)[:40],
)
def test_everyday_schemas_build_and_the_bound_holds_over_them(
    schema: dict[str, Any], requests: list[dict[str, Any]]
) -> None:
    for body in requests:
        assert grammar.grammar_blocker(body) is None
        spec = grammar.spec_for(body)
        assert spec is not None
        text = grammar.gbnf_for(body)
        assert text is not None
        sizer = grammar_size.Sizer()
        sizer.spec(json.loads(spec))
        assert len(text) <= sizer.chars
        assert text.count("\n") + 1 <= sizer.rules


def _random_pattern(rng: random.Random, depth: int = 0) -> str:
    units = ["a", "bc", '"', r"\d", r"\.", ".", "[a-z]", r'[^"\]]', "x", "|"]
    out = ""
    for _ in range(rng.randint(1, 5)):
        if rng.random() < 0.2 and depth < 3:
            out += "(" + _random_pattern(rng, depth + 1) + ")"
        else:
            out += rng.choice(units)
        if out[-1] != "|" and rng.random() < 0.4:
            low = rng.randint(0, 30)
            out += rng.choice(
                [
                    f"{{{low}}}",
                    f"{{{low},{low + rng.randint(0, 30)}}}",
                    f"{{,{low}}}",
                    f"{{{low},}}",
                ]
                + ["*", "+", "?"]
            )
    return out


def _random_schema(rng: random.Random, depth: int = 0) -> dict[str, Any]:
    r = rng.random()
    if r < 0.25 and depth < 3:
        props = {
            "k" * rng.randint(1, 30) + str(i): _random_schema(rng, depth + 1) for i in range(4)
        }
        required = [k for k in props if rng.random() < 0.5]
        return {"type": "object", "properties": props, "required": required}
    if r < 0.4 and depth < 3:
        low = rng.randint(0, 5)
        item = _random_schema(rng, depth + 1)
        return {
            "type": "array",
            "items": item,
            "minItems": low,
            "maxItems": low + rng.randint(0, 40),
        }
    if r < 0.6:
        return {"type": "string", "pattern": "^" + _random_pattern(rng) + "$"}
    if r < 0.7:
        return {"type": "string", "minLength": rng.randint(0, 10), "maxLength": rng.randint(10, 99)}
    if r < 0.8 and depth < 3:
        return {"anyOf": [_random_schema(rng, depth + 1), _random_schema(rng, depth + 1)]}
    if r < 0.9:
        return {"enum": ['a"b', "c\n", 3]}
    return {"type": rng.choice(["integer", "number", "boolean", "string"])}


def test_the_bound_is_never_below_what_the_converter_writes() -> None:
    rng = random.Random(15)
    checked = 0
    for _ in range(300):
        schema = _random_schema(rng)
        for body in (response_format(schema), tool_call(schema, "auto")):
            spec = grammar.spec_for(body)
            assert spec is not None
            sizer = grammar_size.Sizer()
            try:
                sizer.spec(json.loads(spec))
                text = grammar.gbnf_for(body)
            except (grammar_size.Refused, grammar.GrammarError):
                continue
            assert text is not None
            assert len(text) <= sizer.chars, spec
            assert text.count("\n") + 1 <= sizer.rules, spec
            checked += 1
    assert checked > 400


def test_planning_never_runs_the_converter(monkeypatch: pytest.MonkeyPatch) -> None:
    """grammar_blocker runs on the event loop: it sizes the grammar and leaves the build (the
    converter) to the worker process."""

    def no_converter() -> None:
        raise AssertionError("the converter ran on the proxy's side")

    monkeypatch.setattr(grammar, "_converter", no_converter)
    grammar._sized.cache_clear()
    schema = {"type": "object", "properties": {"name": {"type": "string", "pattern": "^[a-z]{3}$"}}}
    body = {
        "messages": [{"role": "user", "content": "x"}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": schema}},
    }
    assert local_blocker(body) is None
    assert local_blocker({**body, "response_format": {"type": "json_object"}}) is None
    bomb = {"type": "string", "pattern": "^a{,300000000}$"}
    bombed = {
        **body,
        "response_format": {"type": "json_schema", "json_schema": {"name": "b", "schema": bomb}},
    }
    assert local_blocker(bombed) is not None
