"""``GET``/``DELETE /v1/responses/{id}`` and ``GET /v1/responses/{id}/input_items``: the stored
Responses (:class:`proxy.serving.responses_state.ResponsesState`, which says who may read which)
read and deleted over HTTP, with OpenAI's list pagination; ``POST /v1/responses/{id}/cancel``:
a background response cancelled (:mod:`proxy.serving.background_responses`).
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from proxy.errors import BadRequest
from proxy.server.lookup import services_of
from proxy.server.sse import stream_of
from proxy.serving.responses import background_stream
from proxy.serving.responses_state import ResponsesState

MAX_LIMIT = 100  # the most items one page of ``input_items`` holds


def _state(request: Request) -> ResponsesState:
    state = services_of(request).responses
    if state is None:
        raise RuntimeError("the app was built without stored responses")
    return state


async def one(request: Request) -> Response:
    """``/v1/responses/{response_id}``: GET reads it, DELETE deletes it."""
    if request.method == "DELETE":
        return await delete(request)
    return await retrieve(request)


async def retrieve(request: Request) -> Response:
    """``GET /v1/responses/{response_id}``: the stored response object; with ``stream=true``
    (a background response), its events from ``starting_after`` + 1 once it has ended."""
    if request.query_params.get("stream", "false").lower() == "true":
        after = _starting_after(request.query_params.get("starting_after"))
        rid = request.path_params["response_id"]
        return stream_of(await background_stream(services_of(request), request, rid, after))
    found = await _state(request).visible(request, request.path_params["response_id"])
    return JSONResponse(found.response)


async def cancel(request: Request) -> Response:
    """``POST /v1/responses/{response_id}/cancel``: the background response, cancelled when it
    was queued or running, else as it is; not a background response: a 400."""
    background = services_of(request).background
    if background is None:
        raise RuntimeError("the app was built without background responses")
    found = await background.cancel(request, request.path_params["response_id"])
    return JSONResponse(found)


def _starting_after(given: str | None) -> int:
    if given is None:
        return -1
    try:
        return int(given)
    except ValueError:
        raise BadRequest(
            f"starting_after {given!r}: expected an integer", param="starting_after"
        ) from None


async def delete(request: Request) -> Response:
    """``DELETE /v1/responses/{response_id}``: OpenAI's deleted object."""
    state = _state(request)
    found = await state.visible(request, request.path_params["response_id"])
    await state.remove(found.id)
    return JSONResponse({"id": found.id, "object": "response", "deleted": True})


async def list_input_items(request: Request) -> Response:
    """``GET /v1/responses/{response_id}/input_items``, with OpenAI's list pagination: ``limit``
    (1 to 100, 20), ``order`` (``desc``, the default, or ``asc``), ``after`` and ``before``
    (item ids of this list)."""
    query = request.query_params
    limit = _limit(query.get("limit"))
    order = query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise BadRequest(f"order {order!r}: expected 'asc' or 'desc'", param="order")
    found = await _state(request).visible(request, request.path_params["response_id"])
    items = list(found.input_items)
    if order == "desc":
        items.reverse()
    ids = [item.get("id") for item in items]
    start, end = 0, len(items)
    for param in ("after", "before"):
        given = query.get(param)
        if given is None:
            continue
        if given not in ids:
            raise BadRequest(f"{param} {given!r}: not an item of this list", param=param)
        if param == "after":
            start = ids.index(given) + 1
        else:
            end = ids.index(given)
    page = items[start:end][:limit] if start < end else []
    return JSONResponse(
        {
            "object": "list",
            "data": page,
            "first_id": page[0].get("id") if page else None,
            "last_id": page[-1].get("id") if page else None,
            "has_more": start + len(page) < end,
        }
    )


def _limit(given: str | None) -> int:
    if given is None:
        return 20
    try:
        limit = int(given)
    except ValueError:
        limit = 0
    if not 1 <= limit <= MAX_LIMIT:
        raise BadRequest(
            f"limit {given!r}: expected an integer from 1 to {MAX_LIMIT}", param="limit"
        )
    return limit
