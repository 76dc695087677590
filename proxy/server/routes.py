"""Every route the app serves, each declared once with its OpenAPI entry.

:data:`ROUTES` is the one list. It opens with the endpoints that answer requests
(:data:`proxy.server.endpoints.ENDPOINTS`: ``POST``, their handlers made by the lifespan), then
every other route, a :class:`Page` each: its path, the handler made for it when the app is
assembled, and its OpenAPI path item, whose operations are the methods it is served for.
``app.py`` makes the app's routes from this list (each ``/v1`` path again without ``/v1``
where the route is ``bare``), and :func:`openapi_spec` writes ``/openapi.json``'s paths from
the same entries, so a route and its description cannot part: a new ``GET`` route is one
:class:`Page` here (``docs/architecture.md``, "A GET route"). ``tests/server/test_routes.py``
holds the app's routes and the document's paths equal.

The handlers of no other module live here too: ``/v1/models``, ``/healthz`` and
``/openapi.json``.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from proxy.config import Settings
from proxy.engine.local_engine import LocalEngine
from proxy.engine.model_files import ModelLoadError, bundled_model_path
from proxy.ledger.db.location import from_settings
from proxy.models.cache import blob_sha256
from proxy.models.gate_status import described, weights_tag
from proxy.protocol.params import LOCAL_ALIAS
from proxy.protocol.shapes import obj
from proxy.server import dashboard, report, scrape, stored_responses
from proxy.server.batch import batches, files
from proxy.server.batch import openapi as batch_openapi
from proxy.server.endpoints import ENDPOINTS, Endpoint
from proxy.server.lookup import services_of
from proxy.server.openapi.document import openapi_document
from proxy.server.openapi.parts import LIST_PARAMETERS, REASONS, answer, errors, path_id
from proxy.serving.clients import sees_everything

Handler = Callable[[Request], Awaitable[Response]]
OPERATIONS = ("get", "put", "post", "delete", "patch")  # the keys of a path item that are methods


@dataclass(frozen=True, kw_only=True)
class Page:
    """A route that is not an endpoint's."""

    path: str  # as ``/openapi.json`` names it
    make: Callable[[Settings], Handler]  # its handler, made once when the app is assembled
    openapi: dict[str, Any]  # its OpenAPI path item: an operation per method it is served for
    bare: bool = True  # a ``/v1`` path served without ``/v1`` too

    @property
    def methods(self) -> tuple[str, ...]:
        return tuple(key.upper() for key in self.openapi if key in OPERATIONS)


Route = Endpoint | Page


def served_paths(route: Route) -> tuple[str, ...]:
    """The paths ``route`` is served at: its own, and without ``/v1`` where it is ``bare``."""
    if route.bare and route.path.startswith("/v1/"):
        return route.path, route.path.removeprefix("/v1")
    return (route.path,)


def always(handler: Handler) -> Callable[[Settings], Handler]:
    """A handler that needs nothing of the settings to be made."""

    def make(settings: Settings) -> Handler:
        return handler

    return make


# -- the handlers of no other module ---------------------------------------------------------


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


def _report(settings: Settings) -> Handler:
    return report.ReportEndpoint(settings).get


def _dashboard_page(settings: Settings) -> Handler:
    return dashboard.Dashboard((dashboard.PAGE,)).page


def _dashboard_files(settings: Settings) -> Handler:
    return dashboard.Dashboard(dashboard.FILES).asset


# -- the list ----------------------------------------------------------------------------------

_RESPONSE_ID = path_id("response_id")
_HEALTH = {
    "application/json": {"schema": obj(["status"], {"status": {"enum": ["ok", "degraded"]}})}
}
_NOT_MODIFIED = {"304": {"description": "Not modified: the `If-None-Match` held its `ETag`."}}
_METRICS_REASONS = {
    **REASONS,
    403: "With keys, only an admin key reads the metrics, unless `[server] metrics_open`.",
}
_DASHBOARD_FILE = {
    "description": "The file.",
    "content": {
        media.split(";")[0]: {"schema": {"type": "string"}}
        for media in sorted(set(dashboard.CONTENT_TYPES.values()))
    },
}

ROUTES: tuple[Route, ...] = (
    *ENDPOINTS,
    Page(
        path="/v1/responses/{response_id}",
        make=always(stored_responses.one),
        openapi={
            "parameters": [_RESPONSE_ID],
            "get": {
                "summary": "A stored response (the key's own; an admin key's: any); with "
                "`stream=true`, a background response's events once it has ended, from "
                "`starting_after` + 1",
                "parameters": [
                    {"name": "stream", "in": "query", "schema": {"type": "boolean"}},
                    {"name": "starting_after", "in": "query", "schema": {"type": "integer"}},
                ],
                "responses": answer(
                    "The response object, or its events (text/event-stream).",
                    "Response",
                    400,
                    401,
                    404,
                    503,
                ),
            },
            "delete": {
                "summary": "Delete a stored response (the key's own; an admin key's: any)",
                "responses": answer("Deleted.", "ResponseDeleted", 401, 404, 503),
            },
        },
    ),
    Page(
        path="/v1/responses/{response_id}/cancel",
        make=always(stored_responses.cancel),
        openapi={
            "parameters": [_RESPONSE_ID],
            "post": {
                "summary": "Cancel a background response (the key's own; an admin key's: any): "
                "a queued or running one is `cancelled`, a finished one is answered as it is; "
                "one that is not a background response is a 400",
                "responses": answer("The response object.", "Response", 400, 401, 404, 503),
            },
        },
    ),
    Page(
        path="/v1/responses/{response_id}/input_items",
        make=always(stored_responses.list_input_items),
        openapi={
            "parameters": [_RESPONSE_ID],
            "get": {
                "summary": "The input items of a stored response, a page at a time",
                "parameters": LIST_PARAMETERS,
                "responses": answer(
                    "A page of its input items.", "ResponseInputItems", 400, 401, 404, 503
                ),
            },
        },
    ),
    Page(path="/v1/files", make=always(files.collection), openapi=batch_openapi.FILES),
    Page(path="/v1/files/{file_id}", make=always(files.one), openapi=batch_openapi.FILE),
    Page(
        path="/v1/files/{file_id}/content",
        make=always(files.content),
        openapi=batch_openapi.FILE_CONTENT,
    ),
    Page(path="/v1/batches", make=always(batches.collection), openapi=batch_openapi.BATCHES),
    Page(path="/v1/batches/{batch_id}", make=always(batches.retrieve), openapi=batch_openapi.BATCH),
    Page(
        path="/v1/batches/{batch_id}/cancel",
        make=always(batches.cancel),
        openapi=batch_openapi.BATCH_CANCEL,
    ),
    Page(
        path="/openapi.json",
        make=always(_openapi),
        openapi={
            "get": {
                "summary": "This document",
                "responses": answer("OpenAPI 3.1", {"type": "object"}),
            }
        },
    ),
    Page(
        path="/v1/models",
        make=always(_models),
        openapi={
            "get": {
                "summary": "The models that can be asked for",
                "responses": answer(
                    "`local`, the models the config names (`[fallback] models`, `[quality] "
                    "models`, `[pricing]`), then the upstream's own list (cached, bounded), "
                    "each once.",
                    "Models",
                    401,
                ),
            }
        },
    ),
    Page(
        path="/healthz",
        make=always(_healthz),
        openapi={
            "get": {
                "summary": "Health of the engine, the fallback and the ledger",
                "responses": {
                    "200": {"description": "Serving.", "content": _HEALTH},
                    "503": {
                        "description": "The engine is down and there is no fallback.",
                        "content": _HEALTH,
                    },
                },
            }
        },
    ),
    Page(
        path="/metrics",
        make=always(scrape.endpoint),
        openapi={
            "get": {
                "summary": "The server's metrics in Prometheus text format",
                "responses": answer(
                    "Every key's traffic together, and the engine's, the ledger's and the "
                    "upstream's figures.",
                    {"type": "string"},
                    401,
                    403,
                    media="text/plain",
                    reasons=_METRICS_REASONS,
                ),
            }
        },
    ),
    Page(
        path="/v1/frugal/report",
        make=_report,
        bare=False,
        openapi={
            "get": {
                "summary": "The month's savings: what `frugal report --format json` prints",
                "parameters": report.PARAMETERS,
                "responses": {
                    **answer(
                        "The report (docs/report.md); a month without requests is a report "
                        "of zeros.",
                        "Report",
                        400,
                        401,
                    ),
                    **errors(503, reasons={503: "The ledger cannot be read."}),
                },
            }
        },
    ),
    Page(
        path="/dashboard",
        make=_dashboard_page,
        openapi={
            "get": {
                "summary": "The savings page (it reads `/v1/frugal/report` with the key it "
                "is given)",
                "responses": {
                    "200": {
                        "description": "The page.",
                        "content": {"text/html": {"schema": {"type": "string"}}},
                    },
                    **_NOT_MODIFIED,
                },
            }
        },
    ),
    Page(
        path="/dashboard/{name}",
        make=_dashboard_files,
        openapi={
            "parameters": [path_id("name")],
            "get": {
                "summary": "A file of the savings page: its scripts, styles, icon and chart "
                "library",
                "responses": {
                    "200": _DASHBOARD_FILE,
                    **_NOT_MODIFIED,
                    **errors(404, reasons={404: "No file of the dashboard by that name."}),
                },
            },
        },
    ),
)


@lru_cache(maxsize=1)
def openapi_spec() -> dict[str, Any]:
    """The OpenAPI document (built once): a path for each of :data:`ROUTES`."""
    return openapi_document({route.path: route.openapi for route in ROUTES})
