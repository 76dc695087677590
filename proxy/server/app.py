"""The Starlette application: ``create_app(settings)``, assembled from its parts.

Nothing lives at module level. :func:`create_app` puts together the routes (:func:`_routes`),
the lifespan (:func:`proxy.server.lifespan.lifespan`: the services it starts, in order, and the
orderly stop) and the middleware (:func:`_add_middleware`). The endpoints that are not a
handler's live here too: ``/healthz``, ``/v1/models`` and ``/openapi.json``.
"""

from __future__ import annotations

import re
import time
import uuid
from typing import Any

import structlog
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from proxy.config import Settings
from proxy.engine.local_engine import LocalEngine
from proxy.engine.model_files import ModelLoadError, bundled_model_path
from proxy.errors import ProxyError
from proxy.ledger.db.location import from_settings
from proxy.models.cache import blob_sha256
from proxy.models.cache import resolve as resolve_model
from proxy.models.gate_status import described, weights_tag
from proxy.protocol.params import LOCAL_ALIAS
from proxy.server import batches, files, scrape, stored_responses
from proxy.server.auth import AuthMiddleware, RequestGuard
from proxy.server.dashboard import Dashboard
from proxy.server.disconnect import CancelOnDisconnect
from proxy.server.endpoints import ENDPOINTS, Mounted, both_paths
from proxy.server.lifespan import lifespan
from proxy.server.limits import LimitsMiddleware
from proxy.server.lookup import services_of
from proxy.server.openapi import openapi_spec
from proxy.server.render import exception_handlers, render, unexpected
from proxy.server.report import ReportEndpoint
from proxy.server.shares import KeyShareMiddleware, KeyShares
from proxy.serving.clients import sees_everything
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
        except ClientDisconnect:  # the client left in the middle of its body: not an error
            log.info("client_gone", request_id=request_id, during="request_body")
        except Exception as exc:  # noqa: BLE001 - rendered and logged once, here
            error = unexpected(exc, request_id, scope, started=started)
            if not started:
                await render(error, request_id)(scope, receive, send_with_id)


def _gate(engine: LocalEngine, settings: Settings) -> dict[str, Any]:
    """The quality gate's weights: calibrated for the served model, or the shipped prior
    fitted to SmolLM2 (``proxy/models/gate_status.py``). For a model from the hub cache, whose
    SHA-256 is its blob's name, the weights file's tag is read now (so an ``auto_calibrate``
    refit shows at once); for another file, what the worker loaded at start (hashing it here
    would hold the event loop)."""
    weights_path = settings.quality.weights_path
    calibrated = bool((engine.info.get("weights") or {}).get("calibrated"))
    sha = blob_sha256(engine.model_path) if engine.model_path else None
    if sha is not None and weights_path:
        calibrated = weights_tag(weights_path) == sha
    try:
        bundled = engine.model_path == bundled_model_path()
    except ModelLoadError:
        bundled = False
    return described(calibrated, weights_path, bundled=bundled).as_dict()


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


async def _openapi(request: Request) -> Response:
    return JSONResponse(openapi_spec())


async def _models(request: Request) -> Response:
    """``GET /v1/models``: ``local``, then each model the config names (the fallback's
    mappings, the per-model thresholds, ``[pricing]``), then the upstream's own list when it
    can be read (:mod:`proxy.upstream.model_list`: cached, bounded), each name once."""
    services = services_of(request)
    settings = services.settings
    created = int(services.started_at)
    named = [
        *services.upstream.model_ids(),
        *settings.quality.models,
        *settings.pricing,
    ]
    data = [{"id": LOCAL_ALIAS, "object": "model", "created": created, "owned_by": "frugal"}]
    seen = {LOCAL_ALIAS}
    for name in [*named, *await services.upstream.listed_models()]:
        if name not in seen:
            seen.add(name)
            data.append({"id": name, "object": "model", "created": created, "owned_by": "api"})
    return JSONResponse({"object": "list", "data": data})


async def _healthz(request: Request) -> Response:
    """``GET /healthz``: 200 while the engine is ready or the API can answer, else 503; the
    status alone for a client key or none, the details for an admin key."""
    services = services_of(request)
    settings = services.settings
    upstream = services.upstream
    engine_health = services.engine.health()
    fallback = {
        "configured": upstream.enabled,
        "api_base": settings.fallback.api_base if upstream.enabled else None,
        "mode": "cascade" if upstream.enabled else "local_only",
    }
    ok = engine_health["state"] == "ready"
    status = 200 if ok or upstream.enabled else 503
    if not sees_everything(request.scope):
        # Open to health checks, which carry no key, and to client keys: the status, not the
        # server's details (its upstream, its ledger), which an admin key reads.
        return JSONResponse({"status": "ok" if ok else "degraded"}, status_code=status)
    body: dict[str, Any] = {
        "status": "ok" if ok else "degraded",
        "engine": engine_health,
        "fallback": fallback,
        "quality_threshold": settings.quality.threshold,
        "quality_thresholds_by_model": settings.quality.models,
        "stream_mode": settings.router.stream_mode,
        "gate": _gate(services.engine, settings),
        "routing": services.router.health(),
        "audit": services.audit.health() if services.audit is not None else None,
        "threshold_in_force": (
            services.audit.threshold_in_force() if services.audit is not None else None
        ),
        "ledger": {
            "path": from_settings(settings.ledger).label,
            **services.ledger.health(),
        },
        "budgets": services.quotas.health() if services.quotas is not None else None,
        "uptime_s": round(time.time() - services.started_at, 1),
    }
    degraded = [  # the database is away: rows are held, budgets refuse the API (503)
        part
        for part in ("ledger", "budgets")
        if isinstance(body[part], dict) and body[part].get("state") == "degraded"
    ]
    if degraded and body["status"] == "ok":
        body["status"] = "degraded"
        body["degraded"] = [f"{part}: {body[part].get('reason')}" for part in degraded]
    return JSONResponse(body, status_code=status)


# The endpoints a client that leaves before its answer is ready cancels (CancelOnDisconnect).
_CANCELLABLE = tuple(p for e in ENDPOINTS if e.cascade for p in both_paths(e.path))


def _routes(settings: Settings, mounted: tuple[Mounted, ...]) -> list[Route]:
    """Every path the app serves, each with and without ``/v1`` where OpenAI's clients use
    both (each endpoint's handler is its :class:`Mounted`'s, filled by the lifespan); the
    dashboard's files are read here, once (proxy/server/static/)."""
    dashboard = Dashboard()
    reports = ReportEndpoint(settings)
    return [
        *(
            Route(path, m.serve, methods=["POST"])
            for m in mounted
            for path in both_paths(m.endpoint.path)
        ),
        Route("/v1/responses/{response_id}", stored_responses.one, methods=["GET", "DELETE"]),
        Route("/responses/{response_id}", stored_responses.one, methods=["GET", "DELETE"]),
        Route("/v1/responses/{response_id}/cancel", stored_responses.cancel, methods=["POST"]),
        Route("/responses/{response_id}/cancel", stored_responses.cancel, methods=["POST"]),
        Route("/v1/responses/{response_id}/input_items", stored_responses.list_input_items),
        Route("/responses/{response_id}/input_items", stored_responses.list_input_items),
        *(
            route
            for prefix in ("/v1", "")
            for route in (
                Route(f"{prefix}/files", files.collection, methods=["GET", "POST"]),
                Route(f"{prefix}/files/{{file_id}}", files.one, methods=["GET", "DELETE"]),
                Route(f"{prefix}/files/{{file_id}}/content", files.content, methods=["GET"]),
                Route(f"{prefix}/batches", batches.collection, methods=["GET", "POST"]),
                Route(f"{prefix}/batches/{{batch_id}}", batches.retrieve, methods=["GET"]),
                Route(f"{prefix}/batches/{{batch_id}}/cancel", batches.cancel, methods=["POST"]),
            )
        ),
        Route("/openapi.json", _openapi, methods=["GET"]),
        Route("/v1/models", _models, methods=["GET"]),
        Route("/models", _models, methods=["GET"]),
        Route("/healthz", _healthz, methods=["GET"]),
        Route("/metrics", scrape.endpoint, methods=["GET"]),
        Route("/v1/frugal/report", reports.get, methods=["GET"]),
        Route("/dashboard", dashboard.page, methods=["GET"]),
        Route("/dashboard/{name}", dashboard.asset, methods=["GET"]),
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
