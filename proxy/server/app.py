"""The Starlette application: ``create_app(settings)``, assembled from its parts.

Nothing lives at module level. :func:`create_app` puts together the routes (:func:`_routes`),
the lifespan (:func:`proxy.server.lifespan.lifespan`: the services it starts, in order, and the
orderly stop) and the middleware (:func:`_add_middleware`). The routes are read from the one
list of them, :data:`proxy.server.routes.ROUTES`, which ``/openapi.json`` is written from too.
"""

from __future__ import annotations

import re
import uuid

import structlog
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from proxy.config import Settings
from proxy.engine.local_engine import LocalEngine
from proxy.errors import ProxyError
from proxy.models.cache import resolve as resolve_model
from proxy.server.auth import AuthMiddleware, RequestGuard
from proxy.server.disconnect import CancelOnDisconnect
from proxy.server.endpoints import ENDPOINTS, Endpoint, Mounted, both_paths
from proxy.server.lifespan import lifespan
from proxy.server.limits import LimitsMiddleware
from proxy.server.render import exception_handlers, render, unexpected
from proxy.server.routes import ROUTES, served_paths
from proxy.server.shares import KeyShareMiddleware, KeyShares
from proxy.serving.call import BodyCut
from proxy.serving.in_flight import InFlight

log = structlog.get_logger("frugal.app")


REQUEST_ID_RE = re.compile(r"[A-Za-z0-9._-]{1,128}")


class RequestIdMiddleware:
    """Gives every request an id and echoes it on every response, errors included.

    The id is the client's own ``x-request-id`` when that is 1 to 128 of ``A-Z a-z 0-9 . _ -``
    (so it is safe in logs, headers and the ledger), else a fresh uuid4 hex.

    It is also the last line of defence: an exception that no handler took becomes an
    :class:`~proxy.errors.InternalError` (OpenAI's 500) here, inside the middleware, so that the
    500 carries the id too (Starlette's own ``Exception`` handler runs outside every middleware).
    :func:`proxy.server.render.unexpected` logs it once, with the request id, the exception's class
    and where it was raised: never its message or a traceback's locals, which may hold request
    content. It is not raised further, so the server does not log it again. If the response had
    already started, the connection is closed unfinished.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = ""
        for name, value in scope.get("headers", ()):
            if name == b"x-request-id":
                request_id = value.decode("latin-1")
                break
        if not REQUEST_ID_RE.fullmatch(request_id):
            request_id = uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = request_id
        encoded = request_id.encode("latin-1")
        started = False

        async def send_with_id(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                headers = [(k, v) for k, v in message.get("headers", []) if k != b"x-request-id"]
                headers.append((b"x-request-id", encoded))
                message["headers"] = headers
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        except ProxyError as exc:  # raised by a middleware, outside the handlers
            if not started:
                await render(exc, request_id)(scope, receive, send_with_id)
        except (ClientDisconnect, BodyCut):  # the client left in the middle of its body: fine
            log.info("client_gone", request_id=request_id, during="request_body")
        except Exception as exc:  # noqa: BLE001 - rendered and logged once, here
            error = unexpected(exc, request_id, scope, started=started)
            if not started:
                await render(error, request_id)(scope, receive, send_with_id)


def create_app(settings: Settings, *, engine: LocalEngine | None = None) -> Starlette:
    """The app for ``settings``: its routes, its lifespan (which builds the services) and its
    middleware. ``engine``: a started engine to serve with, which the app does not stop; by
    default the lifespan starts its own."""
    settings = resolve_model(settings)  # [local] model = "REPO:QUANT": the cache, no network
    in_flight = InFlight()  # counted by the limits middleware, made before the lifespan runs
    mounted = tuple(Mounted(endpoint) for endpoint in ENDPOINTS)  # filled by the lifespan
    app = Starlette(
        routes=_routes(settings, mounted),
        exception_handlers=exception_handlers(),
        lifespan=lifespan(settings, in_flight, engine, mounted),
    )
    _add_middleware(app, settings, in_flight)
    return app


# The endpoints a client that leaves before its answer is ready cancels (CancelOnDisconnect).
_CANCELLABLE = tuple(p for e in ENDPOINTS if e.cascade for p in both_paths(e.path))


def _routes(settings: Settings, mounted: tuple[Mounted, ...]) -> list[Route]:
    """A Starlette route for each path of :data:`~proxy.server.routes.ROUTES` serves, with its
    methods: an endpoint's handler is its :class:`Mounted`'s (filled by the lifespan), a page's
    is made here, once (the dashboard's files are read now, from proxy/server/static/)."""
    places = {m.endpoint.name: m for m in mounted}
    return [
        Route(path, handler, methods=list(route.methods))
        for route in ROUTES
        for handler in [
            places[route.name].serve if isinstance(route, Endpoint) else route.make(settings)
        ]
        for path in served_paths(route)
    ]


def _add_middleware(app: Starlette, settings: Settings, in_flight: InFlight) -> None:
    """The middleware, added innermost first.

    Outermost: the request id (and the 500 for anything unexpected), then auth (a stranger
    takes no concurrency slot), then the guard (JSON only; a loopback Host when keyless), then
    the key's share and rpm (from the headers: a key at its share takes no slot either), then
    limits. Innermost: a client that leaves before its answer is ready cancels the handler (and
    so its place in the engine's queue, or its generation).
    """
    app.add_middleware(CancelOnDisconnect, paths=_CANCELLABLE)
    app.add_middleware(LimitsMiddleware, settings=settings.server, in_flight=in_flight)
    # The JSON-body check applies where a POST is served; elsewhere a POST is the router's 405.
    # The same paths serve models, and count against a key's rpm.
    json_paths = {
        r.path for r in app.routes if isinstance(r, Route) and "POST" in (r.methods or ())
    }
    app.add_middleware(
        KeyShareMiddleware, settings=settings.server, shares=KeyShares(), rate_paths=json_paths
    )
    app.add_middleware(RequestGuard, settings=settings.server, json_paths=json_paths)
    app.add_middleware(AuthMiddleware)
    app.add_middleware(RequestIdMiddleware)
