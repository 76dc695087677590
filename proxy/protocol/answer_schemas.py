"""The JSON Schemas of OpenAI's answers as the proxy sends them: a chat completion, a text
completion, embeddings, a ``response`` object and what its routes read back, the model list, and
the error shape. The OpenAPI document (:mod:`proxy.server.openapi.document`) puts them in its
components; :func:`ref` is how a path names one.
"""

from __future__ import annotations

from proxy.protocol.shapes import TOOL_CALL, Schema, obj


def ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


USAGE: Schema = obj(
    ["prompt_tokens", "total_tokens"],
    {
        "prompt_tokens": {"type": "integer"},
        "completion_tokens": {"type": "integer"},
        "total_tokens": {"type": "integer"},
    },
)


def _completion(object_: str, choice_required: list[str], choice: Schema) -> Schema:
    """A completion: OpenAI's envelope (id, object, created, model, usage) around its choices."""
    return obj(
        ["id", "object", "created", "model", "choices"],
        {
            "id": {"type": "string"},
            "object": {"const": object_},
            "created": {"type": "integer"},
            "model": {"type": "string"},
            "choices": {"type": "array", "items": obj(choice_required, choice)},
            "usage": USAGE,
        },
    )


def _list(
    item_required: list[str], item: Schema, also_required: tuple[str, ...] = (), **also: Schema
) -> Schema:
    """A ``{"object": "list", "data": [...]}`` answer, each item as given, and ``also`` beside."""
    return obj(
        ["object", "data", *also_required],
        {
            "object": {"const": "list"},
            "data": {"type": "array", "items": obj(item_required, item)},
            **also,
        },
    )


CHAT_COMPLETION: Schema = _completion(
    "chat.completion",
    ["index", "message", "finish_reason"],
    {
        "index": {"type": "integer"},
        "message": obj(
            ["role"],
            {
                "role": {"const": "assistant"},
                "content": {"type": ["string", "null"]},
                "tool_calls": {"type": "array", "items": TOOL_CALL},
            },
        ),
        "logprobs": {"type": ["object", "null"]},
        "finish_reason": {"type": ["string", "null"]},
    },
)

TEXT_COMPLETION: Schema = _completion(
    "text_completion",
    ["text", "index", "finish_reason"],
    {
        "text": {"type": "string"},
        "index": {"type": "integer"},
        "logprobs": {"type": ["object", "null"]},
        "finish_reason": {"type": ["string", "null"]},
    },
)

EMBEDDINGS: Schema = _list(
    ["object", "index", "embedding"],
    {
        "object": {"const": "embedding"},
        "index": {"type": "integer"},
        "embedding": {
            "anyOf": [
                {"type": "array", "items": {"type": "number"}},
                {"type": "string"},
            ]
        },
    },
    ("model",),
    model={"type": "string"},
    usage=USAGE,
)

_RESPONSE_ITEM: Schema = {
    "anyOf": [
        obj(
            ["id", "type", "status", "role", "content"],
            {
                "id": {"type": "string"},
                "type": {"const": "message"},
                "status": {"enum": ["completed", "incomplete"]},
                "role": {"const": "assistant"},
                "content": {
                    "type": "array",
                    "items": obj(
                        ["type"],
                        {
                            "type": {"enum": ["output_text", "refusal"]},
                            "text": {"type": "string"},
                            "refusal": {"type": "string"},
                        },
                    ),
                },
            },
        ),
        obj(
            ["id", "type", "call_id", "name", "arguments"],
            {
                "id": {"type": "string"},
                "type": {"const": "function_call"},
                "status": {"type": "string"},
                "call_id": {"type": "string"},
                "name": {"type": "string"},
                "arguments": {"type": "string", "description": "JSON text"},
            },
        ),
    ]
}

RESPONSE: Schema = obj(
    ["id", "object", "created_at", "status", "model", "output", "usage"],
    {
        "id": {
            "type": "string",
            "description": "resp_...; with `store` it can be fetched, continued and deleted.",
        },
        "object": {"const": "response"},
        "created_at": {"type": "integer"},
        "status": {
            "enum": ["completed", "incomplete", "failed", "queued", "in_progress", "cancelled"],
            "description": "queued, in_progress and cancelled: a background response's.",
        },
        "background": {"type": "boolean"},
        "incomplete_details": {
            "anyOf": [obj(["reason"], {"reason": {"type": "string"}}), {"type": "null"}]
        },
        "model": {"type": "string"},
        "output": {"type": "array", "items": _RESPONSE_ITEM},
        "previous_response_id": {"type": ["string", "null"]},
        "store": {"type": "boolean", "description": "Whether it was stored."},
        "usage": {
            "anyOf": [
                obj(
                    ["input_tokens", "output_tokens", "total_tokens"],
                    {
                        "input_tokens": {"type": "integer"},
                        "input_tokens_details": obj(
                            ["cached_tokens"], {"cached_tokens": {"type": "integer"}}
                        ),
                        "output_tokens": {"type": "integer"},
                        "output_tokens_details": obj(
                            ["reasoning_tokens"], {"reasoning_tokens": {"type": "integer"}}
                        ),
                        "total_tokens": {"type": "integer"},
                    },
                ),
                {"type": "null", "description": "A background response not answered yet."},
            ]
        },
    },
)

RESPONSE_DELETED: Schema = obj(
    ["id", "object", "deleted"],
    {"id": {"type": "string"}, "object": {"const": "response"}, "deleted": {"const": True}},
)

INPUT_ITEMS: Schema = obj(
    ["object", "data", "first_id", "last_id", "has_more"],
    {
        "object": {"const": "list"},
        "data": {
            "type": "array",
            "items": obj(["id", "type"], {"id": {"type": "string"}, "type": {"type": "string"}}),
        },
        "first_id": {"type": ["string", "null"]},
        "last_id": {"type": ["string", "null"]},
        "has_more": {"type": "boolean"},
    },
)

MODELS: Schema = _list(
    ["id", "object", "created", "owned_by"],
    {
        "id": {"type": "string"},
        "object": {"const": "model"},
        "created": {"type": "integer"},
        "owned_by": {"type": "string"},
    },
)

ERROR: Schema = obj(
    ["error"],
    {
        "error": obj(
            ["message", "type", "param", "code"],
            {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "null"]},
            },
        )
    },
)
