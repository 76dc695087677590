"""The nested values of a ``/v1/responses`` request: their OpenAPI fragments and their checks.

The rows of :data:`proxy.protocol.responses_params.RESPONSES` name these shapes, as the chat rows
name those of :mod:`proxy.protocol.shapes` (whose fragments and checks are built the same way):
:data:`SHAPES` goes into the OpenAPI document (:mod:`proxy.protocol.request_schema`), :data:`CHECKS`
into the validator (:mod:`proxy.protocol.validate`). Every failure is a :class:`BadRequest` whose
``param`` names the field in OpenAI's style (``input[2].content[0].text``).

What the local model and Chat Completions cannot do (image and file parts, built-in tools,
reasoning items) is a 400 with code ``unsupported_parameter`` that says so,
never an unknown field. With ``[fallback] responses = "responses"`` (the default) the handler
(:mod:`proxy.serving.responses`) takes those out before these checks and sends the request to the
upstream's own ``/v1/responses`` instead. An item reference never reaches these checks: the
handler puts the stored item it names in its place first (:mod:`proxy.serving.responses_state`).
"""

from __future__ import annotations

from typing import Any

from proxy.errors import BadRequest
from proxy.protocol.shape_checks import Check, kind, obj, objects, one_of, string
from proxy.protocol.shapes import NAME, NAME_PATTERN, TOOL_CHOICES, Schema
from proxy.protocol.shapes import obj as schema_obj

ROLES = frozenset({"user", "system", "developer", "assistant"})
TEXT_PARTS = frozenset({"input_text", "output_text"})
LATER_PARTS = frozenset({"input_image", "input_file", "input_audio"})  # not served yet
ITEMS = frozenset({"message", "function_call", "function_call_output"})
LATER_ITEMS = frozenset(
    {
        "reasoning",
        "item_reference",
        "compaction",  # only the API that made it can read it: always sent there
        "file_search_call",
        "web_search_call",
        "computer_call",
        "computer_call_output",
        "image_generation_call",
        "code_interpreter_call",
        "local_shell_call",
        "local_shell_call_output",
        "mcp_call",
        "mcp_list_tools",
        "mcp_approval_request",
        "mcp_approval_response",
        "custom_tool_call",
        "custom_tool_call_output",
        "shell_call",
        "shell_call_output",
        "apply_patch_call",
        "apply_patch_call_output",
        "tool_search_call",
        "tool_search_output",
        "additional_tools",
        "configuration_update",
        "compaction_trigger",
        "program",
        "program_output",
    }
)
LATER_TOOLS = frozenset(
    {
        "web_search",
        "web_search_preview",
        "web_search_2025_08_26",
        "web_search_preview_2025_03_11",
        "file_search",
        "computer_use_preview",
        "code_interpreter",
        "image_generation",
        "mcp",
        "local_shell",
        "custom",
        # the types a coding agent (Codex CLI) sends: its tools run on the client, but the
        # local model cannot call them
        "computer",
        "shell",
        "apply_patch",
        "namespace",
        "tool_search",
        "programmatic_tool_calling",
    }
)
"""Every built-in (not ``function``) tool type of the openai SDK's ``ToolParam``: sent to the
upstream's own ``/v1/responses`` with reason ``unsupported``."""
TOOLS = frozenset({"function"}) | LATER_TOOLS
FORMATS = ("text", "json_object", "json_schema")
VERBOSITIES = ("low", "medium", "high")


def asks(value: Any) -> bool:
    """Whether a parameter's value asks for anything: not null, and not an object whose every
    member is null (``reasoning: {}``, which Codex CLI sends when it wants no reasoning
    summary, asks for nothing the local model lacks). With ``[fallback] responses =
    "translate"`` any ``reasoning`` stays a 400, as before."""
    if isinstance(value, dict):
        return any(member is not None for member in value.values())
    return value is not None


def not_yet(what: str, where: str) -> BadRequest:
    """The 400 of something OpenAI serves and this proxy does not yet."""
    return BadRequest(
        f"{what} ('{where}') is not supported yet by the proxy's /v1/responses",
        param=where,
        code="unsupported_parameter",
    )


# -- fragments ---------------------------------------------------------------------------------

_STRING: Schema = {"type": "string"}
_OPTIONAL_STRING: Schema = {"type": ["string", "null"]}
_TEXT_PART: Schema = schema_obj(
    ["type", "text"], {"type": {"enum": sorted(TEXT_PARTS)}, "text": _STRING}
)
_REFUSAL_PART: Schema = schema_obj(
    ["type", "refusal"], {"type": {"const": "refusal"}, "refusal": _STRING}
)
_MESSAGE: Schema = schema_obj(
    ["role", "content"],
    {
        "type": {"const": "message"},
        "role": {"enum": sorted(ROLES)},
        "content": {
            "anyOf": [
                _STRING,
                {"type": "array", "items": {"anyOf": [_TEXT_PART, _REFUSAL_PART]}},
            ]
        },
        "id": _OPTIONAL_STRING,
        "status": _OPTIONAL_STRING,
    },
)
_FUNCTION_CALL: Schema = schema_obj(
    ["type", "call_id", "name", "arguments"],
    {
        "type": {"const": "function_call"},
        "call_id": _STRING,
        "name": _STRING,
        "arguments": {"type": "string", "description": "JSON text"},
        "id": _OPTIONAL_STRING,
        "status": _OPTIONAL_STRING,
    },
)
_FUNCTION_OUTPUT: Schema = schema_obj(
    ["type", "call_id", "output"],
    {
        "type": {"const": "function_call_output"},
        "call_id": _STRING,
        "output": {"anyOf": [_STRING, {"type": "array", "items": _TEXT_PART}]},
        "id": _OPTIONAL_STRING,
        "status": _OPTIONAL_STRING,
    },
)
SHAPES: dict[str, Schema] = {
    "responses_input": {
        "anyOf": [
            _STRING,
            {
                "type": "array",
                "minItems": 1,
                "items": {"anyOf": [_MESSAGE, _FUNCTION_CALL, _FUNCTION_OUTPUT]},
            },
        ],
        "description": "Image, file and audio parts, and built-in tool or reasoning items, go "
        "to the API's own /v1/responses (a 400 with [fallback] responses = translate).",
    },
    "responses_tools": {
        "type": "array",
        "items": {
            "anyOf": [
                schema_obj(
                    ["type", "name"],
                    {
                        "type": {"const": "function"},
                        "name": {"type": "string", "pattern": f"^{NAME_PATTERN}$"},
                        "description": _OPTIONAL_STRING,
                        "parameters": {
                            "type": ["object", "null"],
                            "description": "A JSON Schema.",
                        },
                        "strict": {"type": ["boolean", "null"]},
                    },
                ),
                {
                    "type": "object",
                    "required": ["type"],
                    "properties": {"type": {"enum": sorted(LATER_TOOLS)}},
                    "description": "A built-in tool: the request goes to the API's own "
                    "/v1/responses (a 400 with [fallback] responses = translate).",
                },
            ]
        },
    },
    "responses_tool_choice": {
        "anyOf": [
            {"type": "string", "enum": list(TOOL_CHOICES)},
            schema_obj(["type", "name"], {"type": {"const": "function"}, "name": _STRING}),
        ]
    },
    "responses_text": {
        "type": "object",
        "properties": {
            "format": {
                "anyOf": [
                    schema_obj(["type"], {"type": {"enum": ["text", "json_object"]}}),
                    schema_obj(
                        ["type", "name", "schema"],
                        {
                            "type": {"const": "json_schema"},
                            "name": {"type": "string", "pattern": f"^{NAME_PATTERN}$"},
                            "schema": {"type": "object", "description": "A JSON Schema."},
                            "description": _OPTIONAL_STRING,
                            "strict": {"type": ["boolean", "null"]},
                        },
                    ),
                    {"type": "null"},
                ]
            },
            "verbosity": {"anyOf": [{"enum": list(VERBOSITIES)}, {"type": "null"}]},
        },
    },
    "responses_stream_options": {
        "type": "object",
        "properties": {"include_obfuscation": {"type": "boolean"}},
    },
    "responses_include": {"type": "array", "items": _STRING},
}


# -- checks ------------------------------------------------------------------------------------


def _text(value: Any, where: str) -> None:
    if not isinstance(value, str):
        raise BadRequest(f"'{where}' must be a string, got {kind(value)}", param=where)


def _parts(parts: list[Any], where: str, *, refusal: bool) -> None:
    for at, part in objects(parts, where):
        part_type = part.get("type")
        if isinstance(part_type, str) and part_type in LATER_PARTS:
            raise not_yet(f"a '{part_type}' part", f"{at}.type")
        if refusal and part_type == "refusal":
            _text(part.get("refusal"), f"{at}.refusal")
            continue
        one_of(part_type, TEXT_PARTS | ({"refusal"} if refusal else set()), f"{at}.type")
        _text(part.get("text"), f"{at}.text")


def _message(item: dict[str, Any], at: str) -> None:
    role = one_of(item.get("role"), ROLES, f"{at}.role")
    content = item.get("content")
    if isinstance(content, list):
        _parts(content, f"{at}.content", refusal=role == "assistant")
    elif not isinstance(content, str):
        raise BadRequest(
            f"'{at}.content' must be a string or an array of parts, got {kind(content)}",
            param=f"{at}.content",
        )


def _function_call(item: dict[str, Any], at: str) -> None:
    for name in ("call_id", "name", "arguments"):
        _text(item.get(name), f"{at}.{name}")


def _function_output(item: dict[str, Any], at: str) -> None:
    _text(item.get("call_id"), f"{at}.call_id")
    output = item.get("output")
    if isinstance(output, list):
        _parts(output, f"{at}.output", refusal=False)
    else:
        _text(output, f"{at}.output")


def _input(value: Any, _body: dict[str, Any]) -> None:
    if isinstance(value, str):
        return
    if not isinstance(value, list) or not value:
        raise BadRequest("'input' must be a string or a non-empty array of items", param="input")
    for at, item in objects(value, "input"):
        string(item, "id", f"{at}.id")
        string(item, "status", f"{at}.status")
        item_type = item.get("type", "message")
        if isinstance(item_type, str) and item_type in LATER_ITEMS:
            raise not_yet(f"a '{item_type}' item", f"{at}.type")
        one_of(item_type, ITEMS | LATER_ITEMS, f"{at}.type")
        if item_type == "message":
            _message(item, at)
        elif item_type == "function_call":
            _function_call(item, at)
        else:
            _function_output(item, at)


def _tools(value: Any, _body: dict[str, Any]) -> None:
    if not isinstance(value, list):
        raise BadRequest(f"'tools' must be an array, got {kind(value)}", param="tools")
    for at, tool in objects(value, "tools"):
        tool_type = tool.get("type")
        if isinstance(tool_type, str) and tool_type in LATER_TOOLS:
            raise not_yet(f"the built-in tool '{tool_type}'", f"{at}.type")
        one_of(tool_type, TOOLS, f"{at}.type")  # an unknown type: the 400 lists them all
        name = tool.get("name")
        if not isinstance(name, str) or not NAME.fullmatch(name):
            raise BadRequest(
                f"'{at}.name' must be 1 to 64 of a-z, A-Z, 0-9, _ and -", param=f"{at}.name"
            )
        string(tool, "description", f"{at}.description")
        if tool.get("parameters") is not None:
            obj(tool["parameters"], f"{at}.parameters")
        strict = tool.get("strict")
        if strict is not None and not isinstance(strict, bool):
            raise BadRequest(f"'{at}.strict' must be true or false", param=f"{at}.strict")


def _tool_choice(value: Any, body: dict[str, Any]) -> None:
    if isinstance(value, str):
        one_of(value, frozenset(TOOL_CHOICES), "tool_choice")
        if value == "required" and not body.get("tools"):
            raise BadRequest(
                "'tool_choice' is 'required' but no tools are given", param="tool_choice"
            )
        return
    choice = obj(value, "tool_choice")
    if choice.get("type") != "function":
        raise not_yet(f"a tool_choice of type {choice.get('type')!r}", "tool_choice.type")
    names = {t.get("name") for t in body.get("tools") or [] if isinstance(t, dict)}
    name = choice.get("name")
    if not isinstance(name, str) or name not in names:  # a dict or a list is unhashable
        raise BadRequest(
            "'tool_choice.name' must name one of the function tools", param="tool_choice.name"
        )


def _text_config(value: Any, _body: dict[str, Any]) -> None:
    text = obj(value, "text")
    for key in text:
        if key not in ("format", "verbosity"):
            raise BadRequest(f"Unrecognized argument supplied: text.{key}", param=f"text.{key}")
    if text.get("verbosity") is not None:
        one_of(text["verbosity"], frozenset(VERBOSITIES), "text.verbosity")
    if text.get("format") is None:
        return
    fmt = obj(text["format"], "text.format")
    if one_of(fmt.get("type"), frozenset(FORMATS), "text.format.type") != "json_schema":
        return
    name = fmt.get("name")
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise BadRequest(
            "'text.format.name' must be 1 to 64 of a-z, A-Z, 0-9, _ and -",
            param="text.format.name",
        )
    obj(fmt.get("schema"), "text.format.schema")
    string(fmt, "description", "text.format.description")
    if fmt.get("strict") is not None and not isinstance(fmt["strict"], bool):
        raise BadRequest("'text.format.strict' must be true or false", param="text.format.strict")


def _stream_options(value: Any, _body: dict[str, Any]) -> None:
    options = obj(value, "stream_options")
    for key, flag in options.items():
        if key != "include_obfuscation":
            raise BadRequest(
                f"Unrecognized argument supplied: stream_options.{key}",
                param=f"stream_options.{key}",
            )
        if not isinstance(flag, bool):
            raise BadRequest(
                "'stream_options.include_obfuscation' must be true or false",
                param="stream_options.include_obfuscation",
            )


def _include(value: Any, _body: dict[str, Any]) -> None:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise BadRequest("'include' must be an array of strings", param="include")


CHECKS: dict[str, Check] = {
    "responses_input": _input,
    "responses_tools": _tools,
    "responses_tool_choice": _tool_choice,
    "responses_text": _text_config,
    "responses_stream_options": _stream_options,
    "responses_include": _include,
}
