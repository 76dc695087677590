"""``/v1/files``: OpenAI's Files API over the ledger's file store
(:class:`~proxy.serving.batches_state.BatchesState`).

``POST /v1/files`` takes the form OpenAI's SDKs send (:mod:`proxy.server.batch.uploads`). Before a
byte is stored, the upload is held to the key's room for files (``[batch]
file_quota_bytes`` less what it keeps): a declared ``Content-Length`` past that room (plus
:data:`~proxy.server.batch.uploads.FORM_SLACK`) is refused before the body is read, and a body
without one is refused as soon as it passes it; the store then checks the file itself against
the quota and OpenAI's sizes (200 MB for ``batch``, 512 MB otherwise) in the transaction that
writes it. ``GET /v1/files`` lists (``purpose``, ``after``, ``limit``, ``order``), ``GET
/v1/files/{file_id}`` reads one, ``.../content`` its bytes (streamed from the database a slice
at a time), ``DELETE`` deletes it. A key sees
its own files; another's is a 404 naming ``file_id``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from proxy.errors import BadRequest
from proxy.ledger.batches.files import MAX_LIST
from proxy.ledger.batches.objects import MAX_FILE_BYTES, PURPOSES
from proxy.server.batch.uploads import FORM_SLACK, Part, boundary_of, parse_form, read_body
from proxy.server.lookup import services_of
from proxy.serving.batches_state import BatchesState, creator, may_read
from proxy.serving.clients import own_key


def state_of(request: Request) -> BatchesState:
    state = services_of(request).batches
    if state is None:
        raise RuntimeError("the app was built without files and batches")
    return state


def page(data: list[dict[str, object]], has_more: bool) -> dict[str, object]:
    """OpenAI's list object."""
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": has_more,
    }


def int_param(given: str | None, name: str, default: int, high: int) -> int:
    if given is None:
        return default
    try:
        value = int(given)
    except ValueError:
        value = 0
    if not 1 <= value <= high:
        raise BadRequest(f"{name} {given[:32]!r}: expected an integer from 1 to {high}", param=name)
    return value


def query_param(request: Request, name: str) -> str | None:
    """A query parameter given at most once (twice: a 400 naming it)."""
    given = request.query_params.getlist(name)
    if len(given) > 1:
        raise BadRequest(f"{name} is given {len(given)} times; give it once.", param=name)
    return given[0] if given else None


async def after_param(request: Request, get: Callable[[str], Any], what: str) -> str | None:
    """The ``after`` of a list: an id the key may read (``get`` finds it in its store), else a
    400 naming ``after``; None when not given."""
    after = query_param(request, "after")
    if after is not None:
        found = await state_of(request).call(get, after)
        if found is None or not may_read(request, found.owner):
            raise BadRequest(f"No {what} {after[:64]!r} to list after.", param="after")
    return after


def _quota_error(room: int) -> BadRequest:
    return BadRequest(
        f"This upload would pass this key's quota for files: it may store {room} more bytes "
        "([batch] file_quota_bytes). Delete files it no longer needs "
        "(DELETE /v1/files/{file_id}).",
        param="file",
        code="file_quota_exceeded",
    )


async def collection(request: Request) -> Response:
    """``/v1/files``: POST uploads, GET lists."""
    if request.method == "POST":
        return await upload(request)
    return await list_files(request)


async def upload(request: Request) -> Response:
    state = state_of(request)
    owner = creator(request)
    boundary = boundary_of(request.headers.get("content-type"))
    room = await state.call(state.files.room, owner)
    bound = min(room, MAX_FILE_BYTES) + FORM_SLACK
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > bound:
        raise _quota_error(room)
    body = await read_body(request.stream(), bound, _quota_error(room))
    form = parse_form(body, boundary)
    given = form.get("file")
    if given is None:
        raise BadRequest("The form has no 'file' part.", param="file")
    if not given.filename:
        raise BadRequest("The 'file' part must have a filename.", param="file")
    if "purpose" not in form:
        raise BadRequest("The form has no 'purpose' field.", param="purpose")
    purpose = form["purpose"].content.decode("utf-8", "replace").strip()
    expires_after = _expires_after(form)
    stored = await state.call(
        state.files.put,
        owner,
        purpose=purpose,
        filename=given.filename[:512],
        content=given.content,
        expires_after=expires_after,
    )
    return JSONResponse(stored.as_openai())


def _expires_after(form: dict[str, Part]) -> dict[str, object] | None:
    anchor, seconds = form.get("expires_after[anchor]"), form.get("expires_after[seconds]")
    if anchor is None and seconds is None:
        return None
    if anchor is None:
        raise BadRequest("expires_after[anchor] is missing.", param="expires_after[anchor]")
    if seconds is None:
        raise BadRequest("expires_after[seconds] is missing.", param="expires_after[seconds]")
    text = seconds.content.decode("utf-8", "replace").strip()
    if not text.isdigit():
        raise BadRequest(
            "expires_after[seconds] must be an integer.", param="expires_after[seconds]"
        )
    return {"anchor": anchor.content.decode("utf-8", "replace").strip(), "seconds": int(text)}


async def list_files(request: Request) -> Response:
    state = state_of(request)
    limit = int_param(query_param(request, "limit"), "limit", MAX_LIST, MAX_LIST)
    purpose = query_param(request, "purpose")
    if purpose is not None and purpose not in PURPOSES:
        raise BadRequest(f"purpose must be one of {', '.join(PURPOSES)}.", param="purpose")
    after = await after_param(request, state.files.get, "file")
    files, more = await state.call(
        state.files.list_files,
        creator(request),
        anyone=own_key(request.scope) is None,
        purpose=purpose,
        after=after,
        limit=limit,
        order=query_param(request, "order") or "desc",
    )
    return JSONResponse(page([f.as_openai() for f in files], more))


async def one(request: Request) -> Response:
    """``/v1/files/{file_id}``: GET reads it, DELETE deletes it."""
    state = state_of(request)
    found = await state.visible_file(request, request.path_params["file_id"])
    if request.method == "DELETE":
        await state.call(state.files.delete, found.id)
        return JSONResponse({"id": found.id, "object": "file", "deleted": True})
    return JSONResponse(found.as_openai())


async def content(request: Request) -> Response:
    """``GET /v1/files/{file_id}/content``: the file's bytes, streamed a slice at a time from
    the database (:meth:`~proxy.ledger.batches.files.FileStore.chunk`), so that a large file is
    never held whole in memory. Its ``Content-Length`` is the file's size; a file deleted while
    it is read ends short (the client sees a cut body, never another file's bytes)."""
    state = state_of(request)
    found = await state.visible_file(request, request.path_params["file_id"])
    first = await state.call(state.files.chunk, found.id, 0)
    if first is None:  # deleted between the two reads
        return await one(request)

    async def chunks() -> AsyncIterator[bytes]:
        part: bytes | None = first
        offset = 0
        while part:
            yield part
            offset += len(part)
            if offset >= found.bytes:
                return
            part = await state.call(state.files.chunk, found.id, offset)

    return StreamingResponse(
        chunks(),
        media_type="application/octet-stream",
        headers={"content-length": str(found.bytes)},
    )
