"""How a failed upstream call is judged (retry or not) and told to the client: the one place.

Every failure of the paid API (aiohttp, litellm and httpx errors, and its statuses) passes
through :func:`translate` once, in :mod:`proxy.upstream.client` and :mod:`proxy.upstream.stream`;
what leaves this room is always a :class:`~proxy.errors.ProxyError`, which the handlers re-raise
as it is. (Failures of *local* backends are another matter: see
:func:`proxy.routing.remote.backend_failure`.)

    _RetryableStatus        upstream answered 408, 429, 502, 503 or 504: worth another attempt
    retryable(exc)          that, and a connection that failed before the request was sent
    status_error(...)       a non-2xx answer -> _RetryableStatus, _Refused (a 4xx whose body is
                            relayed) or UpstreamError
    translate(exc, tries)   whatever is left after retrying -> the ProxyError the client sees,
                            with ``attempts`` set to ``tries``; a 4xx's body cleared of secrets
    refusal(...)            a 4xx body, scrubbed, as the UpstreamStatus relayed
    maybe_billed(exc)       whether a failed call may still have been done (and billed)

What is retried is what cannot have been done (and billed) by the API already:

- a connection that could not be made (refused, DNS, TLS, the connect or pool timeout): the
  request never left;
- 408, 429, 502, 503 and 504: the API (or the gateway in front of it) did not process it.

Never retried: a 500 or any other 5xx, a read timeout, a reset, a disconnect or a body cut short
once the request was sent. The API may have done the work, so a second attempt could bill it
twice; the client gets the error and its SDK may choose to retry. Nor a ``ProxyError`` or another
4xx, which retrying cannot fix.

The errors come from aiohttp (the OpenAI-compatible route), from litellm (other providers; its
errors carry the provider's ``httpx.Response``, and the transport's error in their
``__cause__``/``__context__`` chain), and from httpx. A :class:`~proxy.errors.ProxyError` of
ours raised inside a library's read (the litellm route's byte bound, raised by its transport)
comes back wrapped in the library's errors: it is found in that chain, passed on as it is, and
never retried. A 401/403 is the proxy's own key failing,
so it becomes a 502 and its body (which may echo part of the key) is dropped. A 429 that is left
after retrying is passed on as a 429 with the API's ``Retry-After``. No message of ours carries a
key or a prompt: only exception type names and status codes.

The one body relayed is another 4xx's (OpenAI's ``{"error": {...}}``: its message, type, param
and code reach the client, and its code the ledger). An API or a gateway may echo the request's
``Authorization`` in it, so :func:`refusal` clears it with
:meth:`~proxy.config.secrets.Secrets.scrub_error` (every secret the proxy knows, in its plain,
``Bearer``, URL-encoded and JSON-escaped forms, and anything shaped like a key), before it is
parsed and again in each string once parsed. The secrets are the client's
(:class:`~proxy.upstream.client.Upstream`), handed to :func:`translate`; so a route raises a 4xx
as :class:`_Refused`, the body still raw, and it becomes the ``UpstreamStatus`` only there.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any

import aiohttp
import httpx

from proxy.config.secrets import NO_SECRETS, Secrets
from proxy.errors import (
    ProxyError,
    UpstreamError,
    UpstreamRateLimited,
    UpstreamStatus,
    UpstreamTimeout,
)

RETRYABLE_STATUSES = frozenset({408, 429, 502, 503, 504})

# Failures that happen before a byte of the request reaches the API.
_NOT_SENT = (
    aiohttp.ClientConnectorError,  # refused, DNS, TLS, the proxy in between (subclasses)
    aiohttp.ConnectionTimeoutError,  # no connection (or no free one in the pool) in time
    httpx.ConnectError,
    httpx.ConnectTimeout,
    httpx.PoolTimeout,
    ConnectionRefusedError,
)
# openai's (and so litellm's) transport errors: they say nothing of whether the request was sent.
_TRANSPORT_ERRORS = frozenset({"APIConnectionError", "APITimeoutError"})


class _RetryableStatus(Exception):
    """Upstream answered a status worth retrying (408, 429, 502, 503, 504)."""

    def __init__(self, status: int, retry_after: float | None) -> None:
        super().__init__(f"HTTP {status}")
        self.status = status
        self.retry_after = retry_after


class _Refused(Exception):
    """Upstream answered a 4xx (bar 401, 403 and the retryable ones) whose body is relayed; it
    is parsed and scrubbed by :func:`translate`. Its message is the status alone."""

    def __init__(self, status: int, content: bytes) -> None:
        super().__init__(f"HTTP {status}")
        self.status = status
        self.content = content


def retryable_status(status: int) -> bool:
    return status in RETRYABLE_STATUSES


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and the exceptions it was raised from or while handling (a few levels)."""
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            return
        yield seen
        seen = seen.__cause__ or seen.__context__


def _transport_error(exc: BaseException) -> bool:
    return any(c.__name__ in _TRANSPORT_ERRORS for c in type(exc).__mro__)


def not_sent(exc: BaseException) -> bool:
    """Whether the failure certainly came before the request reached the API."""
    return any(isinstance(e, _NOT_SENT) for e in _chain(exc))


def retryable(exc: BaseException) -> bool:
    """Whether another attempt cannot make the API do (and bill) the work twice."""
    if isinstance(exc, _RetryableStatus):
        return True
    if isinstance(exc, _Refused) or any(isinstance(e, ProxyError) for e in _chain(exc)):
        return False
    if not_sent(exc):
        return True
    if isinstance(exc, httpx.HTTPError | aiohttp.ClientError | TimeoutError | OSError):
        return False
    if _transport_error(exc):
        return False  # a litellm Timeout claims 408, a connection error 500: neither is the API's
    status = getattr(exc, "status_code", None)  # litellm's errors from the provider's answer
    return isinstance(status, int) and retryable_status(status)


def maybe_billed(exc: BaseException) -> bool:
    """Whether the API may have done (and billed) the work of a call that failed: the request
    was sent and no answer came (a read timeout, a reset, a body cut short). An answered status,
    or a request that never left, was not billed."""
    chain = list(_chain(exc))
    if not_sent(exc) or any(isinstance(e, _RetryableStatus) for e in chain):
        return False
    broken = httpx.HTTPError | aiohttp.ClientError | TimeoutError | OSError
    return any(isinstance(e, broken) or _transport_error(e) for e in chain)


def status_error(status: int, headers: Mapping[str, str], content: bytes) -> Exception:
    """The exception for a non-2xx answer: retryable, passed on (4xx, its body kept for
    :func:`translate` to scrub), or a 502."""
    if retryable_status(status):
        retry_after = parse_retry_after(headers) if status in (429, 503) else None
        return _RetryableStatus(status, retry_after)
    if 400 <= status < 500 and status not in (401, 403):
        return _Refused(status, content)
    return refusal(status, b"")


def refusal(status: int, content: bytes, secrets: Secrets = NO_SECRETS) -> ProxyError:
    """A status retrying cannot fix; a 4xx is passed on with its body cleared of ``secrets``
    (and of key-shaped text), bar the key's own refusal (401, 403), whose body is dropped."""
    if status in (401, 403):
        return UpstreamError(
            f"the upstream API rejected the proxy's credentials (HTTP {status}); "
            "check [fallback] api_key_env"
        )
    if 400 <= status < 500:
        try:
            payload = secrets.scrub_tree(json.loads(secrets.scrub_error(content)))
        except ValueError:
            payload = None
        return UpstreamStatus(
            status,
            payload if isinstance(payload, dict) else None,
            f"the upstream API refused the request (HTTP {status})",
        )
    return UpstreamError(f"the upstream API failed (HTTP {status})")


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


def translate(
    exc: BaseException,
    attempts: int,
    *,
    streaming: bool = False,
    secrets: Secrets = NO_SECRETS,
) -> ProxyError:
    """The one place a failed upstream call becomes the error the client sees.

    The error's ``attempts`` is set to ``attempts``: the calls made to the API for it. A body
    that is relayed is cleared of ``secrets`` first.
    """
    error = _translated(exc, attempts, streaming, secrets)
    error.attempts = attempts
    return error


def _translated(exc: BaseException, attempts: int, streaming: bool, secrets: Secrets) -> ProxyError:
    for cause in _chain(exc):  # ours, raised inside a library's read and wrapped by it
        if isinstance(cause, ProxyError):
            return cause
    if isinstance(exc, _Refused):
        return refusal(exc.status, exc.content, secrets)
    name = type(exc).__name__
    tried = f"{attempts} attempt" + ("s" if attempts != 1 else "")
    if isinstance(exc, _RetryableStatus):
        if exc.status == 408:
            return UpstreamTimeout(f"the upstream API timed out (HTTP 408) on {tried}")
        if exc.status == 429:
            return UpstreamRateLimited(
                f"the upstream API rate-limited the proxy (HTTP 429) on {tried}",
                retry_after_s=exc.retry_after,
            )
        return UpstreamError(f"the upstream API failed (HTTP {exc.status}) on {tried}")
    timed_out = isinstance(exc, TimeoutError | httpx.TimeoutException) or "Timeout" in name
    if streaming:
        if timed_out:
            return UpstreamTimeout(f"the upstream stream stalled mid-way ({name})")
        return UpstreamError(f"the upstream stream broke off mid-way ({name})")
    if getattr(exc, "status_code", None) == 429 and not _transport_error(exc):  # litellm's
        return UpstreamRateLimited(
            f"the upstream API rate-limited the proxy (HTTP 429) on {tried}",
            retry_after_s=retry_after_of(exc),
        )
    if timed_out:
        return UpstreamTimeout(f"the upstream API did not answer in time ({name})")
    if not_sent(exc):
        return UpstreamError(f"the upstream API could not be reached ({name}) on {tried}")
    if isinstance(exc, aiohttp.ClientError | httpx.HTTPError) or _transport_error(exc):
        return UpstreamError(f"the connection to the upstream API failed ({name})")
    response = getattr(exc, "response", None)  # litellm's errors carry the provider's answer
    if isinstance(response, httpx.Response):
        return refusal(response.status_code, response.content, secrets)
    status = getattr(exc, "status_code", None)  # one that carries only the status
    if isinstance(status, int) and 400 <= status < 500 and status != 408:
        return refusal(status, b"")
    return UpstreamError(f"the upstream API failed ({name})")
