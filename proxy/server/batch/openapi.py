"""The OpenAPI entries of ``/v1/files`` and ``/v1/batches`` (:mod:`proxy.server.batch.files`,
:mod:`proxy.server.batch.batches`): a path item for each of their routes, which
:data:`proxy.server.routes.ROUTES` declares beside its handler, and their objects' schemas, which
:mod:`proxy.server.openapi.document` puts in the components."""

from __future__ import annotations

from typing import Any

from proxy.ledger.batches.objects import ENDPOINTS, PURPOSES, UPLOAD_PURPOSES
from proxy.protocol.shapes import Schema, obj
from proxy.server.openapi.parts import answer, path_id, query, request_body

_REASONS = {
    400: "Invalid request; `param` names the field (`file_quota_exceeded`: past the key's "
    "quota for files, `[batch] file_quota_bytes`).",
    401: "Missing or wrong API key (when keys are configured).",
    403: "A keyless proxy refuses an upload or a cancel from a web page (an `Origin` or a "
    "`Sec-Fetch-Site` header).",
    404: "No file or batch of that id for this key (`param` names the id).",
    413: "The form is larger than `[server] max_body_bytes`, or the file than OpenAI's size "
    "for its purpose (`param`: `file`).",
    415: "An upload not sent as `multipart/form-data`, or a create not sent as JSON.",
    421: "A keyless proxy on loopback refuses a `Host` that is not a loopback name.",
    503: "The ledger database that keeps files and batches cannot be reached.",
}
_STRING = {"type": "string"}
_BINARY = {"type": "string", "format": "binary"}
_NULLABLE_INT = {"type": ["integer", "null"]}
_NULLABLE_STRING = {"type": ["string", "null"]}


def _list(name: str) -> Schema:
    """OpenAI's list object of ``name``."""
    return obj(
        ["object", "data", "has_more"],
        {
            "object": {"const": "list"},
            "data": {"type": "array", "items": {"$ref": f"#/components/schemas/{name}"}},
            "first_id": _NULLABLE_STRING,
            "last_id": _NULLABLE_STRING,
            "has_more": {"type": "boolean"},
        },
    )


SCHEMAS: dict[str, Schema] = {
    "OpenAIFileList": _list("OpenAIFile"),
    "BatchList": _list("Batch"),
    "OpenAIFile": obj(
        ["id", "object", "bytes", "created_at", "filename", "purpose", "status"],
        {
            "id": _STRING,
            "object": {"const": "file"},
            "bytes": {"type": "integer"},
            "created_at": {"type": "integer"},
            "expires_at": _NULLABLE_INT,
            "filename": _STRING,
            "purpose": {"enum": list(PURPOSES)},
            "status": {"enum": ["uploaded", "processed", "error"]},
            "status_details": _NULLABLE_STRING,
        },
    ),
    "FileUpload": obj(
        ["file", "purpose"],
        {
            "file": {"type": "string", "format": "binary"},
            "purpose": {"enum": list(UPLOAD_PURPOSES)},
            "expires_after[anchor]": {"const": "created_at"},
            "expires_after[seconds]": {"type": "integer", "minimum": 3600, "maximum": 2592000},
        },
    ),
    "FileDeleted": obj(
        ["id", "object", "deleted"],
        {"id": _STRING, "object": {"const": "file"}, "deleted": {"type": "boolean"}},
    ),
    "Batch": obj(
        ["id", "object", "endpoint", "input_file_id", "completion_window", "status"],
        {
            "id": _STRING,
            "object": {"const": "batch"},
            "endpoint": {"enum": list(ENDPOINTS)},
            "errors": {"type": ["object", "null"]},
            "input_file_id": _STRING,
            "completion_window": {"const": "24h"},
            "status": {
                "enum": [
                    "validating",
                    "failed",
                    "in_progress",
                    "finalizing",
                    "completed",
                    "expired",
                    "cancelling",
                    "cancelled",
                ]
            },
            "output_file_id": _NULLABLE_STRING,
            "error_file_id": _NULLABLE_STRING,
            "created_at": {"type": "integer"},
            "request_counts": obj(
                ["total", "completed", "failed"],
                {n: {"type": "integer"} for n in ("total", "completed", "failed")},
            ),
            "metadata": {"type": ["object", "null"]},
        },
    ),
    "BatchCreate": obj(
        ["input_file_id", "endpoint", "completion_window"],
        {
            "input_file_id": _STRING,
            "endpoint": {"enum": list(ENDPOINTS)},
            "completion_window": {"const": "24h"},
            "metadata": {"type": ["object", "null"]},
        },
    ),
}


def _answer(
    description: str, schema: str | Schema, *statuses: int, media: str = "application/json"
) -> dict[str, Any]:
    """An answer whose errors say what they mean for files and batches."""
    return answer(description, schema, *statuses, media=media, reasons=_REASONS)


FILES: dict[str, Any] = {
    "post": {
        "summary": "Upload a file (the key's own, within its quota for files)",
        "requestBody": request_body("FileUpload", "multipart/form-data"),
        "responses": _answer("The file.", "OpenAIFile", 400, 401, 403, 413, 415, 421, 503),
    },
    "get": {
        "summary": "The key's files (an admin key's: every key's), a page at a time",
        "parameters": [
            query("purpose", "Only files of this purpose.", {"enum": list(PURPOSES)}),
            query("after", "A file id: the page starts after it.", _STRING),
            query(
                "limit",
                "Files in a page (10000).",
                {"type": "integer", "minimum": 1, "maximum": 10000},
            ),
            query(
                "order",
                "By `created_at`: `desc` (the default) or `asc`.",
                {"enum": ["asc", "desc"]},
            ),
        ],
        "responses": _answer("A page of files.", "OpenAIFileList", 400, 401, 503),
    },
}


FILE: dict[str, Any] = {
    "parameters": [path_id("file_id")],
    "get": {
        "summary": "A file (the key's own; an admin key's: any)",
        "responses": _answer("The file.", "OpenAIFile", 401, 404, 503),
    },
    "delete": {
        "summary": "Delete a file; its bytes leave the key's quota",
        "responses": _answer("Deleted.", "FileDeleted", 401, 404, 503),
    },
}


FILE_CONTENT: dict[str, Any] = {
    "parameters": [path_id("file_id")],
    "get": {
        "summary": "A file's bytes",
        "responses": _answer(
            "The bytes.", _BINARY, 401, 404, 503, media="application/octet-stream"
        ),
    },
}


BATCHES: dict[str, Any] = {
    "post": {
        "summary": "Make a batch of an input file: `in_progress` with its lines, or "
        "`failed` with `errors`; lines are answered local first",
        "requestBody": request_body("BatchCreate"),
        "responses": _answer("The batch.", "Batch", 400, 401, 404, 415, 421, 503),
    },
    "get": {
        "summary": "The key's batches (an admin key's: every key's), newest first",
        "parameters": [
            query("after", "A batch id: the page starts after it.", _STRING),
            query(
                "limit",
                "Batches in a page (20).",
                {"type": "integer", "minimum": 1, "maximum": 100},
            ),
        ],
        "responses": _answer("A page of batches.", "BatchList", 400, 401, 503),
    },
}


BATCH: dict[str, Any] = {
    "parameters": [path_id("batch_id")],
    "get": {
        "summary": "A batch, with its progress (`request_counts`)",
        "responses": _answer("The batch.", "Batch", 401, 404, 503),
    },
}


BATCH_CANCEL: dict[str, Any] = {
    "parameters": [path_id("batch_id")],
    "post": {
        "summary": "Cancel a batch: `cancelling` while claimed lines run on, then `cancelled`",
        "responses": _answer("The batch.", "Batch", 400, 401, 403, 404, 421, 503),
    },
}
