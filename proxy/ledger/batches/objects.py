"""What the batch store hands out: a stored file, a batch, a claimed line and a line's result,
each able to write itself as OpenAI's object, and the batch's life as a table of moves.

A batch goes ``validating → in_progress → finalizing → completed``, or ends ``failed`` (a bad
input file), ``expired`` (its window passed) or ``cancelling → cancelled``; :data:`MOVES` says
which status may follow which, and the store refuses any other move. OpenAI's limits on an
input file are here too: :data:`MAX_LINES` lines, :data:`MAX_BATCH_FILE_BYTES` bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

MAX_LINES = 50_000
MAX_BATCH_FILE_BYTES = 200 * 1024 * 1024  # an input file of purpose "batch"
MAX_FILE_BYTES = 512 * 1024 * 1024  # any other file
WINDOW_S = {"24h": 86_400}
ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/embeddings")
PURPOSES = ("batch", "batch_output", "user_data", "assistants", "fine-tune", "vision", "evals")
UPLOAD_PURPOSES = tuple(p for p in PURPOSES if p != "batch_output")  # the store writes outputs

TERMINAL = frozenset({"completed", "failed", "expired", "cancelled"})
MOVES: dict[str, frozenset[str]] = {
    "validating": frozenset({"in_progress", "failed", "cancelling"}),
    "in_progress": frozenset({"finalizing", "cancelling", "expired"}),
    "finalizing": frozenset({"completed", "failed", "expired"}),
    "cancelling": frozenset({"cancelled"}),
    **{status: frozenset() for status in TERMINAL},
}
"""The statuses each status may move to; a terminal one moves nowhere."""

TIMESTAMPS = (
    "created_at",
    "in_progress_at",
    "finalizing_at",
    "completed_at",
    "failed_at",
    "expired_at",
    "cancelling_at",
    "cancelled_at",
    "expires_at",
)


def may_move(status: str, to: str) -> bool:
    return to in MOVES.get(status, frozenset())


@dataclass(frozen=True, slots=True, kw_only=True)
class StoredFile:
    """One file, without its bytes (:meth:`~proxy.ledger.batches.files.FileStore.content`)."""

    id: str
    owner: str | None  # the key's identity; None: the proxy ran without keys
    purpose: str
    filename: str
    bytes: int
    created_at: int
    expires_at: int | None
    status: str = "processed"

    def as_openai(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "file",
            "bytes": self.bytes,
            "created_at": self.created_at,
            "expires_at": self.expires_at,
            "filename": self.filename,
            "purpose": self.purpose,
            "status": self.status,
            "status_details": None,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class Batch:
    id: str
    owner: str | None
    endpoint: str
    input_file_id: str
    completion_window: str
    status: str
    times: dict[str, int | None]  # every name of :data:`TIMESTAMPS`
    total: int
    completed: int
    failed: int
    output_file_id: str | None
    error_file_id: str | None
    errors: list[dict[str, Any]] | None
    metadata: dict[str, str] | None

    def as_openai(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "batch",
            "endpoint": self.endpoint,
            "errors": None if self.errors is None else {"object": "list", "data": self.errors},
            "input_file_id": self.input_file_id,
            "completion_window": self.completion_window,
            "status": self.status,
            "output_file_id": self.output_file_id,
            "error_file_id": self.error_file_id,
            **self.times,
            "request_counts": {
                "total": self.total,
                "completed": self.completed,
                "failed": self.failed,
            },
            "metadata": self.metadata,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class Line:
    """A line handed to a worker (:meth:`~proxy.ledger.batches.store.BatchStore.claim`)."""

    id: str  # batch_req_...: the output line's id and its ledger row's request id
    batch_id: str
    owner: str | None  # the batch's key, whose budget and ledger rows the line is
    index: int  # its place among the input file's lines, from 0
    custom_id: str
    method: str
    url: str
    body: dict[str, Any]
    claims: int  # how many times it was claimed, this time included
    upstream_batch_id: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class LineResult:
    """A line's answer: the response (``status_code``, ``request_id``, ``body``), or an
    ``error`` (``{"code", "message"}``) when there is none. A 2xx response counts as completed,
    anything else as failed (and goes to the batch's error file)."""

    status_code: int | None = None
    request_id: str | None = None
    body: dict[str, Any] | None = None
    error: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.status_code is not None and 200 <= self.status_code < 300


def output_line(
    line_id: str,
    custom_id: str,
    status_code: int | None,
    request_id: str | None,
    body: Any,
    error: Any,
) -> dict[str, Any]:
    """One line of an output or error file, in OpenAI's shape."""
    response = (
        None
        if status_code is None
        else {"status_code": status_code, "request_id": request_id, "body": body}
    )
    return {"id": line_id, "custom_id": custom_id, "response": response, "error": error}
