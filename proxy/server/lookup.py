"""The services of the app serving a request, looked up from its scope.

The lifespan (:mod:`proxy.server.lifespan`) keeps the frozen :class:`~proxy.serving.services.
Services` on ``app.state.services``; the middleware, made before the lifespan runs, and the routes
that are plain functions find it here. A service never looks itself up: it is handed what it
needs.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.types import Scope

from proxy.serving.services import Services


def services_in(scope: Scope) -> Services | None:
    """The services of the app serving ``scope``; None before its lifespan has built them."""
    state = getattr(scope.get("app"), "state", None)
    found = getattr(state, "services", None)
    return found if isinstance(found, Services) else None


def services_of(request: Request) -> Services:
    """The services of the app serving ``request`` (the lifespan has run: uvicorn and the
    tests' clients serve no request before it has)."""
    found = services_in(request.scope)
    if found is None:
        raise RuntimeError("the app's lifespan has not started: no services")
    return found
