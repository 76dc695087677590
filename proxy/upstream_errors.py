"""How a failed upstream call is judged (retry or not) and told to the client: the one place.

    _RetryableStatus        upstream answered 408, 429 or 5xx: worth another attempt
    retryable(exc)          that, timeouts, and connections that broke; never a ProxyError
    status_error(...)       a non-2xx answer -> _RetryableStatus, UpstreamStatus or UpstreamError
    translate(exc, tries)   whatever is left after retrying -> the ProxyError the client sees

The errors come from aiohttp (the OpenAI-compatible route), from litellm (other providers; its
errors carry the provider's ``httpx.Response``), and from httpx. A 401/403 is the proxy's own key
failing, so it becomes a 502 and its body (which may echo part of the key) is dropped. No message
carries a key or a prompt: only exception type names and status codes.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any

import aiohttp
import httpx

from proxy.errors import (
    ProxyError,
    UpstreamError,
    UpstreamStatus,
    UpstreamTimeout,
    map_upstream_exception,
)

_RETRYABLE_ERRORS = (
    aiohttp.ClientConnectionError,  # refused, reset, server disconnected, socket timeouts
    aiohttp.ClientPayloadError,  # a body cut short
    TimeoutError,
    httpx.TimeoutException,
    httpx.NetworkError,
    httpx.RemoteProtocolError,
)


class _RetryableStatus(Exception):
    """Upstream answered a status worth retrying (408, 429, 5xx)."""

    def __init__(self, status: int, retry_after: float | None) -> None:
        super().__init__(f"HTTP {status}")
        self.status = status
        self.retry_after = retry_after


def retryable_status(status: int) -> bool:
    return status in (408, 429) or status >= 500


def retryable(exc: BaseException) -> bool:
    if isinstance(exc, _RetryableStatus) or isinstance(exc, _RETRYABLE_ERRORS):
        return True
    if isinstance(exc, ProxyError | httpx.HTTPError | aiohttp.ClientError):
        return False
    status = getattr(exc, "status_code", None)  # litellm's errors
    if isinstance(status, int):
        return retryable_status(status)
    return "Timeout" in type(exc).__name__


def status_error(status: int, headers: Mapping[str, str], content: bytes) -> Exception:
    """The exception for a non-2xx answer: retryable, passed on (4xx), or a 502."""
    if retryable_status(status):
        retry_after = parse_retry_after(headers) if status in (429, 503) else None
        return _RetryableStatus(status, retry_after)
    return refusal(status, content)


def refusal(status: int, content: bytes) -> ProxyError:
    """A status retrying cannot fix; a 4xx is passed on with its body, bar the key's own."""
    if status in (401, 403):
        return UpstreamError(
            f"the upstream API rejected the proxy's credentials (HTTP {status}); "
            "check [fallback] api_key_env"
        )
    if 400 <= status < 500:
        try:
            payload = json.loads(content)
        except ValueError:
            payload = None
        return UpstreamStatus(
            status,
            payload if isinstance(payload, dict) else None,
            f"the upstream API refused the request (HTTP {status})",
        )
    return UpstreamError(f"the upstream API answered with an unexpected HTTP {status}")


def parse_retry_after(headers: Mapping[str, str]) -> float | None:
    """Seconds to wait from ``retry-after-ms`` or ``Retry-After`` (seconds or an HTTP date).

    ``headers`` is a case-insensitive mapping (aiohttp's or httpx's headers).
    """
    value = headers.get("retry-after-ms")
    if value:
        try:
            return max(0.0, float(value) / 1000)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - datetime.now(UTC)).total_seconds())


def retry_after_of(exc: BaseException | None) -> float | None:
    if isinstance(exc, _RetryableStatus):
        return exc.retry_after
    headers: Any = getattr(exc, "litellm_response_headers", None)  # the provider's
    if isinstance(headers, dict) and getattr(exc, "status_code", None) in (429, 503):
        return parse_retry_after(httpx.Headers(headers))
    return None


def describe(exc: BaseException) -> str:
    """A short name for the log: the status of a retryable answer, else the exception type."""
    return f"HTTP {exc.status}" if isinstance(exc, _RetryableStatus) else type(exc).__name__


def translate(exc: BaseException, attempts: int, *, streaming: bool = False) -> ProxyError:
    """The one place a failed upstream call becomes the error the client sees."""
    if isinstance(exc, ProxyError):
        return exc
    name = type(exc).__name__
    if isinstance(exc, _RetryableStatus):
        tried = f"{attempts} attempt" + ("s" if attempts != 1 else "")
        if exc.status == 408:
            return UpstreamTimeout(f"the upstream API timed out (HTTP 408) on {tried}")
        what = "rate-limited the proxy" if exc.status == 429 else "failed"
        return UpstreamError(f"the upstream API {what} (HTTP {exc.status}) on {tried}")
    response = getattr(exc, "response", None)  # litellm's errors carry the provider's answer
    if isinstance(response, httpx.Response) and not retryable_status(response.status_code):
        return refusal(response.status_code, response.content)
    timed_out = isinstance(exc, TimeoutError | httpx.TimeoutException) or "Timeout" in name
    if streaming:
        if timed_out:
            return UpstreamTimeout(f"the upstream stream stalled mid-way ({name})")
        return UpstreamError(f"the upstream stream broke off mid-way ({name})")
    if timed_out:
        return UpstreamTimeout(f"the upstream API did not answer in time ({name})")
    if isinstance(exc, aiohttp.ClientError):
        return UpstreamError(f"the upstream API could not be reached ({name})")
    return map_upstream_exception(exc)
