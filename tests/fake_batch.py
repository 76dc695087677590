"""The fake API's Files and Batch APIs: OpenAI's ``/v1/files`` and ``/v1/batches``, in memory.

:class:`FakeBatches` belongs to one :class:`tests.fake_api.FakeAPI` (``api.batch_api``), whose
routes it adds:

    POST   /v1/files                 multipart (``file``, ``purpose``, ``expires_after[...]``)
    GET    /v1/files, /v1/files/{id}, /v1/files/{id}/content
    DELETE /v1/files/{id}
    POST   /v1/batches               ``input_file_id``, ``endpoint``, ``completion_window``
    GET    /v1/batches, /v1/batches/{id}
    POST   /v1/batches/{id}/cancel

The objects are OpenAI's (``file``, ``batch``, ``list``), and so are the statuses: a batch is
``validating`` when made; each ``GET`` of it moves it on (``in_progress`` while the knobs
``batch_polls`` and ``batch_seconds`` hold it, then ``completed``, ``failed`` or ``expired``;
``cancelling`` then ``cancelled`` after a cancel). A batch's lines are answered when it
completes, each by the fake's own endpoint for its ``url`` (chat, completions, responses,
embeddings: the knobs ``reply``, ``usage``, ``oracle``... apply, the fault knobs of a single
call do not), into an output file of ``{"id", "custom_id", "response": {"status_code",
"request_id", "body"}, "error"}`` lines and an error file.

Knobs (on the FakeAPI, read when a batch is made):

- ``batch_polls``: the batch answers ``in_progress`` to that many ``GET``\\ s before it ends
- ``batch_seconds``: and for at least that long after it was made
- ``batch_fail``: a message: the batch ends ``failed``, its ``errors`` holding that message
  (code ``batch_failed``), with no output
- ``batch_expire_after``: N: the batch ends ``expired``; its first N lines are answered and
  every other one is in the error file with ``response: null`` and the error code
  ``batch_expired``, as OpenAI's are
- ``batch_line_error``: a regular expression: each line whose ``custom_id`` it finds is
  answered with a 400 (``invalid_request_error``) in the error file
- ``batch_output_extra``: lines of text put at the end of the output file as they are (a
  hostile upstream: a ``custom_id`` never sent, a line again, a very long line, no JSON)
- ``batch_unsupported``: a status (404 or 400): ``POST /v1/batches`` answers it, saying that
  batches are not supported, and makes none (a provider, account or model without them); the
  upload is still taken

A bad input file (a line that is not JSON, with no ``custom_id``, a ``custom_id`` twice, another
``url`` than the batch's ``endpoint``, no ``body``) makes the batch ``failed`` with one error per
bad line (``errors.data[i].line``). The fault knobs of ``_enter`` (``fail_status``,
``latency_s``...) apply to each call of these endpoints as to any other.

Recorded, for tests: ``api.batches_made`` (batches created), ``api.batch_lines`` (every line
sent in a batch, as ``(custom_id, url, body)``), and ``api.single_calls`` (requests to the four
answering endpoints outside a batch).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from starlette.datastructures import UploadFile
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

if TYPE_CHECKING:
    from tests.fake_api import FakeAPI

ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/embeddings")
"""What a batch's lines may be sent to."""
LINE_SCOPE = "fake_api.batch_line"
"""Set in the scope of a line's call: ``FakeAPI._enter`` neither records nor faults it."""
MAX_FILE_BYTES = 200 * 1024 * 1024
"""OpenAI's bound on a batch input file."""
MAX_LINES = 50_000
"""OpenAI's bound on the lines of one batch."""
WINDOW_S = 24 * 3600
FINAL = frozenset({"completed", "failed", "expired", "cancelled"})
EXPIRED_MESSAGE = "This request could not be executed before the completion window expired."
_T = TypeVar("_T")


@dataclass
class _File:
    obj: dict[str, Any]
    content: bytes


@dataclass
class _Batch:
    obj: dict[str, Any]
    lines: list[dict[str, Any]]
    problems: list[dict[str, Any]]
    polls_left: int
    ready_at: float
    fail: str | None
    expire_after: int | None
    line_error: str | None
    extra: tuple[str, ...]
    polls: int = 0
    answered: list[str] = field(default_factory=list)


def _error(status: int, message: str, param: str | None = None) -> JSONResponse:
    kind = "invalid_request_error" if status < 500 else "server_error"
    code = "not_found" if status == 404 else None
    body = {"error": {"message": message, "type": kind, "param": param, "code": code}}
    return JSONResponse(body, status)


class FakeBatches:
    """The files and batches of one fake API, and the routes that serve them."""

    def __init__(self, api: FakeAPI) -> None:
        self.api = api
        self.files: dict[str, _File] = {}
        self.batches: dict[str, _Batch] = {}

    def reset(self) -> None:
        self.files.clear()
        self.batches.clear()

    def routes(self) -> list[Route]:
        return [
            Route("/v1/files", self.upload, methods=["POST"]),
            Route("/v1/files", self.list_files, methods=["GET"]),
            Route("/v1/files/{file_id}", self.file, methods=["GET"]),
            Route("/v1/files/{file_id}", self.delete_file, methods=["DELETE"]),
            Route("/v1/files/{file_id}/content", self.content, methods=["GET"]),
            Route("/v1/batches", self.create, methods=["POST"]),
            Route("/v1/batches", self.list_batches, methods=["GET"]),
            Route("/v1/batches/{batch_id}", self.retrieve, methods=["GET"]),
            Route("/v1/batches/{batch_id}/cancel", self.cancel, methods=["POST"]),
        ]

    # -- files ---------------------------------------------------------------------------------

    def _add_file(
        self, filename: str, purpose: str, content: bytes, expires_s: int | None
    ) -> _File:
        now = int(time.time())
        obj = {
            "id": self.api._next_id("file"),
            "object": "file",
            "bytes": len(content),
            "created_at": now,
            "expires_at": now + expires_s if expires_s else None,
            "filename": filename,
            "purpose": purpose,
            "status": "processed",
            "status_details": None,
        }
        made = self.files[obj["id"]] = _File(obj, content)
        return made

    async def upload(self, request: Request) -> Response:
        _, early = await self.api._enter(request, json_body=False)
        if early is not None:
            return early
        async with request.form(max_part_size=1024 * 1024) as form:
            purpose = form.get("purpose")
            given = form.get("file")
            seconds = form.get("expires_after[seconds]")
            anchor = form.get("expires_after[anchor]")
            content = await given.read() if isinstance(given, UploadFile) else None
            filename = given.filename if isinstance(given, UploadFile) else None
        if purpose != "batch":
            return _error(400, f"purpose {purpose!r} is not served here: only 'batch'", "purpose")
        if content is None:
            return _error(400, "a file is required", "file")
        if len(content) > MAX_FILE_BYTES:
            return _error(400, f"the file is over {MAX_FILE_BYTES} bytes", "file")
        expires_s: int | None = None
        if seconds is not None:
            if anchor != "created_at" or not str(seconds).isdigit():
                return _error(
                    400, "expires_after needs anchor created_at and seconds", "expires_after"
                )
            expires_s = int(str(seconds))
            if not 3600 <= expires_s <= 30 * 24 * 3600:
                return _error(400, "expires_after.seconds: 3600 to 2592000", "expires_after")
        made = self._add_file(filename or "upload.jsonl", "batch", content, expires_s)
        return JSONResponse(made.obj)

    async def _named(
        self, request: Request, table: Mapping[str, _T], key: str, what: str, param: str
    ) -> _T | Response:
        """The object of ``table`` that the path's ``key`` names, or the answer to send instead
        (a knob's, or a 404 "No such ``what`` object" naming ``param``)."""
        _, early = await self.api._enter(request, json_body=False)
        if early is not None:
            return early
        found = table.get(request.path_params[key])
        return found if found is not None else _error(404, f"No such {what} object", param)

    async def _file_of(self, request: Request) -> _File | Response:
        return await self._named(request, self.files, "file_id", "File", "id")

    async def list_files(self, request: Request) -> Response:
        _, early = await self.api._enter(request, json_body=False)
        if early is not None:
            return early
        data = [f.obj for f in reversed(self.files.values())]
        return JSONResponse({"object": "list", "data": data, "has_more": False})

    async def file(self, request: Request) -> Response:
        found = await self._file_of(request)
        if isinstance(found, Response):
            return found
        return JSONResponse(found.obj)

    async def delete_file(self, request: Request) -> Response:
        found = await self._file_of(request)
        if isinstance(found, Response):
            return found
        del self.files[found.obj["id"]]
        return JSONResponse({"id": found.obj["id"], "object": "file", "deleted": True})

    async def content(self, request: Request) -> Response:
        found = await self._file_of(request)
        if isinstance(found, Response):
            return found
        return Response(found.content, media_type="application/octet-stream")

    # -- batches -------------------------------------------------------------------------------

    async def create(self, request: Request) -> Response:
        body, early = await self.api._enter(request)
        if early is not None:
            return early
        refusal = self.api.batch_unsupported
        if refusal is not None:
            return _error(int(refusal), "Batch processing is not supported for this account.")
        source = self.files.get(str(body.get("input_file_id")))
        if source is None or source.obj["purpose"] != "batch":
            return _error(400, "input_file_id names no file of purpose 'batch'", "input_file_id")
        endpoint = body.get("endpoint")
        if endpoint not in ENDPOINTS:
            return _error(400, f"endpoint must be one of {', '.join(ENDPOINTS)}", "endpoint")
        if body.get("completion_window") != "24h":
            return _error(400, "completion_window must be '24h'", "completion_window")
        lines, problems = _parse_lines(source.content, endpoint)
        api, now = self.api, time.time()
        obj: dict[str, Any] = {
            "id": api._next_id("batch"),
            "object": "batch",
            "endpoint": endpoint,
            "errors": None,
            "input_file_id": source.obj["id"],
            "completion_window": "24h",
            "status": "validating",
            "output_file_id": None,
            "error_file_id": None,
            "created_at": int(now),
            "in_progress_at": None,
            "expires_at": int(now) + WINDOW_S,
            "finalizing_at": None,
            "completed_at": None,
            "failed_at": None,
            "expired_at": None,
            "cancelling_at": None,
            "cancelled_at": None,
            "request_counts": {"total": len(lines), "completed": 0, "failed": 0},
            "metadata": body.get("metadata"),
        }
        with api._lock:
            api.batches_made += 1
            api.batch_lines.extend((x["custom_id"], x["url"], x["body"]) for x in lines)
        self.batches[obj["id"]] = _Batch(
            obj=obj,
            lines=lines,
            problems=problems,
            polls_left=int(api.batch_polls),
            ready_at=time.monotonic() + float(api.batch_seconds),
            fail=api.batch_fail,
            expire_after=api.batch_expire_after,
            line_error=api.batch_line_error,
            extra=tuple(api.batch_output_extra),
        )
        return JSONResponse(obj)

    async def list_batches(self, request: Request) -> Response:
        _, early = await self.api._enter(request, json_body=False)
        if early is not None:
            return early
        batches = [b.obj for b in reversed(self.batches.values())]
        after = request.query_params.get("after")
        if after is not None:
            ids = [b["id"] for b in batches]
            batches = batches[ids.index(after) + 1 :] if after in ids else []
        limit = int(request.query_params.get("limit") or 20)
        page = batches[:limit]
        return JSONResponse(
            {
                "object": "list",
                "data": page,
                "first_id": page[0]["id"] if page else None,
                "last_id": page[-1]["id"] if page else None,
                "has_more": len(batches) > limit,
            }
        )

    async def _batch_of(self, request: Request) -> _Batch | Response:
        return await self._named(request, self.batches, "batch_id", "Batch", "batch_id")

    async def retrieve(self, request: Request) -> Response:
        batch = await self._batch_of(request)
        if isinstance(batch, Response):
            return batch
        await self._advance(batch)
        return JSONResponse(batch.obj)

    async def cancel(self, request: Request) -> Response:
        batch = await self._batch_of(request)
        if isinstance(batch, Response):
            return batch
        obj = batch.obj
        if obj["status"] in FINAL:
            return _error(409, f"Cannot cancel a batch with status '{obj['status']}'.", None)
        obj.update(status="cancelling", cancelling_at=int(time.time()))
        return JSONResponse(obj)

    # -- a batch's life ------------------------------------------------------------------------

    async def _advance(self, batch: _Batch) -> None:
        """One ``GET`` of the batch: move it on as its knobs say."""
        obj, now = batch.obj, int(time.time())
        batch.polls += 1
        if obj["status"] in FINAL:
            return
        if obj["status"] == "cancelling":
            obj.update(status="cancelled", cancelled_at=now)
            return
        if batch.problems:
            obj.update(status="failed", failed_at=now)
            obj["errors"] = {"object": "list", "data": batch.problems}
            return
        if batch.fail is not None:
            error = {"code": "batch_failed", "message": batch.fail, "param": None, "line": None}
            obj.update(status="failed", failed_at=now, errors={"object": "list", "data": [error]})
            return
        if batch.polls <= batch.polls_left or time.monotonic() < batch.ready_at:
            obj.update(status="in_progress", in_progress_at=obj["in_progress_at"] or now)
            return
        obj.update(in_progress_at=obj["in_progress_at"] or now, finalizing_at=now)
        output, errors = await self._run(batch)
        counts = {"total": len(batch.lines), "completed": len(output), "failed": len(errors)}
        text = [json.dumps(x) for x in output] + list(batch.extra)
        if text:
            made = self._add_file(f"{obj['id']}_output.jsonl", "batch_output", _jsonl(text), None)
            obj["output_file_id"] = made.obj["id"]
        if errors:
            out = _jsonl([json.dumps(x) for x in errors])
            made = self._add_file(f"{obj['id']}_error.jsonl", "batch_output", out, None)
            obj["error_file_id"] = made.obj["id"]
        obj["request_counts"] = counts
        if batch.expire_after is not None:
            obj.update(status="expired", expired_at=now)
        else:
            obj.update(status="completed", completed_at=now)

    async def _run(self, batch: _Batch) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """Each line answered (or not, as the knobs say): the output and the error lines."""
        output: list[dict[str, Any]] = []
        errors: list[dict[str, Any]] = []
        pattern = re.compile(batch.line_error) if batch.line_error is not None else None
        for index, line in enumerate(batch.lines):
            cid = line["custom_id"]
            row: dict[str, Any] = {"id": self.api._next_id("batch_req"), "custom_id": cid}
            if batch.expire_after is not None and index >= batch.expire_after:
                error = {"code": "batch_expired", "message": EXPIRED_MESSAGE}
                errors.append({**row, "response": None, "error": error})
                continue
            if pattern is not None and pattern.search(cid):
                status, body = 400, json.loads(_error(400, "the line was refused").body)
            else:
                status, body = await self._answer(line["url"], line["body"])
            response = {"status_code": status, "request_id": self.api._next_id("req"), "body": body}
            (output if status == 200 else errors).append(
                {**row, "response": response, "error": None}
            )
            batch.answered.append(cid)
        return output, errors

    async def _answer(self, url: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """The fake's own answer to one line, as its endpoint gives it (never streamed)."""
        handler = self.api.line_handlers()[url]
        raw = json.dumps({k: v for k, v in body.items() if k not in ("stream", "stream_options")})
        sent = False

        async def receive() -> dict[str, Any]:
            nonlocal sent
            if sent:
                return {"type": "http.disconnect"}
            sent = True
            return {"type": "http.request", "body": raw.encode(), "more_body": False}

        scope = {
            "type": "http",
            "method": "POST",
            "path": url,
            "headers": [(b"content-type", b"application/json")],
            "query_string": b"",
            LINE_SCOPE: True,
        }
        response = await handler(Request(scope, receive))
        if not isinstance(response, JSONResponse):
            return 500, json.loads(_error(500, "the line's answer was not JSON").body)
        return response.status_code, json.loads(response.body)


def _jsonl(lines: list[str]) -> bytes:
    return "".join(line + "\n" for line in lines).encode()


def _parse_lines(
    content: bytes, endpoint: str
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The lines of an input file, and an error for each bad one (OpenAI's ``errors.data``)."""
    lines: list[dict[str, Any]] = []
    problems: list[dict[str, Any]] = []
    seen: set[str] = set()

    def bad(number: int, code: str, message: str, param: str | None = None) -> None:
        problems.append({"code": code, "message": message, "param": param, "line": number})

    for number, text in enumerate(content.decode("utf-8", "replace").splitlines(), start=1):
        if not text.strip():
            continue
        try:
            line = json.loads(text)
        except ValueError:
            bad(number, "invalid_json_line", "This line is not parseable as valid JSON.")
            continue
        if not isinstance(line, dict):
            bad(number, "invalid_json_line", "This line is not a JSON object.")
            continue
        cid = line.get("custom_id")
        if not isinstance(cid, str) or not cid:
            bad(number, "missing_required_parameter", "custom_id is required.", "custom_id")
        elif cid in seen:
            bad(number, "duplicate_custom_id", f"The custom_id '{cid}' is used twice.", "custom_id")
        elif line.get("url") != endpoint:
            bad(number, "mismatched_endpoint", f"The url must be the batch's {endpoint}.", "url")
        elif not isinstance(line.get("body"), dict):
            bad(number, "missing_required_parameter", "body is required.", "body")
        else:
            seen.add(cid)
            lines.append({"custom_id": cid, "url": line["url"], "body": line["body"]})
    if len(lines) > MAX_LINES:
        bad(MAX_LINES + 1, "too_many_requests", f"A batch holds at most {MAX_LINES} requests.")
    return lines, problems
