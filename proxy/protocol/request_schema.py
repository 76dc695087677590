"""The OpenAPI request schemas, generated from the tables of :mod:`proxy.protocol.params`.

Nothing here is written twice: a scalar row becomes ``{"type", "minimum", "maximum", "enum",
"maxLength"}``, a nested row its fragment from :mod:`proxy.protocol.shapes`, an optional one
``anyOf [..., null]``, each with the row's ``doc``; the :class:`proxy.protocol.params.Rule` rows
become ``if``/``then`` clauses. ``additionalProperties: false`` is the allow-list. What a schema
cannot say (a named ``tool_choice`` must be one of the ``tools``, a ``json_schema`` must be a
valid JSON Schema, ``best_of`` at least ``n``) is in the request's description.
"""

from __future__ import annotations

from proxy.protocol import responses_shapes
from proxy.protocol.params import (
    CHAT,
    CHAT_RULES,
    COMPLETIONS,
    COMPLETIONS_RULES,
    EMBEDDINGS,
    Param,
    Rule,
)
from proxy.protocol.responses_params import RESPONSES
from proxy.protocol.shapes import SHAPES, Schema

__all__ = [
    "CHAT_REQUEST",
    "COMPLETIONS_REQUEST",
    "EMBEDDINGS_REQUEST",
    "RESPONSES_REQUEST",
    "request_schema",
]

NULL: Schema = {"type": "null"}
ALL_SHAPES: dict[str, Schema] = {**SHAPES, **responses_shapes.SHAPES}


def _value(param: Param) -> Schema:
    if param.shape is not None:
        return ALL_SHAPES[param.shape]
    schema: Schema = {"type": param.type if isinstance(param.type, str) else list(param.type)}
    if param.low is not None:
        schema["minimum"] = param.low
    if param.high is not None:
        schema["maximum"] = param.high
    if param.enum:
        schema["enum"] = list(param.enum)
    if param.max_chars is not None:
        schema["maxLength"] = param.max_chars
    return schema


def _property(param: Param) -> Schema:
    schema = _value(param)
    if not param.required:
        if list(schema) == ["anyOf"]:
            schema = {"anyOf": [*schema["anyOf"], NULL]}
        else:
            schema = {"anyOf": [schema, NULL]}
    return {**schema, "description": param.doc}


def _present(name: str, schema: Schema) -> Schema:
    return {"required": [name], "properties": {name: schema}}


def _clause(rule: Rule, table: dict[str, Param]) -> Schema:
    """``rule.name`` set (not null) needs ``rule.other`` true or non-empty, or forbids it."""
    other = table[rule.other]
    when = _present(rule.name, {"not": NULL})
    if other.type == "boolean":
        if not rule.needs:
            raise ValueError(f"{rule}: 'excludes' is written for arrays only")
        return {"if": when, "then": _present(rule.other, {"const": True})}
    if other.type != "array":
        raise ValueError(f"{rule}: the other field must be a boolean or an array")
    if rule.needs:
        return {"if": when, "then": _present(rule.other, {"type": "array", "minItems": 1})}
    empty = {"anyOf": [NULL, {"type": "array", "maxItems": 0}]}
    return {"if": when, "then": {"properties": {rule.other: empty}}}


def request_schema(table: tuple[Param, ...], rules: tuple[Rule, ...], doc: str) -> Schema:
    """The JSON Schema of one endpoint's request body."""
    by_name = {p.name: p for p in table}
    schema: Schema = {
        "type": "object",
        "required": [p.name for p in table if p.required],
        "properties": {p.name: _property(p) for p in table},
        "additionalProperties": False,
        "description": doc,
    }
    if rules:
        schema["allOf"] = [_clause(rule, by_name) for rule in rules]
    return schema


CHAT_REQUEST = request_schema(
    CHAT,
    CHAT_RULES,
    "OpenAI's chat-completions request. A parameter not listed here is a 400 naming it (routing "
    "and credential fields such as base_url included). A named tool_choice (or function_call) "
    "must name one of the tools (functions); a schema must be a valid JSON Schema.",
)
COMPLETIONS_REQUEST = request_schema(
    COMPLETIONS,
    COMPLETIONS_RULES,
    "OpenAI's legacy completions request. best_of must be at least n, and above 1 it cannot be "
    "streamed.",
)
EMBEDDINGS_REQUEST = request_schema(
    EMBEDDINGS, (), "OpenAI's embeddings request, passed through to the API."
)
RESPONSES_REQUEST = request_schema(
    RESPONSES,
    (),
    "OpenAI's Responses request, answered through the chat cascade. A parameter not listed here "
    "is a 400 naming it; OpenAI's parameters that are not served yet (conversation, "
    "reasoning, background, ...) are a 400 saying so, as are built-in tools and image parts.",
)
