"""The nested request values, described once: a JSON-Schema fragment per shape (data).

A row of :mod:`proxy.protocol.params` whose value is nested (``messages``, ``tools``,
``response_format``, ``stop``...) names its shape; :data:`SHAPES` maps that name to the fragment
that :mod:`proxy.protocol.request_schema` puts in the OpenAPI document, and
:mod:`proxy.protocol.shape_checks` checks the value by hand (in plain Python, fast, with ``param``
paths such as ``messages[2].role``), reading its limits and its enums from the constants below,
which the fragments are built from. A rule between two fields is a
:class:`proxy.protocol.params.Rule`, not here.

A fragment says neither ``null`` nor a description: the generator adds both from the row.
"""

from __future__ import annotations

import re
from typing import Any

Schema = dict[str, Any]

# -- the limits and enums both sides read ------------------------------------------------------

MAX_MODEL_CHARS = 256
MAX_STOP = 4
NAME_PATTERN = "[a-zA-Z0-9_-]{1,64}"  # a function's or a JSON schema's name
NAME = re.compile(NAME_PATTERN)
TOKEN_ID_PATTERN = "[0-9]{1,9}"  # a logit_bias key
TOKEN_ID = re.compile(TOKEN_ID_PATTERN)
BIAS_LOW, BIAS_HIGH = -100, 100

CONTENT_ROLES = ("system", "developer", "user")
ROLES = frozenset({*CONTENT_ROLES, "assistant", "tool", "function"})
TEXT_PARTS = ("text", "input_text")
OTHER_PARTS = ("input_audio", "file")  # parts checked for their type only
PART_TYPES = frozenset({*TEXT_PARTS, "refusal", "image_url", *OTHER_PARTS})

STREAM_OPTIONS_KEYS = ("include_usage", "include_obfuscation")
RESPONSE_FORMATS = ("text", "json_object", "json_schema")
TOOL_CHOICES = ("none", "auto", "required")
FUNCTION_CALLS = ("none", "auto")
MODALITIES = ("text", "audio")
METADATA_KEYS, METADATA_KEY_CHARS, METADATA_VALUE_CHARS = 16, 64, 512
# Codex CLI's client_metadata carries its turn's metadata as one JSON string of about 750
# characters: OpenAI's API takes it, so its values get more room than metadata's 512.
CLIENT_METADATA_VALUE_CHARS = 4096
MESSAGE_NAME_CHARS = 64  # a message's participant name: a short identifier, as a function's


def _string_map(value_chars: int) -> Schema:
    return {
        "type": "object",
        "maxProperties": METADATA_KEYS,
        "propertyNames": {"maxLength": METADATA_KEY_CHARS},
        "additionalProperties": {"type": "string", "maxLength": value_chars},
    }


STRING_MAP = _string_map(METADATA_VALUE_CHARS)


def _whole(pattern: str) -> str:
    return f"^{pattern}$"


def _nullable(schema: Schema) -> Schema:
    return {"anyOf": [schema, {"type": "null"}]}


def obj(required: list[str], properties: Schema) -> Schema:
    """An object with these ``required`` keys and ``properties``."""
    return {"type": "object", "required": required, "properties": properties}


# -- fragments ---------------------------------------------------------------------------------

TOKEN_IDS: Schema = {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 0}}

# No control characters or line breaks (the check uses str.isprintable: stricter).
_CONTROL = "\\u0000-\\u001f\\u007f-\\u009f\\u2028\\u2029"
MODEL: Schema = {
    "type": "string",
    "minLength": 1,
    "maxLength": MAX_MODEL_CHARS,
    "pattern": f"^[^{_CONTROL}]*[^{_CONTROL}\\s][^{_CONTROL}]*$",
}

PARTS: Schema = {
    "type": "array",
    "items": {
        "anyOf": [
            obj(["type", "text"], {"type": {"enum": list(TEXT_PARTS)}, "text": {"type": "string"}}),
            obj(["type", "refusal"], {"type": {"const": "refusal"}, "refusal": {"type": "string"}}),
            obj(
                ["type", "image_url"],
                {
                    "type": {"const": "image_url"},
                    "image_url": obj(
                        ["url"], {"url": {"type": "string"}, "detail": {"type": "string"}}
                    ),
                },
            ),
            obj(["type"], {"type": {"enum": list(OTHER_PARTS)}}),
        ]
    },
    "description": "Text parts are answered locally; image, audio and file parts go to the API.",
}
CONTENT: Schema = {"anyOf": [{"type": "string"}, PARTS]}

TOOL_CALL: Schema = obj(
    ["id", "type", "function"],
    {
        "id": {"type": "string"},
        "type": {"const": "function"},
        "function": obj(
            ["name", "arguments"],
            {
                "name": {"type": "string"},
                "arguments": {"type": "string", "description": "JSON text"},
            },
        ),
    },
)


def _message(roles: list[str], required: list[str], extra: Schema | None = None) -> Schema:
    properties: Schema = {
        "role": {"enum": roles},
        "content": CONTENT if "content" in required else _nullable(CONTENT),
        "name": {"type": "string", "maxLength": MESSAGE_NAME_CHARS},
        **(extra or {}),
    }
    return obj(required, properties)


MESSAGE: Schema = {
    "anyOf": [
        _message(list(CONTENT_ROLES), ["role", "content"]),
        _message(
            ["assistant"],
            ["role"],  # an assistant turn may carry only tool calls, a refusal or audio
            {
                "tool_calls": {"type": "array", "items": TOOL_CALL},
                "function_call": obj(
                    ["name"], {"name": {"type": "string"}, "arguments": {"type": "string"}}
                ),
                "refusal": _nullable({"type": "string"}),
            },
        ),
        _message(
            ["tool"], ["role", "content", "tool_call_id"], {"tool_call_id": {"type": "string"}}
        ),
        _message(["function"], ["role", "content", "name"]),
    ]
}

FUNCTION: Schema = obj(
    ["name"],
    {
        "name": {"type": "string", "pattern": _whole(NAME_PATTERN)},
        "description": {"type": "string"},
        "parameters": {
            "type": "object",
            "description": "A JSON Schema for the arguments; an invalid schema is a 400.",
        },
        "strict": _nullable({"type": "boolean"}),
    },
)

RESPONSE_FORMAT: Schema = {
    "anyOf": [
        obj(["type"], {"type": {"enum": [f for f in RESPONSE_FORMATS if f != "json_schema"]}}),
        obj(
            ["type", "json_schema"],
            {
                "type": {"const": "json_schema"},
                "json_schema": obj(
                    ["name"],
                    {
                        "name": {"type": "string", "pattern": _whole(NAME_PATTERN)},
                        "description": {"type": "string"},
                        "schema": {
                            "type": "object",
                            "description": "A JSON Schema; an invalid one is a 400 naming "
                            "response_format.json_schema.schema.",
                        },
                        "strict": _nullable({"type": "boolean"}),
                    },
                ),
            },
        ),
    ]
}

NAMED: Schema = obj(["name"], {"name": {"type": "string"}})

SHAPES: dict[str, Schema] = {
    "model": MODEL,
    "messages": {"type": "array", "minItems": 1, "items": MESSAGE},
    "stop": {
        "anyOf": [
            {"type": "string"},
            {"type": "array", "items": {"type": "string"}, "maxItems": MAX_STOP},
        ]
    },
    "stream_options": {
        "type": "object",
        "properties": {key: {"type": "boolean"} for key in STREAM_OPTIONS_KEYS},
    },
    "logit_bias": {
        "type": "object",
        "propertyNames": {"pattern": _whole(TOKEN_ID_PATTERN)},
        "additionalProperties": {"type": "number", "minimum": BIAS_LOW, "maximum": BIAS_HIGH},
    },
    "response_format": RESPONSE_FORMAT,
    "tools": {
        "type": "array",
        "items": obj(["type", "function"], {"type": {"const": "function"}, "function": FUNCTION}),
    },
    "functions": {"type": "array", "minItems": 1, "items": FUNCTION},
    "tool_choice": {
        "anyOf": [
            {"type": "string", "enum": list(TOOL_CHOICES)},
            obj(["type", "function"], {"type": {"const": "function"}, "function": NAMED}),
        ]
    },
    "function_call": {"anyOf": [{"type": "string", "enum": list(FUNCTION_CALLS)}, NAMED]},
    "modalities": {"type": "array", "items": {"enum": list(MODALITIES)}},
    "metadata": STRING_MAP,
    "client_metadata": _string_map(CLIENT_METADATA_VALUE_CHARS),
    "prompt": {
        "anyOf": [
            {"type": "string"},
            {"type": "array", "minItems": 1, "items": {"type": "string"}},
            TOKEN_IDS,
            {"type": "array", "minItems": 1, "items": TOKEN_IDS},
        ]
    },
    "input": {
        "anyOf": [
            {"type": "string", "minLength": 1},
            {"type": "array", "minItems": 1, "items": {"type": "string", "minLength": 1}},
            TOKEN_IDS,
            {"type": "array", "minItems": 1, "items": TOKEN_IDS},
        ]
    },
}
