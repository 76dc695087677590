"""Every error the proxy raises on purpose, and the one place foreign errors are translated.

    Exception
    ├── ConfigError                 bad settings; the CLI prints it and exits 2
    └── ProxyError                  rendered as OpenAI's error JSON with its own status
        ├── BadRequest          400 invalid_request_error  (names the offending `param`)
        ├── Unauthorized        401 authentication_error
        ├── NotFound            404 not_found
        ├── MethodNotAllowed    405 invalid_request_error
        ├── RequestTimeout      408 invalid_request_error  (the body came too slowly)
        ├── PayloadTooLarge     413 invalid_request_error
        ├── TooManyRequests     429 requests                (carries Retry-After)
        ├── LocalUnavailable    503 local model cannot answer and no fallback is allowed
        ├── UpstreamError       502 the API failed (after the retries that were allowed)
        │   ├── UpstreamTimeout 504 the API did not answer in time
        │   └── UpstreamRateLimited 429 the API still rate-limited the proxy after retrying
        │                           (carries the API's Retry-After)
        └── UpstreamStatus      4xx the API refused the request; its status is passed on
    EngineError                     the local engine failed (crash, deadline, bad output)
    ├── EngineCrashed
    ├── EngineTimeout
    └── EngineBusy

Engine errors never reach a client directly: the router turns them into a fallback, or into
:class:`LocalUnavailable` when the request may not leave the box.

Every :class:`ProxyError` has ``headers`` (sent with its JSON, e.g. ``Retry-After``) and
``attempts``: how many calls to the upstream API were made before it was raised (0 for errors
that never reached the API; set by :mod:`proxy.upstream.client` on everything it raises), so that a
failed request's ledger row can say how many times the API may have billed it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import httpx


class ConfigError(Exception):
    """A setting is missing or wrong. The message names the key, the value and what was expected."""


class ProxyError(Exception):
    status: int = 500
    type: str = "server_error"
    code: str | None = None
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
        self.headers: dict[str, str] = dict(headers) if headers else {}
        """Extra response headers the error is sent with (``Retry-After``...)."""

    def body(self) -> dict[str, Any]:
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


class Unauthorized(ProxyError):
    status = 401
    type = "authentication_error"
    code = "invalid_api_key"


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


class TooManyRequests(ProxyError):
    """OpenAI's rate-limit shape; ``retry_after_s`` goes into the Retry-After header."""

    status = 429
    type = "requests"
    code = "rate_limit_exceeded"
    retry_after_s = 1


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


def map_upstream_exception(exc: BaseException) -> ProxyError:
    """Translate an httpx (or litellm) failure into the error the client sees."""
    if isinstance(exc, ProxyError):
        return exc
    if isinstance(exc, httpx.TimeoutException):
        return UpstreamTimeout(f"the upstream API did not answer in time ({type(exc).__name__})")
    if isinstance(exc, httpx.HTTPError):
        return UpstreamError(f"the upstream API could not be reached ({type(exc).__name__})")
    name = type(exc).__name__
    status = getattr(exc, "status_code", None)
    if "Timeout" in name:
        return UpstreamTimeout(f"the upstream API did not answer in time ({name})")
    if status == 429:
        return UpstreamRateLimited(f"the upstream API rate-limited the proxy ({name})")
    if isinstance(status, int) and 400 <= status < 500 and status != 408:
        return UpstreamStatus(status, None, f"the upstream API refused the request ({name})")
    return UpstreamError(f"the upstream API failed ({name})")
