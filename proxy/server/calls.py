"""A request as the services' :class:`~proxy.serving.call.Call`, and what they return as a
response: the one place where an endpoint's HTTP meets its service.

    call_of   the request's id and key (what the middleware put on its state), the headers the
              cascade reads, and its body to read (a client that leaves in the middle of it is
              a :class:`~proxy.serving.call.BodyCut`)
    respond   an :class:`~proxy.serving.call.Answer` as JSON (or the upstream's bytes as they
              came), :class:`~proxy.serving.call.Events` as an
              :class:`~proxy.server.sse.EventStream`
    Service   what an endpoint's :class:`~proxy.server.endpoints.Mounted` hands each call to
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response

from proxy.routing.router import ROUTE_HEADER
from proxy.server.sse import stream_of
from proxy.serving.call import BodyCut, Call, Check, Events, Outcome
from proxy.serving.services import Services

MIN_QUALITY_HEADER = "x-frugal-min-quality"

Service = Callable[[Call], Awaitable[Outcome]]


def call_of(request: Request, services: Services) -> Call:
    """``request`` as a :class:`Call`; its body is read (and checked) when the service asks."""

    async def read(check: Check) -> dict[str, Any]:
        try:
            return await services.bodies.read(request, check)
        except ClientDisconnect as exc:
            raise BodyCut from exc

    return Call(
        request_id=request.state.request_id,
        key_name=getattr(request.state, "key_name", None),
        client=getattr(request.state, "client_key", None),  # set by the auth middleware
        route=request.headers.get(ROUTE_HEADER),
        min_quality=request.headers.get(MIN_QUALITY_HEADER),
        cache_control=request.headers.get("cache-control", ""),
        read=read,
        caller=request,
    )


def respond(outcome: Outcome) -> Response:
    """What a service returned, as the response that sends it."""
    if isinstance(outcome, Events):
        return stream_of(outcome)
    if outcome.body is not None:
        return JSONResponse(outcome.body, status_code=outcome.status, headers=outcome.headers)
    if outcome.raw is not None:
        return Response(
            outcome.raw,
            status_code=outcome.status,
            media_type="application/json",
            headers=outcome.headers,
        )
    return Response(status_code=outcome.status, headers=outcome.headers)
