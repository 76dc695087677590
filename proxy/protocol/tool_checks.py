"""Hand-written checks of the tool and structured-answer shapes of :mod:`proxy.protocol.shapes`.

``response_format``, ``tools``, ``functions``, ``tool_choice`` and ``function_call``: the same
contract as :mod:`proxy.protocol.shape_checks` (value and whole body in, :class:`BadRequest` naming
the field out), with the limits and enums read from :mod:`proxy.protocol.shapes`. A JSON Schema in
the request (a tool's ``parameters``, ``response_format.json_schema.schema``) is checked by
:func:`quality.check_schema`.
"""

from __future__ import annotations

from typing import Any

from proxy.errors import BadRequest
from proxy.protocol import shapes as s
from proxy.protocol.check_progress import note_field
from proxy.protocol.shape_checks import Check, boolean, function_or_custom, objects, string

# -- structured answers --------------------------------------------------------------


def _json_schema(schema: Any, where: str) -> None:
    from quality import check_schema

    note_field(where)  # a check past its time names this field (proxy/server/body_check.py)
    problem = check_schema(schema)
    if problem is not None:
        raise BadRequest(f"'{where}' is not a valid JSON Schema: {problem}", param=where)


def _name(holder: dict[str, Any], where: str) -> None:
    name = holder.get("name")
    if not isinstance(name, str) or not s.NAME.fullmatch(name):
        raise BadRequest(
            f"'{where}.name' must be 1 to 64 letters, digits, '_' or '-'", param=f"{where}.name"
        )


def _response_format(fmt: Any, _body: dict[str, Any]) -> None:
    if not isinstance(fmt, dict) or fmt.get("type") not in s.RESPONSE_FORMATS:
        raise BadRequest(
            f"'response_format.type' must be one of {', '.join(s.RESPONSE_FORMATS)}",
            param="response_format.type",
        )
    if fmt["type"] != "json_schema":
        return
    spec = fmt.get("json_schema")
    if not isinstance(spec, dict):
        raise BadRequest(
            "'response_format.json_schema' is required when the type is json_schema",
            param="response_format.json_schema",
        )
    _name(spec, "response_format.json_schema")
    boolean(spec, "strict", "response_format.json_schema.strict")
    string(spec, "description", "response_format.json_schema.description")
    if spec.get("schema") is not None:
        _json_schema(spec["schema"], "response_format.json_schema.schema")


def _function(fn: Any, where: str) -> None:
    if not isinstance(fn, dict):
        raise BadRequest(f"'{where}' must be an object", param=where)
    _name(fn, where)
    string(fn, "description", f"{where}.description")
    boolean(fn, "strict", f"{where}.strict")
    params = fn.get("parameters")
    if params is not None:
        if not isinstance(params, dict):
            raise BadRequest(
                f"'{where}.parameters' must be a JSON Schema object", param=f"{where}.parameters"
            )
        _json_schema(params, f"{where}.parameters")


def _tools(tools: Any, _body: dict[str, Any]) -> None:
    if not isinstance(tools, list):
        raise BadRequest("'tools' must be a list", param="tools")
    for where, tool in objects(tools, "tools"):
        if not function_or_custom(tool, where):
            continue
        if tool.get("function") is None:
            raise BadRequest(f"'{where}.function.name' is required", param=f"{where}.function.name")
        _function(tool["function"], f"{where}.function")


def _functions(functions: Any, _body: dict[str, Any]) -> None:
    if not isinstance(functions, list) or not functions:
        raise BadRequest("'functions' must be a non-empty list", param="functions")
    for i, fn in enumerate(functions):
        _function(fn, f"functions[{i}]")


def _tool_choice(choice: Any, body: dict[str, Any]) -> None:
    """Runs after :func:`_tools` (the table's order), so ``body['tools']`` is checked."""
    if isinstance(choice, str):
        if choice not in s.TOOL_CHOICES:
            raise BadRequest(
                f"'tool_choice' must be one of {', '.join(s.TOOL_CHOICES)} or an object, "
                f"got {choice!r}",
                param="tool_choice",
            )
        return
    if not isinstance(choice, dict):
        raise BadRequest("'tool_choice' must be a string or an object", param="tool_choice")
    choice_type = choice.get("type")
    if choice_type == "function":
        fn = choice.get("function")
        name = fn.get("name") if isinstance(fn, dict) else None
        if not isinstance(name, str):
            raise BadRequest(
                "'tool_choice.function.name' is required", param="tool_choice.function"
            )
        names = {
            t["function"]["name"]
            for t in body.get("tools") or ()
            if t.get("type", "function") == "function"
        }
        if name not in names:
            raise BadRequest(
                f"'tool_choice' names the function {name!r}, which is not in 'tools'",
                param="tool_choice",
            )
    elif choice_type == "allowed_tools":
        allowed = choice.get("allowed_tools")
        if (
            not isinstance(allowed, dict)
            or allowed.get("mode") not in ("auto", "required")
            or not isinstance(allowed.get("tools"), list)
        ):
            raise BadRequest(
                "'tool_choice.allowed_tools' needs a mode (auto or required) and a list of tools",
                param="tool_choice.allowed_tools",
            )
    elif choice_type != "custom":
        raise BadRequest(
            "'tool_choice.type' must be function, allowed_tools or custom",
            param="tool_choice.type",
        )


def _function_call(call: Any, body: dict[str, Any]) -> None:
    """Runs after :func:`_functions` (the table's order), so ``body['functions']`` is checked."""
    if isinstance(call, str):
        if call not in s.FUNCTION_CALLS:
            raise BadRequest(
                f"'function_call' must be {', '.join(s.FUNCTION_CALLS)} or an object, got {call!r}",
                param="function_call",
            )
    elif not isinstance(call, dict) or not isinstance(call.get("name"), str):
        raise BadRequest("'function_call' must have a 'name'", param="function_call")
    elif call["name"] not in {f["name"] for f in body["functions"]}:
        raise BadRequest(
            f"'function_call' names {call['name']!r}, which is not in 'functions'",
            param="function_call",
        )


CHECKS: dict[str, Check] = {
    "response_format": _response_format,
    "tools": _tools,
    "functions": _functions,
    "tool_choice": _tool_choice,
    "function_call": _function_call,
}
