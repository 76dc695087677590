"""Format compliance for structured requests: JSON modes and tool calls.

Failures here are hard: a client that asked for JSON (or a call to one of its tools) and gets
something its parser rejects is worse off than with the API, which would have kept the format.

- ``response_format`` ``json_object``: the content must parse as a JSON object.
- ``response_format`` ``json_schema``: it must also validate against the schema.
- ``tools``: every call must name a tool that exists, with arguments that parse and validate
  against its ``parameters``; ``tool_choice`` ``required`` (or a named function) needs a call.
  Several calls in one answer are each checked so; ``parallel_tool_calls: false`` allows one.
  A call cut off by ``max_tokens`` (calls with ``finish_reason: "length"``) is ``tool_call_cut``:
  it is not a call a client can run, even where its arguments happen to parse.
"""

from __future__ import annotations

import json
from typing import Any

from quality import schema as schema_mod
from quality._types import Signal
from quality._view import View

_NAME = "format"


def _response_format_failures(view: View) -> list[str]:
    rf = view.response_format
    if rf is None or view.tool_calls:
        return []
    kind = rf.get("type")
    if kind not in ("json_object", "json_schema"):
        return []
    try:
        data = json.loads(view.content)
    except ValueError:
        return ["json_invalid"]
    if kind == "json_object":
        return [] if isinstance(data, dict) else ["json_invalid"]
    spec = rf.get("json_schema")
    schema = spec.get("schema") if isinstance(spec, dict) else None
    if schema is None:
        return []
    valid = schema_mod.validate(data, schema)
    return ["schema_mismatch"] if valid is False else []


def _tool_failures(view: View) -> list[str]:
    if not view.tools and not view.tool_calls:
        return []
    params: dict[str, Any] = {}
    for tool in view.tools:
        function = tool.get("function")
        if isinstance(function, dict) and isinstance(function.get("name"), str):
            params[function["name"]] = function.get("parameters")
    failures: list[str] = []
    choice = view.tool_choice
    if not view.tool_calls:
        if choice == "required" or (isinstance(choice, dict) and choice.get("type") == "function"):
            failures.append("tool_missing")
        return failures
    if choice == "none" or not view.tools:
        return ["tool_unexpected"]
    if view.finish_reason == "length":
        failures.append("tool_call_cut")
    if len(view.tool_calls) > 1 and not view.parallel_tool_calls:
        failures.append("tool_parallel")
    for call in view.tool_calls:
        if call.name not in params:
            failures.append("tool_unknown")
            continue
        try:
            arguments = json.loads(call.arguments) if call.arguments.strip() else {}
        except ValueError:
            failures.append("tool_args_invalid")
            continue
        schema = params[call.name]
        if schema is not None and schema_mod.validate(arguments, schema) is False:
            failures.append("tool_args_mismatch")
    return list(dict.fromkeys(failures))


def format_compliance(view: View) -> Signal:
    if view.response_format is None and not view.tools and not view.tool_calls:
        return Signal(_NAME, applied=False)
    hard = _response_format_failures(view) + _tool_failures(view)
    return Signal(_NAME, applied=True, features={}, hard=tuple(hard))
