"""Every error the proxy raises on purpose: the tree, with each class's status, type and code.

    Exception
    ├── UserError                       the command line's: one clean line, its exit_code (1)
    │   └── ConfigError                 bad settings; the CLI prints it and exits 2
    ├── ProxyError                      what a client sees: OpenAI's error JSON, with its status
    │   ├── BadRequest              400 invalid_request_error  invalid_value (names the `param`)
    │   │   └── StoreFull           400 invalid_request_error  store_quota_exceeded (`store`)
    │   ├── Unauthorized            401 authentication_error   invalid_api_key (WWW-Authenticate)
    │   ├── NotFound                404 invalid_request_error  not_found
    │   ├── MethodNotAllowed        405 invalid_request_error  method_not_allowed (with Allow)
    │   ├── RequestTimeout          408 invalid_request_error  request_timeout (body too slow)
    │   ├── PayloadTooLarge         413 invalid_request_error  request_too_large
    │   ├── UnsupportedMediaType    415 invalid_request_error  unsupported_media_type
    │   ├── MisdirectedRequest      421 invalid_request_error  misdirected_request
    │   ├── ModelNotAllowed         403 invalid_request_error  model_not_allowed (a key's --models)
    │   ├── Forbidden               403 invalid_request_error  permission_denied (admin keys only)
    │   ├── TooManyRequests         429 requests               rate_limit_exceeded (Retry-After)
    │   │   └── BudgetExhausted     429 insufficient_quota     insufficient_quota (a key's budget)
    │   ├── BudgetUnavailable       503 server_error           budget_unavailable (fail closed)
    │   ├── StoreUnavailable        503 server_error           store_unavailable (stored Responses)
    │   ├── StatusError             4xx/5xx any other status the web framework raised
    │   ├── InternalError           500 server_error           internal_error (the request id)
    │   ├── CountUnavailable        503 server_error           count_unavailable (input_tokens)
    │   ├── LocalUnavailable        503 server_error           local_unavailable
    │   ├── UpstreamError           502 upstream_error         upstream_failed
    │   │   ├── UpstreamTimeout     504 upstream_error         upstream_timeout
    │   │   └── UpstreamRateLimited 429 requests               rate_limit_exceeded (the API's
    │   │                                                      Retry-After, after retrying)
    │   └── UpstreamStatus          4xx the API's own error    the API refused the request: its
    │                                                          status and error are passed on
    └── EngineError                     a local backend failed; never sent to a client as such
        ├── EngineCrashed               the worker died, or a remote backend failed
        │   └── BackendDown             (proxy.routing.base) a backend stopped answering
        ├── EngineTimeout               the deadline passed
        ├── EngineBusy                  the queue is full
        └── ContextOverflow             (proxy.engine.local_engine) the prompt does not fit

Who raises what, and who turns it into a response:

- Foreign errors of the paid API (aiohttp, litellm, httpx, its statuses) become ProxyErrors in
  one place, :func:`proxy.upstream.failures.translate`. Failures of *local* backends are
  EngineErrors (:func:`proxy.routing.remote.backend_failure` for remote servers); the router turns
  them into a fallback, or into :class:`LocalUnavailable` (or a :class:`BadRequest` for a
  context overflow) when the request may not leave the box.
- Every ProxyError reaches the client through :mod:`proxy.server.render`: as JSON
  (``render``) before the response has started, as the last SSE event (``sse_event``) after.
  Both write :meth:`ProxyError.body`, the one place OpenAI's shape is written. Anything else that
  escapes a handler is logged once and sent as an :class:`InternalError`.

Every :class:`ProxyError` has ``headers`` (sent with its JSON, e.g. ``Retry-After``) and
``attempts``: how many calls to the upstream API were made before it was raised (0 for errors
that never reached the API; set by :mod:`proxy.upstream.client` on everything it raises), so that a
failed request's ledger row can say how many times the API may have billed it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, ClassVar


class UserError(Exception):
    """A ``frugal`` command that cannot be done, for a reason the user can fix.

    The CLI's ``main`` (:mod:`proxy.cli`) is the one place that catches it: it prints
    ``{label}: {message}`` on one line, with no traceback, and exits with ``exit_code``. Each
    command's own error (``frugal keys``, ``frugal report``, ...) is a subclass that sets the two
    on the class; ``exit_code`` may also be given per instance (``frugal report``'s 2, 3 and 4).
    """

    exit_code: int = 1
    label: str = "frugal"

    def __init__(self, message: str, exit_code: int | None = None) -> None:
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class ConfigError(UserError):
    """A setting is missing or wrong. The message names the key, the value and what was expected."""

    exit_code = 2
    label = "frugal: config error"


class ProxyError(Exception):
    """An error for the client: its status, OpenAI's ``type`` and ``code``, a message, the
    ``param`` it is about, and the headers it is sent with."""

    status: int = 500
    type: str = "server_error"
    code: str | None = None
    default_headers: ClassVar[Mapping[str, str]] = {}
    """Headers every error of the class is sent with (``headers`` adds to them)."""
    attempts: int = 0
    """Calls made to the upstream API before this error (0: it never got that far)."""

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code
        self.headers: dict[str, str] = {**self.default_headers, **(headers or {})}
        """Extra response headers the error is sent with (``Retry-After``...)."""

    def body(self) -> dict[str, Any]:
        """OpenAI's error object: the one place its shape is written (JSON and SSE alike)."""
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


class BadRequest(ProxyError):
    status = 400
    type = "invalid_request_error"
    code = "invalid_value"


class StoreFull(BadRequest):
    """A request with ``store`` from a key that keeps its quota of stored Responses already
    (``[responses] max_stored_bytes_per_key``, ``max_stored_per_key``). A 400, not a 429:
    waiting does not free the space (only a DELETE, or the retention, does), and OpenAI's
    clients retry a 429 on their own, in vain here."""

    code = "store_quota_exceeded"


class Unauthorized(ProxyError):
    status = 401
    type = "authentication_error"
    code = "invalid_api_key"
    default_headers = {"www-authenticate": "Bearer"}


class NotFound(ProxyError):
    status = 404
    type = "invalid_request_error"
    code = "not_found"


class MethodNotAllowed(ProxyError):
    status = 405
    type = "invalid_request_error"
    code = "method_not_allowed"


class PayloadTooLarge(ProxyError):
    status = 413
    type = "invalid_request_error"
    code = "request_too_large"


class RequestTimeout(ProxyError):
    status = 408
    type = "invalid_request_error"
    code = "request_timeout"


class UnsupportedMediaType(ProxyError):
    status = 415
    type = "invalid_request_error"
    code = "unsupported_media_type"


class MisdirectedRequest(ProxyError):
    status = 421
    type = "invalid_request_error"
    code = "misdirected_request"


class TooManyRequests(ProxyError):
    """OpenAI's rate-limit shape; ``retry_after_s`` goes into the Retry-After header."""

    status = 429
    type = "requests"
    code = "rate_limit_exceeded"
    retry_after_s = 1
    default_headers = {"retry-after": str(retry_after_s)}


class ModelNotAllowed(ProxyError):
    """A client key asked for a model its key may not use (``frugal keys create --models``)."""

    status = 403
    type = "invalid_request_error"
    code = "model_not_allowed"


class Forbidden(ProxyError):
    """A good key that may not read this: a client key asking for what only an admin key reads
    (``/metrics``; ``frugal keys create --admin``)."""

    status = 403
    type = "invalid_request_error"
    code = "permission_denied"


class BudgetExhausted(TooManyRequests):
    """OpenAI's shape for a spent quota: 429 ``insufficient_quota`` (no Retry-After: waiting
    a second does not bring money back)."""

    type = "insufficient_quota"
    code = "insufficient_quota"
    default_headers = {}


class BudgetUnavailable(ProxyError):
    """The budget database cannot be reached: the API fallback is refused (fail closed)."""

    status = 503
    type = "server_error"
    code = "budget_unavailable"


class StoreUnavailable(ProxyError):
    """The database of stored Responses cannot be reached (a read of one, or its deletion)."""

    status = 503
    type = "server_error"
    code = "store_unavailable"


class StatusError(ProxyError):
    """Any other status the web framework raised (Starlette's ``HTTPException``), passed on."""

    code = None

    def __init__(
        self, status: int, message: str, *, headers: Mapping[str, str] | None = None
    ) -> None:
        super().__init__(message, headers=headers)
        self.status = status
        self.type = "server_error" if status >= 500 else "invalid_request_error"


class InternalError(ProxyError):
    """Something unexpected failed. The body says nothing of what: it names the request id,
    under which the failure was logged (once, by :mod:`proxy.server.render`), and carries it in
    the ``x-request-id`` header."""

    status = 500
    type = "server_error"
    code = "internal_error"

    def __init__(self, request_id: str | None = None) -> None:
        which = f"request id {request_id}" if request_id else "this request"
        super().__init__(
            f"internal error; look up {which} in the server log",
            headers={"x-request-id": request_id} if request_id else None,
        )
        self.request_id = request_id


class CountUnavailable(ProxyError):
    """``/v1/responses/input_tokens``: the token counter did not count within its bound."""

    status = 503
    type = "server_error"
    code = "count_unavailable"


class LocalUnavailable(ProxyError):
    status = 503
    type = "server_error"
    code = "local_unavailable"


class UpstreamError(ProxyError):
    status = 502
    type = "upstream_error"
    code = "upstream_failed"


class UpstreamTimeout(UpstreamError):
    status = 504
    code = "upstream_timeout"


class UpstreamRateLimited(UpstreamError):
    """The API answered 429 to every attempt: passed on as OpenAI's 429, with its Retry-After."""

    status = 429
    type = "requests"
    code = "rate_limit_exceeded"

    def __init__(self, message: str, *, retry_after_s: float | None = None) -> None:
        headers = (
            {"retry-after": str(math.ceil(retry_after_s))} if retry_after_s is not None else None
        )
        super().__init__(message, headers=headers)
        self.retry_after_s = retry_after_s


class UpstreamStatus(ProxyError):
    """The API answered with a 4xx that retrying cannot fix; pass its status and body on."""

    def __init__(self, status: int, payload: dict[str, Any] | None, message: str) -> None:
        super().__init__(message)
        self.status = status
        err = (payload or {}).get("error") if isinstance(payload, dict) else None
        if isinstance(err, dict):
            self.message = str(err.get("message") or message)
            self.type = str(err.get("type") or "invalid_request_error")
            self.param = err.get("param")
            self.code = err.get("code")
        else:
            self.type = "invalid_request_error"
            self.code = "upstream_rejected"


class EngineError(Exception):
    reason: str = "local_error"


class EngineCrashed(EngineError):
    reason = "local_error"


class EngineTimeout(EngineError):
    reason = "local_timeout"


class EngineBusy(EngineError):
    reason = "local_busy"
