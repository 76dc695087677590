"""Client regexes in schemas are matched in linear time, and one that can't be matched fails.

Each ReDoS case below would run for hours under Python's ``re`` (2**40 ways to split the text);
the timeout marker only keeps a regression from hanging the suite.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from quality import score
from quality._view import view_of
from quality.format import format_compliance
from quality.schema import check_schema, validate
from tests.quality.test_quality_signals import completion, json_schema_format, request

REDOS = r"^(a|a)+$"
EVIL = "a" * 40 + "!"
DRAFT_2020 = "https://json-schema.org/draft/2020-12/schema"

pytestmark = pytest.mark.timeout(60)


def test_a_redos_pattern_is_settled_and_the_answer_fails_it() -> None:
    schema = {"type": "string", "pattern": REDOS}
    assert validate(EVIL, schema) is False
    assert validate("aaaa", schema) is True


@pytest.mark.parametrize(
    ("instance", "schema"),
    [
        ({"aaa": 1}, {"type": "object", "patternProperties": {REDOS: {"type": "string"}}}),
        (
            {EVIL: 1},
            {"type": "object", "patternProperties": {REDOS: {}}, "additionalProperties": False},
        ),
        ({EVIL: 1}, {"type": "object", "propertyNames": {"pattern": REDOS}}),
        ({"x": [EVIL] * 50}, {"properties": {"x": {"items": {"pattern": REDOS}}}}),
        (
            {"x": EVIL},
            {"properties": {"x": {"$ref": "#/$defs/s"}}, "$defs": {"s": {"pattern": REDOS}}},
        ),
    ],
)
def test_redos_patterns_anywhere_in_the_schema_fail_the_check(
    instance: dict[str, Any], schema: dict[str, Any]
) -> None:
    assert validate(instance, schema) is False


def test_pattern_properties_still_select_the_keys_they_match() -> None:
    schema = {
        "type": "object",
        "patternProperties": {r"^n_\d+$": {"type": "integer"}},
        "additionalProperties": False,
    }
    assert validate({"n_1": 1, "n_22": 2}, schema) is True
    assert validate({"n_1": "one"}, schema) is False
    assert validate({"other": 1}, schema) is False
    free = {"type": "object", "patternProperties": {r"^n_": {"type": "integer"}}}
    assert validate({"other": "x", "n_1": 2}, free) is True
    redos = {"type": "object", "patternProperties": {REDOS: {"type": "string"}}}
    assert validate({EVIL: 1}, redos) is True  # settled: the key does not match, so no rule


def test_everyday_patterns_match_as_before() -> None:
    email = {"type": "string", "pattern": r"^[a-zA-Z0-9._%+-]+@[a-zA-Z0-9.-]+\.[a-zA-Z]{2,}$"}
    assert validate("ada@example.org", email) is True
    assert validate("ada at example", email) is False
    assert validate("call 555-0100 now", {"type": "string", "pattern": r"\d{3}-\d{4}"}) is True


@pytest.mark.parametrize(
    "pattern",
    [
        r"^(?=.*\d).+$",  # lookahead: RE2 has none
        r"^(\w)\1$",  # backreference
        r"^((a{100}){100}){100}$",  # repeats more than RE2 compiles
    ],
)
def test_a_pattern_that_cannot_be_matched_safely_fails_instead_of_passing(pattern: str) -> None:
    assert validate("a1", {"type": "string", "pattern": pattern}) is False
    props = {"type": "object", "patternProperties": {pattern: {"type": "integer"}}}
    assert validate({"a1": 1}, props) is False


def test_unevaluated_properties_next_to_pattern_properties_fails_the_check() -> None:
    schema = {
        "$schema": DRAFT_2020,
        "type": "object",
        "patternProperties": {REDOS: {}},
        "unevaluatedProperties": False,
    }
    assert validate({EVIL: 1}, schema) is False
    plain = {"$schema": DRAFT_2020, "properties": {"a": {}}, "unevaluatedProperties": False}
    assert validate({"a": 1}, plain) is True
    assert validate({"b": 1}, plain) is False


def test_a_redos_schema_makes_the_scorer_flag_the_answer() -> None:
    schema = {
        "type": "object",
        "properties": {"code": {"type": "string", "pattern": REDOS}},
        "required": ["code"],
    }
    req = request("A code, as JSON.", response_format=json_schema_format(schema))
    content = json.dumps({"code": EVIL})
    assert format_compliance(view_of(req, completion(content))).hard == ("schema_mismatch",)
    assert "schema_mismatch" in score(req, completion(content)).reasons
    tools = [
        {
            "type": "function",
            "function": {
                "name": "lookup",
                "parameters": {"type": "object", "patternProperties": {REDOS: {"type": "string"}}},
            },
        }
    ]
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "lookup", "arguments": json.dumps({"aaaa": 5})},
    }
    view = view_of(request("Look it up.", tools=tools), completion(None, tool_calls=[call]))
    assert format_compliance(view).hard == ("tool_args_mismatch",)


def test_text_or_a_pattern_re2_cannot_take_fails_the_check() -> None:
    # A schema that is not UTF-8 never reaches the scorer: the request is refused with a 400.
    assert "lone surrogate" in (check_schema({"type": "string", "pattern": "\ud800"}) or "")
    assert validate("x", {"type": "string", "pattern": "\ud800"}) is None
    assert validate("\ud800", {"type": "string", "pattern": "^a"}) is False
    schema = {"type": "object", "patternProperties": {"^a": {}}, "additionalProperties": False}
    assert validate({"\ud800": 1}, schema) is False
