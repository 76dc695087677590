"""The pieces every path of ``/openapi.json`` is written with: the ``x-frugal-*`` headers, the
error answers by status, an answer, a path or query parameter, a page's parameters, a request
that takes part of a Responses request, and the whole entry of a ``POST`` endpoint. A route's
own entry (:mod:`proxy.server.routes`, :mod:`proxy.server.endpoints`) is put together from them
beside the route it describes.
"""

from __future__ import annotations

from typing import Any

from proxy.protocol.answer_schemas import ref
from proxy.protocol.request_schema import RESPONSES_REQUEST
from proxy.protocol.shapes import Schema, obj
from proxy.routing.reasons import Reason

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

REASONS: dict[int, str] = {
    400: "Invalid request; `param` names the field.",
    401: "Missing or wrong API key (when keys are configured).",
    403: "The key may not read this (an admin key's only).",
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


def responses_subset(description: str, fields: tuple[str, ...]) -> Schema:
    """A request that takes ``fields`` of a Responses request, as ``/v1/responses`` describes
    them (``model`` and ``input`` required)."""
    return {
        "type": "object",
        "description": description,
        "required": ["model", "input"],
        "properties": {
            name: schema
            for name, schema in RESPONSES_REQUEST["properties"].items()
            if name in fields
        },
    }


# The statuses any POST endpoint may answer besides 200.
POST_ERRORS = (400, 401, 408, 413, 415, 421, 429, 502, 503, 504)


def errors(*statuses: int, reasons: dict[int, str] | None = None) -> dict[str, Any]:
    """OpenAI's error JSON under each status, described by ``reasons`` (else :data:`REASONS`)."""
    said = REASONS if reasons is None else reasons
    return {
        str(status): {
            "description": said[status],
            "content": {"application/json": {"schema": ref("Error")}},
        }
        for status in statuses
    }


def answer(
    description: str,
    schema: str | Schema,
    *statuses: int,
    media: str = "application/json",
    reasons: dict[int, str] | None = None,
) -> dict[str, Any]:
    """A ``200`` of ``media`` (its schema a component's name, or a schema), then the errors."""
    return {
        "200": {
            "description": description,
            "content": {media: {"schema": ref(schema) if isinstance(schema, str) else schema}},
        },
        **errors(*statuses, reasons=reasons),
    }


def request_body(schema: str, media: str = "application/json") -> dict[str, Any]:
    """A required body of ``media``, its schema the component ``schema``."""
    return {"required": True, "content": {media: {"schema": ref(schema)}}}


def path_id(name: str) -> dict[str, Any]:
    """The id in a path, ``{name}``."""
    return {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}


def query(name: str, description: str, schema: Schema) -> dict[str, Any]:
    """An optional query parameter."""
    return {
        "name": name,
        "in": "query",
        "required": False,
        "description": description,
        "schema": schema,
    }


LIST_PARAMETERS: list[dict[str, Any]] = [
    query("limit", "Items in a page (20).", {"type": "integer", "minimum": 1, "maximum": 100}),
    query(
        "order",
        "`desc` (the default): the last item first; `asc`: the first first.",
        {"enum": ["asc", "desc"]},
    ),
    query("after", "An item id: the page starts after it.", {"type": "string"}),
    query("before", "An item id: the page ends before it.", {"type": "string"}),
]


def post(
    summary: str,
    request: str,
    response: str,
    *,
    stream: bool,
    cascade: bool,
    events: str,
    also: tuple[int, ...],
) -> dict[str, Any]:
    """The path item of a ``POST`` endpoint: its JSON body, the routing headers it reads and
    sends, its answer as JSON and (``stream``) as Server-Sent Events, and its errors."""
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
            "requestBody": request_body(request),
            "responses": {
                "200": {
                    "description": "The answer.",
                    "headers": ROUTING_HEADERS,
                    "content": content,
                },
                **errors(*sorted({*POST_ERRORS, *also})),
            },
        }
    }
