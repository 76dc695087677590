"""The OpenAPI 3.1 description of the proxy, served at ``/openapi.json``.

It describes what the proxy accepts and answers, which is OpenAI's API for these endpoints plus
the ``x-frugal-*`` headers. The request schemas follow :mod:`proxy.http.validate` (what is rejected
with a 400); rules between fields that a schema cannot say (``top_logprobs`` needs ``logprobs``,
a tool's ``parameters`` must be a valid JSON Schema...) are in the descriptions. A schemathesis
run over this document is part of the test suite (``tests/http/test_openapi.py``).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from proxy.http.validate import MAX_N, MAX_STOP

Schema = dict[str, Any]

NAME_PATTERN = "^[a-zA-Z0-9_-]{1,64}$"
TOKEN_IDS: Schema = {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 0}}


def _ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def _nullable(schema: Schema) -> Schema:
    return {"anyOf": [schema, {"type": "null"}]}


def _number(low: float, high: float, doc: str) -> Schema:
    return _nullable({"type": "number", "minimum": low, "maximum": high, "description": doc})


def _integer(low: int, high: int | None, doc: str) -> Schema:
    schema: Schema = {"type": "integer", "minimum": low, "description": doc}
    if high is not None:
        schema["maximum"] = high
    return _nullable(schema)


def _string(doc: str) -> Schema:
    return _nullable({"type": "string", "description": doc})


def _object(doc: str) -> Schema:
    return _nullable({"type": "object", "description": doc})


def _present(name: str, schema: Schema) -> Schema:
    return {"required": [name], "properties": {name: schema}}


def _requires(name: str, when: Schema, other: str, then: Schema) -> Schema:
    """``name`` fitting ``when`` needs the property ``other`` to fit ``then``."""
    return {"if": _present(name, when), "then": _present(other, then)}


TEXT_PART: Schema = {
    "type": "object",
    "required": ["type", "text"],
    "properties": {"type": {"enum": ["text", "input_text"]}, "text": {"type": "string"}},
}
PARTS: Schema = {
    "type": "array",
    "items": {
        "anyOf": [
            TEXT_PART,
            {
                "type": "object",
                "required": ["type", "refusal"],
                "properties": {"type": {"const": "refusal"}, "refusal": {"type": "string"}},
            },
            {
                "type": "object",
                "required": ["type", "image_url"],
                "properties": {
                    "type": {"const": "image_url"},
                    "image_url": {
                        "type": "object",
                        "required": ["url"],
                        "properties": {"url": {"type": "string"}, "detail": {"type": "string"}},
                    },
                },
            },
            {
                "type": "object",
                "required": ["type"],
                "properties": {"type": {"enum": ["input_audio", "file"]}},
            },
        ]
    },
    "description": "Text parts are answered locally; image, audio and file parts go to the API.",
}
CONTENT: Schema = {"anyOf": [{"type": "string"}, PARTS]}

TOOL_CALL: Schema = {
    "type": "object",
    "required": ["id", "type", "function"],
    "properties": {
        "id": {"type": "string"},
        "type": {"const": "function"},
        "function": {
            "type": "object",
            "required": ["name", "arguments"],
            "properties": {
                "name": {"type": "string"},
                "arguments": {"type": "string", "description": "JSON text"},
            },
        },
    },
}


def _message(roles: list[str], *, content_required: bool, extra: Schema | None = None) -> Schema:
    properties: Schema = {
        "role": {"enum": roles},
        "content": CONTENT if content_required else _nullable(CONTENT),
        "name": {"type": "string"},
    }
    properties.update(extra or {})
    required = ["role", "content"] if content_required else ["role"]
    return {"type": "object", "required": required, "properties": properties}


MESSAGE: Schema = {
    "anyOf": [
        _message(["system", "developer", "user"], content_required=True),
        _message(
            ["assistant"],
            content_required=False,
            extra={
                "tool_calls": {"type": "array", "items": TOOL_CALL},
                "function_call": {
                    "type": "object",
                    "required": ["name"],
                    "properties": {"name": {"type": "string"}, "arguments": {"type": "string"}},
                },
                "refusal": _nullable({"type": "string"}),
            },
        ),
        _message(
            ["tool"],
            content_required=True,
            extra={"tool_call_id": {"type": "string"}},
        )
        | {"required": ["role", "content", "tool_call_id"]},
        _message(["function"], content_required=True) | {"required": ["role", "content", "name"]},
    ]
}

FUNCTION: Schema = {
    "type": "object",
    "required": ["name"],
    "properties": {
        "name": {"type": "string", "pattern": NAME_PATTERN},
        "description": {"type": "string"},
        "parameters": {
            "type": "object",
            "description": "A JSON Schema for the arguments; an invalid schema is a 400.",
        },
        "strict": _nullable({"type": "boolean"}),
    },
}

STOP: Schema = {
    "anyOf": [
        {"type": "string"},
        {"type": "array", "items": {"type": "string"}, "maxItems": MAX_STOP},
        {"type": "null"},
    ],
    "description": f"Up to {MAX_STOP} sequences where the answer stops.",
}

LOGIT_BIAS: Schema = _nullable(
    {
        "type": "object",
        "propertyNames": {"pattern": "^[0-9]{1,9}$"},
        "additionalProperties": {"type": "number", "minimum": -100, "maximum": 100},
        "description": "Token ids of the model's own tokenizer. Applied locally only with the "
        "model `local` (the ids are then the local model's); otherwise the request goes to "
        "the API.",
    }
)

STREAM_OPTIONS: Schema = _nullable(
    {
        "type": "object",
        "properties": {
            "include_usage": {"type": "boolean"},
            "include_obfuscation": {"type": "boolean"},
        },
        "description": "Only with `stream: true`.",
    }
)

SAMPLING: Schema = {
    "temperature": _number(0, 2, "Sampling temperature; the local default is greedy (0)."),
    "top_p": _number(0, 1, "Nucleus sampling."),
    "presence_penalty": _number(-2, 2, "Penalty for tokens already present."),
    "frequency_penalty": _number(-2, 2, "Penalty by token frequency."),
    "n": _integer(1, MAX_N, "How many answers to generate."),
    "max_tokens": _integer(1, None, "The most tokens the answer may have."),
    "seed": _integer(-(2**63), 2**63 - 1, "Seed for sampling."),
    "stop": STOP,
    "stream": _nullable({"type": "boolean"}),
    "stream_options": STREAM_OPTIONS,
    "logit_bias": LOGIT_BIAS,
    "user": _string("An end-user id; ignored locally, forwarded to the API."),
}

# No control characters or line breaks (proxy.http.validate checks str.isprintable: stricter).
_CONTROL = "\\u0000-\\u001f\\u007f-\\u009f\\u2028\\u2029"
MODEL_NAME: Schema = {
    "type": "string",
    "minLength": 1,
    "maxLength": 256,
    "pattern": f"^[^{_CONTROL}]*[^{_CONTROL}\\s][^{_CONTROL}]*$",
}
MODEL: Schema = {
    **MODEL_NAME,
    "description": "The model asked for: the API fallback's target and the price that savings "
    "are counted against. `local` means the local model only. At most 256 printable characters.",
}

CHAT_REQUEST: Schema = {
    "type": "object",
    "required": ["model", "messages"],
    "properties": {
        "model": MODEL,
        "messages": {"type": "array", "minItems": 1, "items": MESSAGE},
        **SAMPLING,
        "max_completion_tokens": _integer(1, None, "Same as max_tokens."),
        "logprobs": _nullable({"type": "boolean"}),
        "top_logprobs": _integer(0, 20, "Needs `logprobs: true`."),
        "response_format": {
            "anyOf": [
                {
                    "type": "object",
                    "required": ["type"],
                    "properties": {"type": {"enum": ["text", "json_object"]}},
                },
                {
                    "type": "object",
                    "required": ["type", "json_schema"],
                    "properties": {
                        "type": {"const": "json_schema"},
                        "json_schema": {
                            "type": "object",
                            "required": ["name"],
                            "properties": {
                                "name": {"type": "string", "pattern": NAME_PATTERN},
                                "description": {"type": "string"},
                                "schema": {
                                    "type": "object",
                                    "description": "A JSON Schema; an invalid one is a 400 "
                                    "naming response_format.json_schema.schema.",
                                },
                                "strict": _nullable({"type": "boolean"}),
                            },
                        },
                    },
                },
                {"type": "null"},
            ],
            "description": "JSON mode: locally, a grammar built from the schema constrains "
            "the answer.",
        },
        "tools": _nullable(
            {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["type", "function"],
                    "properties": {"type": {"const": "function"}, "function": FUNCTION},
                },
            }
        ),
        "tool_choice": {
            "anyOf": [
                {"enum": ["none", "auto", "required"]},
                {
                    "type": "object",
                    "required": ["type", "function"],
                    "properties": {
                        "type": {"const": "function"},
                        "function": {
                            "type": "object",
                            "required": ["name"],
                            "properties": {"name": {"type": "string"}},
                        },
                    },
                },
                {"type": "null"},
            ],
            "description": "Only with `tools`; a named function must be one of them.",
        },
        "parallel_tool_calls": _nullable({"type": "boolean"}),
        "functions": _nullable({"type": "array", "minItems": 1, "items": FUNCTION}),
        "function_call": {
            "anyOf": [
                {"enum": ["none", "auto"]},
                {
                    "type": "object",
                    "required": ["name"],
                    "properties": {"name": {"type": "string"}},
                },
                {"type": "null"},
            ],
            "description": "Deprecated; only with `functions`.",
        },
        "reasoning_effort": _string("none and minimal are answered locally; others by the API."),
        "verbosity": _string("medium is answered locally; others by the API."),
        "modalities": _nullable({"type": "array", "items": {"enum": ["text", "audio"]}}),
        "audio": _object("Audio output: the API answers."),
        "web_search_options": _object("Web search: the API answers."),
        "moderation": _object("Moderation: the API answers."),
        "prediction": _object("Predicted output: ignored locally, forwarded to the API."),
        "store": _nullable({"type": "boolean"}),
        "metadata": _nullable(
            {
                "type": "object",
                "maxProperties": 16,
                "propertyNames": {"maxLength": 64},
                "additionalProperties": {"type": "string", "maxLength": 512},
            }
        ),
        "service_tier": _string("Ignored locally, forwarded to the API."),
        "prompt_cache_key": _string("Ignored locally, forwarded to the API."),
        "prompt_cache_retention": _string("Ignored locally, forwarded to the API."),
        "prompt_cache_options": _object("Ignored locally, forwarded to the API."),
        "safety_identifier": _string("Ignored locally, forwarded to the API."),
    },
    "allOf": [
        _requires("stream_options", {"type": "object"}, "stream", {"const": True}),
        _requires("top_logprobs", {"type": "integer"}, "logprobs", {"const": True}),
        _requires("tool_choice", {"not": {"type": "null"}}, "tools", {"minItems": 1}),
        _requires("function_call", {"not": {"type": "null"}}, "functions", {"minItems": 1}),
        {
            "if": _present("functions", {"type": "array"}),
            "then": {"properties": {"tools": {"anyOf": [{"type": "null"}, {"maxItems": 0}]}}},
        },
    ],
    "additionalProperties": False,
    "description": "OpenAI's chat-completions request. A parameter not listed here is a 400 "
    "naming it (routing and credential fields such as base_url included). A named tool_choice "
    "(or function_call) must name one of the tools (functions); a schema must be a valid JSON "
    "Schema.",
}

COMPLETIONS_REQUEST: Schema = {
    "type": "object",
    "required": ["model", "prompt"],
    "properties": {
        "model": MODEL,
        "prompt": {
            "anyOf": [
                {"type": "string"},
                {"type": "array", "minItems": 1, "items": {"type": "string"}},
                TOKEN_IDS,
                {"type": "array", "minItems": 1, "items": TOKEN_IDS},
            ],
            "description": "Token-id prompts are answered by the API (except for model `local`).",
        },
        **SAMPLING,
        "logprobs": _integer(0, 5, "Logprobs of the most likely tokens at each position."),
        "echo": _nullable({"type": "boolean"}),
        "best_of": _integer(1, 20, "At least n; above 1 the API answers. Not with stream."),
        "suffix": _string("Text after the completion: the API answers."),
    },
    "allOf": [_requires("stream_options", {"type": "object"}, "stream", {"const": True})],
    "additionalProperties": False,
    "description": "OpenAI's legacy completions request. best_of must be at least n, and above "
    "1 it cannot be streamed.",
}

EMBEDDINGS_REQUEST: Schema = {
    "type": "object",
    "required": ["model", "input"],
    "properties": {
        "model": MODEL_NAME | {"description": "At most 256 printable characters."},
        "input": {
            "anyOf": [
                {"type": "string", "minLength": 1},
                {"type": "array", "minItems": 1, "items": {"type": "string", "minLength": 1}},
                TOKEN_IDS,
                {"type": "array", "minItems": 1, "items": TOKEN_IDS},
            ]
        },
        "encoding_format": _nullable({"enum": ["float", "base64"]}),
        "dimensions": _integer(1, None, "Output dimensions."),
        "user": _string("Forwarded to the API."),
    },
    "additionalProperties": False,
}

USAGE: Schema = {
    "type": "object",
    "required": ["prompt_tokens", "total_tokens"],
    "properties": {
        "prompt_tokens": {"type": "integer"},
        "completion_tokens": {"type": "integer"},
        "total_tokens": {"type": "integer"},
    },
}

CHAT_COMPLETION: Schema = {
    "type": "object",
    "required": ["id", "object", "created", "model", "choices"],
    "properties": {
        "id": {"type": "string"},
        "object": {"const": "chat.completion"},
        "created": {"type": "integer"},
        "model": {"type": "string"},
        "choices": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["index", "message", "finish_reason"],
                "properties": {
                    "index": {"type": "integer"},
                    "message": {
                        "type": "object",
                        "required": ["role"],
                        "properties": {
                            "role": {"const": "assistant"},
                            "content": {"type": ["string", "null"]},
                            "tool_calls": {"type": "array", "items": TOOL_CALL},
                        },
                    },
                    "logprobs": {"type": ["object", "null"]},
                    "finish_reason": {"type": ["string", "null"]},
                },
            },
        },
        "usage": USAGE,
    },
}

TEXT_COMPLETION: Schema = {
    "type": "object",
    "required": ["id", "object", "created", "model", "choices"],
    "properties": {
        "id": {"type": "string"},
        "object": {"const": "text_completion"},
        "created": {"type": "integer"},
        "model": {"type": "string"},
        "choices": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["text", "index", "finish_reason"],
                "properties": {
                    "text": {"type": "string"},
                    "index": {"type": "integer"},
                    "logprobs": {"type": ["object", "null"]},
                    "finish_reason": {"type": ["string", "null"]},
                },
            },
        },
        "usage": USAGE,
    },
}

EMBEDDINGS: Schema = {
    "type": "object",
    "required": ["object", "data", "model"],
    "properties": {
        "object": {"const": "list"},
        "data": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["object", "index", "embedding"],
                "properties": {
                    "object": {"const": "embedding"},
                    "index": {"type": "integer"},
                    "embedding": {
                        "anyOf": [
                            {"type": "array", "items": {"type": "number"}},
                            {"type": "string"},
                        ]
                    },
                },
            },
        },
        "model": {"type": "string"},
        "usage": USAGE,
    },
}

MODELS: Schema = {
    "type": "object",
    "required": ["object", "data"],
    "properties": {
        "object": {"const": "list"},
        "data": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["id", "object", "created", "owned_by"],
                "properties": {
                    "id": {"type": "string"},
                    "object": {"const": "model"},
                    "created": {"type": "integer"},
                    "owned_by": {"type": "string"},
                },
            },
        },
    },
}

ERROR: Schema = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type", "param", "code"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "null"]},
            },
        }
    },
}

ROUTING_HEADERS: Schema = {
    "x-request-id": {
        "description": "The client's own x-request-id, or one the proxy made.",
        "schema": {"type": "string"},
    },
    "x-frugal-route": {
        "description": "Where the answer came from.",
        "schema": {"enum": ["local", "api", "none"]},
    },
    "x-frugal-reason": {
        "description": "Why: accepted, low_quality, local_timeout, local_error, local_busy, "
        "context_overflow, unsupported, forced, no_fallback, live.",
        "schema": {"type": "string"},
    },
    "x-frugal-quality": {
        "description": "The local answer's score in [0, 1], or `none`.",
        "schema": {"type": "string"},
    },
}

REQUEST_HEADERS: list[Schema] = [
    {
        "name": "x-frugal-route",
        "in": "header",
        "required": False,
        "description": "Force the route: local or api.",
        "schema": {"enum": ["local", "api"]},
    },
    {
        "name": "x-frugal-min-quality",
        "in": "header",
        "required": False,
        "description": "Raise or lower the quality bar for this request: a number in [0, 1].",
        "schema": {"type": "string"},
    },
]


def _errors(*statuses: int) -> dict[str, Any]:
    reasons = {
        400: "Invalid request; `param` names the field.",
        401: "Missing or wrong API key (when keys are configured).",
        404: "Unknown path.",
        405: "Wrong method.",
        408: "The request body came too slowly.",
        413: "The request body is too large.",
        415: "The body is not sent as `Content-Type: application/json`.",
        421: "A keyless proxy on loopback refuses a `Host` that is not a loopback name.",
        429: "Too many requests in flight, or the API's rate limit.",
        502: "The API failed after retries.",
        503: "The local model could not answer and no API fallback is allowed.",
        504: "The API did not answer in time.",
    }
    return {
        str(status): {
            "description": reasons[status],
            "content": {"application/json": {"schema": _ref("Error")}},
        }
        for status in statuses
    }


def _post(
    summary: str, request: str, response: str, *, stream: bool, cascade: bool = True
) -> dict[str, Any]:
    content: dict[str, Any] = {"application/json": {"schema": _ref(response)}}
    if stream:
        content["text/event-stream"] = {
            "schema": {
                "type": "object",
                "required": ["data"],
                "properties": {"data": {"type": "string"}},
            },
            "description": "With `stream: true`: `data: <chunk>` events, then `data: [DONE]`.",
        }
    return {
        "post": {
            "summary": summary,
            "parameters": REQUEST_HEADERS if cascade else REQUEST_HEADERS[:1],
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": _ref(request)}},
            },
            "responses": {
                "200": {
                    "description": "The answer.",
                    "headers": ROUTING_HEADERS,
                    "content": content,
                },
                **_errors(400, 401, 408, 413, 415, 421, 429, 502, 503, 504),
            },
        }
    }


@lru_cache(maxsize=1)
def openapi_spec() -> dict[str, Any]:
    """The OpenAPI document (built once)."""
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "frugal-proxy",
            "version": "1",
            "description": "A local-first, OpenAI-compatible endpoint: each request is answered "
            "by a local model when its answer is good enough, by the API otherwise.",
        },
        "servers": [{"url": "/"}],
        "components": {
            "schemas": {
                "ChatCompletionRequest": CHAT_REQUEST,
                "ChatCompletion": CHAT_COMPLETION,
                "CompletionRequest": COMPLETIONS_REQUEST,
                "TextCompletion": TEXT_COMPLETION,
                "EmbeddingsRequest": EMBEDDINGS_REQUEST,
                "Embeddings": EMBEDDINGS,
                "Models": MODELS,
                "Error": ERROR,
            },
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{}, {"bearer": []}],
        "paths": {
            "/v1/chat/completions": _post(
                "Chat completion, local first",
                "ChatCompletionRequest",
                "ChatCompletion",
                stream=True,
            ),
            "/v1/completions": _post(
                "Legacy text completion, local first",
                "CompletionRequest",
                "TextCompletion",
                stream=True,
            ),
            "/v1/embeddings": _post(
                "Embeddings, passed through to the API",
                "EmbeddingsRequest",
                "Embeddings",
                stream=False,
                cascade=False,
            ),
            "/v1/models": {
                "get": {
                    "summary": "The models that can be asked for",
                    "responses": {
                        "200": {
                            "description": "`local`, then the configured mapping's names.",
                            "content": {"application/json": {"schema": _ref("Models")}},
                        },
                        **_errors(401),
                    },
                }
            },
            "/healthz": {
                "get": {
                    "summary": "Health of the engine, the fallback and the ledger",
                    "responses": {
                        "200": {
                            "description": "Serving.",
                            "content": {
                                "application/json": {
                                    "schema": {
                                        "type": "object",
                                        "required": ["status"],
                                        "properties": {"status": {"enum": ["ok", "degraded"]}},
                                    }
                                }
                            },
                        },
                        "503": {
                            "description": "The engine is down and there is no fallback.",
                            "content": {
                                "application/json": {
                                    "schema": {"type": "object", "required": ["status"]}
                                }
                            },
                        },
                    },
                }
            },
            "/openapi.json": {
                "get": {
                    "summary": "This document",
                    "responses": {
                        "200": {
                            "description": "OpenAPI 3.1",
                            "content": {"application/json": {"schema": {"type": "object"}}},
                        }
                    },
                }
            },
        },
    }
