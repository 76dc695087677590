"""``/v1/batches``: OpenAI's Batch API over the ledger's batch store
(:class:`~proxy.serving.batches_state.BatchesState`).

``POST /v1/batches`` makes a batch of one of the key's input files (``input_file_id``,
``endpoint``, ``completion_window`` ``"24h"``, ``metadata``): ``in_progress`` with its lines,
or ``failed`` with the file's ``errors`` when a line is bad; the batch runner answers the lines.
``GET /v1/batches/{batch_id}`` reads one, ``GET /v1/batches`` lists them newest first
(``after``, ``limit``), ``POST /v1/batches/{batch_id}/cancel`` cancels one. A key sees its own
batches; another's is a 404 naming ``batch_id``.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from proxy.errors import BadRequest
from proxy.ledger.batches.store import MAX_LIST
from proxy.server.batch.files import after_param, int_param, page, query_param, state_of
from proxy.serving.batches_state import creator
from proxy.serving.clients import own_key

CREATE_PARAMS = ("input_file_id", "endpoint", "completion_window", "metadata")
MAX_CREATE_BYTES = 64 * 1024  # a create request's JSON body (its metadata is the most of it)


async def collection(request: Request) -> Response:
    """``/v1/batches``: POST makes one, GET lists."""
    if request.method == "POST":
        return await create(request)
    return await list_batches(request)


async def _body(request: Request) -> dict[str, Any]:
    raw = await request.body()
    if len(raw) > MAX_CREATE_BYTES:
        raise BadRequest(f"The request body passes {MAX_CREATE_BYTES} bytes.", param="metadata")
    try:
        body = json.loads(raw)
    except ValueError:
        raise BadRequest("The request body is not valid JSON.", param=None) from None
    if not isinstance(body, dict):
        raise BadRequest("The request body must be a JSON object.", param=None)
    for name in body:
        if name not in CREATE_PARAMS:
            raise BadRequest(f"Unrecognized request argument supplied: {name[:64]}", param=name)
    for name in CREATE_PARAMS[:3]:
        if not isinstance(body.get(name), str):
            raise BadRequest(f"{name} is required and must be a string.", param=name)
    return body


async def create(request: Request) -> Response:
    state = state_of(request)
    body = await _body(request)
    batch = await state.call(
        state.batches.create,
        creator(request),
        input_file_id=body["input_file_id"],
        endpoint=body["endpoint"],
        completion_window=body["completion_window"],
        metadata=body.get("metadata"),
    )
    return JSONResponse(batch.as_openai())


async def retrieve(request: Request) -> Response:
    state = state_of(request)
    found = await state.visible_batch(request, request.path_params["batch_id"])
    return JSONResponse(found.as_openai())


async def cancel(request: Request) -> Response:
    state = state_of(request)
    found = await state.visible_batch(request, request.path_params["batch_id"])
    batch = await state.call(state.batches.cancel, found.id)
    return JSONResponse(batch.as_openai())


async def list_batches(request: Request) -> Response:
    state = state_of(request)
    limit = int_param(query_param(request, "limit"), "limit", 20, MAX_LIST)
    after = await after_param(request, state.batches.get, "batch")
    batches, more = await state.call(
        state.batches.list_batches,
        creator(request),
        anyone=own_key(request.scope) is None,
        after=after,
        limit=limit,
    )
    return JSONResponse(page([b.as_openai() for b in batches], more))
