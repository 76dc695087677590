"""How an error reaches the client: one renderer, in JSON and in SSE alike.

    render(exc, request_id)        a ProxyError as OpenAI's JSON response, before a byte is out
    sse_event(exc)                 the same object as a stream's last event, once bytes are out
    from_http_exception(exc, ...)  Starlette's 404, 405 or other status as a ProxyError
    unexpected(exc, request_id)    anything else: logged once, then an InternalError (a 500)
    exception_handlers()           Starlette's handlers, which are these functions

Both renderings write :meth:`proxy.errors.ProxyError.body`, so that a client sees the same
``{"error": {"message", "type", "param", "code"}}`` whether its request failed before or after
its stream started. The middlewares (auth, limits) and :class:`proxy.server.app.RequestIdMiddleware`
send theirs through :func:`render` too: a ``JSONResponse`` is an ASGI app.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import Scope

from proxy.errors import InternalError, MethodNotAllowed, NotFound, ProxyError, StatusError
from proxy.serving import events


def render(exc: ProxyError, request_id: str | None = None) -> JSONResponse:
    """``exc`` as OpenAI's error JSON, with its status, its headers and ``x-request-id``."""
    headers = {**exc.headers, "x-request-id": request_id} if request_id else exc.headers
    return JSONResponse(exc.body(), status_code=exc.status, headers=headers or None)


def sse_event(exc: ProxyError) -> bytes:
    """``exc`` as the final ``data: {"error": ...}`` event of a stream that failed after its
    first byte went out (the caller sends ``data: [DONE]`` after it)."""
    return events.error_event(exc)


def from_http_exception(exc: HTTPException, method: str, path: str) -> ProxyError:
    """Starlette's own refusals (no such route, wrong method, ...) as ProxyErrors."""
    if exc.status_code == 404:
        return NotFound(f"no such endpoint: {method} {path}")
    if exc.status_code == 405:  # its headers say Allow: the methods that are
        return MethodNotAllowed(f"method {method} is not allowed on {path}", headers=exc.headers)
    return StatusError(exc.status_code, str(exc.detail), headers=exc.headers)


def unexpected(
    exc: BaseException,
    request_id: str | None,
    scope: Scope | None = None,
    *,
    started: bool = False,
) -> InternalError:
    """Log an exception no handler took, once, and return the 500 the client gets for it: as
    JSON (:func:`render`), or as a stream's last event (:func:`sse_event`) when ``started``
    (:func:`proxy.serving.events.unexpected`, with the request's method and path)."""
    scope = scope or {}
    path = str(scope.get("path", ""))
    return events.unexpected(
        exc, request_id, method=scope.get("method"), path=path, started=started
    )


def _request_id(request: Request) -> str | None:
    request_id = getattr(request.state, "request_id", None)
    return request_id if isinstance(request_id, str) else None


async def _proxy_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ProxyError)
    return render(exc, _request_id(request))


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    error = from_http_exception(exc, request.method, request.url.path)
    return render(error, _request_id(request))


async def _unexpected(request: Request, exc: Exception) -> Response:
    """Starlette's outermost handler: reached only by an exception raised outside
    :class:`~proxy.server.app.RequestIdMiddleware` (which renders every other one itself)."""
    request_id = _request_id(request)
    return render(unexpected(exc, request_id, request.scope), request_id)


def exception_handlers() -> Mapping[Any, Any]:
    """The ``exception_handlers`` of the Starlette app: every error through :func:`render`."""
    return {ProxyError: _proxy_error, HTTPException: _http_error, Exception: _unexpected}
