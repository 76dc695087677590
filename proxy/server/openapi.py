"""The OpenAPI 3.1 description of the proxy, served at ``/openapi.json``.

It describes what the proxy accepts and answers, which is OpenAI's API for these endpoints plus
the ``x-frugal-*`` headers. The request schemas are generated from the parameter tables of
:mod:`proxy.protocol.params` (:mod:`proxy.protocol.request_schema`), the rows
:mod:`proxy.protocol.validate` checks a body against; the answers' schemas are
:mod:`proxy.protocol.answer_schemas`; this module holds the headers and the paths. A schemathesis
run over this document is part of the test suite (``tests/server/test_openapi.py``).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from proxy.protocol.answer_schemas import (
    CHAT_COMPLETION,
    EMBEDDINGS,
    ERROR,
    INPUT_ITEMS,
    MODELS,
    RESPONSE,
    RESPONSE_DELETED,
    TEXT_COMPLETION,
    ref,
)
from proxy.protocol.shapes import Schema, obj
from proxy.routing.reasons import Reason
from proxy.server import openapi_batches, report
from proxy.server.endpoints import ENDPOINTS
from proxy.server.responses_compact import COMPACTED
from proxy.server.responses_tokens import INPUT_TOKENS

ROUTING_HEADERS: Schema = {
    "x-request-id": {
        "description": "The client's own x-request-id, or one the proxy made.",
        "schema": {"type": "string"},
    },
    "x-frugal-route": {
        "description": "Where the answer came from: the local model, the API, the response "
        "cache, or none (refused, or failed before either answered).",
        "schema": {"enum": ["local", "api", "cache", "none"]},
    },
    "x-frugal-reason": {
        "description": "Why it went there (the README's table of reasons says what each means).",
        "schema": {"type": "string", "enum": [reason.value for reason in Reason]},
    },
    "x-frugal-quality": {
        "description": "The local answer's score in [0, 1], or `none`.",
        "schema": {"type": "string"},
    },
    "x-frugal-local-model": {
        "description": "The local model that answered (its file, or a backend's model), also "
        "when the gate rejected its answer; absent when it did not answer. The answer's own "
        "`model` is the one asked for.",
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
        404: "Unknown path, or no stored response of that id for this key.",
        405: "Wrong method.",
        408: "The request body came too slowly.",
        413: "The request body is too large.",
        415: "The body is not sent as `Content-Type: application/json`.",
        421: "A keyless proxy on loopback refuses a `Host` that is not a loopback name.",
        429: "Too many requests in flight, or the API's rate limit.",
        502: "The API failed after retries.",
        503: "The local model could not answer and no API fallback is allowed; or the stored "
        "responses cannot be read (`store_unavailable`).",
        504: "The API did not answer in time.",
    }
    return {
        str(status): {
            "description": reasons[status],
            "content": {"application/json": {"schema": ref("Error")}},
        }
        for status in statuses
    }


RESPONSE_ID: dict[str, Any] = {
    "name": "response_id",
    "in": "path",
    "required": True,
    "schema": {"type": "string"},
}
LIST_PARAMETERS: list[dict[str, Any]] = [
    {
        "name": "limit",
        "in": "query",
        "description": "Items in a page (20).",
        "schema": {"type": "integer", "minimum": 1, "maximum": 100},
    },
    {
        "name": "order",
        "in": "query",
        "description": "`desc` (the default): the last item first; `asc`: the first first.",
        "schema": {"enum": ["asc", "desc"]},
    },
    {
        "name": "after",
        "in": "query",
        "description": "An item id: the page starts after it.",
        "schema": {"type": "string"},
    },
    {
        "name": "before",
        "in": "query",
        "description": "An item id: the page ends before it.",
        "schema": {"type": "string"},
    },
]


# The answers' schemas, by the component name an endpoint's ``response`` gives.
ANSWERS: dict[str, Schema] = {
    "ChatCompletion": CHAT_COMPLETION,
    "TextCompletion": TEXT_COMPLETION,
    "Embeddings": EMBEDDINGS,
    "Response": RESPONSE,
    "ResponseInputTokens": INPUT_TOKENS,
    "CompactedResponse": COMPACTED,
}


def _answer(description: str, schema: str, *errors: int) -> dict[str, Any]:
    return {
        "200": {
            "description": description,
            "content": {"application/json": {"schema": ref(schema)}},
        },
        **_errors(*errors),
    }


def _post(
    summary: str,
    request: str,
    response: str,
    *,
    stream: bool,
    cascade: bool = True,
    events: str,
    also: tuple[int, ...] = (),
) -> dict[str, Any]:
    content: dict[str, Any] = {"application/json": {"schema": ref(response)}}
    if stream:
        content["text/event-stream"] = {
            "schema": obj(["data"], {"data": {"type": "string"}}),
            "description": events,
        }
    return {
        "post": {
            "summary": summary,
            "parameters": REQUEST_HEADERS if cascade else REQUEST_HEADERS[:1],
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": ref(request)}},
            },
            "responses": {
                "200": {
                    "description": "The answer.",
                    "headers": ROUTING_HEADERS,
                    "content": content,
                },
                **_errors(*sorted({400, 401, 408, 413, 415, 421, 429, 502, 503, 504, *also})),
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
                **{
                    name: schema
                    for e in ENDPOINTS
                    for name, schema in (e.request, (e.response, ANSWERS[e.response]))
                },
                "ResponseDeleted": RESPONSE_DELETED,
                "ResponseInputItems": INPUT_ITEMS,
                **openapi_batches.SCHEMAS,
                "Models": MODELS,
                "Report": report.REPORT,
                "Error": ERROR,
            },
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{}, {"bearer": []}],
        "paths": {
            **{
                e.path: _post(
                    e.summary,
                    e.request[0],
                    e.response,
                    stream=e.stream,
                    cascade=e.cascade,
                    events=e.events,
                    also=e.also,
                )
                for e in ENDPOINTS
            },
            "/v1/responses/{response_id}": {
                "parameters": [RESPONSE_ID],
                "get": {
                    "summary": "A stored response (the key's own; an admin key's: any); with "
                    "`stream=true`, a background response's events once it has ended, from "
                    "`starting_after` + 1",
                    "parameters": [
                        {"name": "stream", "in": "query", "schema": {"type": "boolean"}},
                        {"name": "starting_after", "in": "query", "schema": {"type": "integer"}},
                    ],
                    "responses": _answer(
                        "The response object, or its events (text/event-stream).",
                        "Response",
                        400,
                        401,
                        404,
                        503,
                    ),
                },
                "delete": {
                    "summary": "Delete a stored response (the key's own; an admin key's: any)",
                    "responses": _answer("Deleted.", "ResponseDeleted", 401, 404, 503),
                },
            },
            "/v1/responses/{response_id}/cancel": {
                "parameters": [RESPONSE_ID],
                "post": {
                    "summary": "Cancel a background response (the key's own; an admin key's: "
                    "any): a queued or running one is `cancelled`, a finished one is answered "
                    "as it is; one that is not a background response is a 400",
                    "responses": _answer("The response object.", "Response", 400, 401, 404, 503),
                },
            },
            "/v1/responses/{response_id}/input_items": {
                "parameters": [RESPONSE_ID],
                "get": {
                    "summary": "The input items of a stored response, a page at a time",
                    "parameters": LIST_PARAMETERS,
                    "responses": _answer(
                        "A page of its input items.", "ResponseInputItems", 400, 401, 404, 503
                    ),
                },
            },
            **openapi_batches.PATHS,
            "/v1/models": {
                "get": {
                    "summary": "The models that can be asked for",
                    "responses": {
                        "200": {
                            "description": "`local`, the models the config names "
                            "(`[fallback] models`, `[quality] models`, `[pricing]`), then "
                            "the upstream's own list (cached, bounded), each once.",
                            "content": {"application/json": {"schema": ref("Models")}},
                        },
                        **_errors(401),
                    },
                }
            },
            "/v1/frugal/report": {
                "get": {
                    "summary": "The month's savings: what `frugal report --format json` prints",
                    "parameters": report.PARAMETERS,
                    "responses": {
                        "200": {
                            "description": "The report (docs/report.md); a month without "
                            "requests is a report of zeros.",
                            "content": {"application/json": {"schema": ref("Report")}},
                        },
                        **_errors(400, 401),
                        "503": {
                            "description": "The ledger cannot be read.",
                            "content": {"application/json": {"schema": ref("Error")}},
                        },
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
                                    "schema": obj(
                                        ["status"], {"status": {"enum": ["ok", "degraded"]}}
                                    )
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
