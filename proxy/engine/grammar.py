"""llama.cpp grammars (GBNF) that make structured answers valid by construction.

    response_format json_object   ->  any JSON object
    response_format json_schema   ->  JSON fitting the schema (llama.cpp's schema converter)
    tools, a call required        ->  {"name": <one of the tools>, "arguments": <its schema>}
    tools, tool_choice "auto"     ->  such a call, or text that does not start with "{"

The text is pure Python (``llama_cpp.llama_grammar`` converts schemas without touching a model),
so the proxy can check at planning time that a schema converts, and the worker builds the same
text again (cached) to constrain sampling. A schema the converter cannot handle sends the request
to the API; keywords it ignores (``not``, ``if``...) make the grammar looser than the schema, and
the quality gate's schema check catches what slips through.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from typing import Any

from proxy.engine.tools import call_plan

ANY_CHAR = r"[\x00-\U0010FFFF]"
# A text answer (when a tool call is optional) may not begin with "{", which starts a call, nor
# with white space, so that "  {" cannot sneak an unconstrained object past the call grammar.
TEXT_RULE = r"[^{ \t\r\n] " + ANY_CHAR + "*"
JSON_OBJECT_SCHEMA: dict[str, Any] = {"type": "object"}
# The converter spells out bounded repetitions, so a grammar grows with the bounds in a schema:
# larger ones (``"maxLength": 100000000`` would take gigabytes) go to the API instead.
MAX_BOUND = 512
MAX_GRAMMAR_CHARS = 256 * 1024
BOUNDS = ("minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties")
QUANTIFIER = re.compile(r"\{\s*(\d+)\s*(?:,\s*(\d*)\s*)?\}")


class GrammarError(Exception):
    """A schema the grammar converter cannot turn into GBNF."""


def _converter() -> Any:
    from llama_cpp import llama_grammar

    converter: Any = llama_grammar.SchemaConverter
    return converter(
        prop_order={"name": 0, "arguments": 1}, allow_fetch=False, dotall=False, raw_pattern=False
    )


def _check_bounds(node: Any, depth: int = 0) -> None:
    """Refuse schemas whose repetition bounds would make the grammar huge."""
    if depth > 64:
        raise GrammarError("the schema is nested too deeply")
    if isinstance(node, list):
        for item in node:
            _check_bounds(item, depth + 1)
        return
    if not isinstance(node, dict):
        return
    for key, value in node.items():
        if key in BOUNDS and isinstance(value, int | float) and value > MAX_BOUND:
            raise GrammarError(f"{key} {value} is above {MAX_BOUND}")
        if key == "pattern" and isinstance(value, str):
            for low, high in QUANTIFIER.findall(value):
                if int(low) > MAX_BOUND or (high and int(high) > MAX_BOUND):
                    raise GrammarError(f"a pattern repeats more than {MAX_BOUND} times")
        _check_bounds(value, depth + 1)


@lru_cache(maxsize=128)
def _build(spec: str) -> str:
    """GBNF text for a canonical JSON ``spec``: {"json": schema|None, "calls": [...], "auto": b}."""
    data = json.loads(spec)
    _check_bounds(data)
    conv = _converter()
    try:
        calls = data.get("calls")
        if calls:
            options = [
                {
                    "type": "object",
                    "properties": {
                        "name": {"const": name},
                        "arguments": params if params else {"type": "object"},
                    },
                    "required": ["name", "arguments"],
                    "additionalProperties": False,
                }
                for name, params in calls
            ]
            call_schema = options[0] if len(options) == 1 else {"oneOf": options}
            call_schema = conv.resolve_refs(call_schema, "tools")
            call_rule = conv.visit(call_schema, "call")
            if not data.get("auto"):
                conv._add_rule("root", call_rule)
            elif data.get("json") is not None:
                answer = conv.visit(conv.resolve_refs(data["json"], "response"), "answer")
                conv._add_rule("root", f"{call_rule} | {answer}")
            else:
                conv._add_rule("text", TEXT_RULE)
                conv._add_rule("root", f"{call_rule} | text")
        else:
            conv.visit(conv.resolve_refs(data["json"], "response"), "")
        text = str(conv.format_grammar())
    except GrammarError:
        raise
    except Exception as exc:  # the converter raises bare exceptions on what it cannot do
        raise GrammarError(f"{type(exc).__name__}: {exc}") from exc
    if len(text) > MAX_GRAMMAR_CHARS:
        raise GrammarError(f"the grammar would take {len(text)} characters")
    return text


def spec_for(request: dict[str, Any]) -> str | None:
    """The canonical grammar spec a request needs, or None for free text."""
    json_schema: Any = None
    fmt = request.get("response_format")
    if isinstance(fmt, dict):
        if fmt.get("type") == "json_object":
            json_schema = JSON_OBJECT_SCHEMA
        elif fmt.get("type") == "json_schema":
            spec = fmt.get("json_schema") or {}
            json_schema = spec.get("schema")
            if json_schema is None or json_schema is True or json_schema == {}:
                json_schema = JSON_OBJECT_SCHEMA
    plan = call_plan(request)
    if plan is None:
        if json_schema is None:
            return None
        return json.dumps({"json": json_schema}, sort_keys=True)
    calls = [[name, params] for name, params in plan.functions]
    return json.dumps({"json": json_schema, "calls": calls, "auto": plan.optional}, sort_keys=True)


def gbnf_for(request: dict[str, Any]) -> str | None:
    """GBNF text for a request, None when it needs none; raises GrammarError."""
    spec = spec_for(request)
    return None if spec is None else _build(spec)


def grammar_blocker(request: dict[str, Any]) -> str | None:
    """Why no grammar can be built for this request (so the API must answer it), or None."""
    try:
        gbnf_for(request)
    except GrammarError as exc:
        return f"a schema the local grammar cannot express ({exc})"
    return None
