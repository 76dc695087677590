"""The fallback client: send a request to the upstream API and hand its answer back.

Which way a request goes depends on the model it names (``[fallback] models`` maps a requested
name to a target; an unmapped name is sent unchanged):

- **httpx**, the hot path: a target without a provider prefix, or ``openai/<name>`` (the prefix
  is dropped), goes to ``[fallback] api_base`` over one pooled ``httpx.AsyncClient`` made at
  start-up. The JSON is serialised once and sent as bytes; nothing else is imported.
- **litellm**: a mapped target with any other provider prefix (``anthropic/claude-3-5-haiku``).
  litellm takes seconds to import, so it is imported at start-up only when the mapping needs it.
  ``api_key_env`` names the key of ``api_base``; litellm providers read their own standard
  variable (``ANTHROPIC_API_KEY``...), except when ``api_base`` is empty: then the key of
  ``api_key_env`` is theirs.

Retries live here and nowhere else (tenacity). Timeouts, connection errors, 408, 429 and 5xx are
retried up to ``max_retries`` times with exponential backoff and jitter; ``Retry-After`` (seconds
or an HTTP date) is honoured on 429 and 503. A retry whose wait would end after ``timeout_s`` from
the start of the call, or whose ``Retry-After`` is over 20 s, is not made: the call fails at once.
Other 4xx are never retried, and a stream is never retried once :meth:`Upstream.chat_stream` has
returned it.

Failures become :mod:`proxy.errors` in one function, :func:`_translate`: ``UpstreamTimeout``
(504), ``UpstreamError`` (502), or ``UpstreamStatus`` carrying a 4xx and OpenAI's error body.
A 401/403 from upstream is the proxy's own key failing, so it becomes a 502 and its body (which
may echo part of the key) is dropped. No message carries a key or a prompt.

Streams: :meth:`Upstream.chat_stream` returns an :class:`UpstreamStream` once upstream has
answered 200, so every error before the first byte is raised (and retried) there. The stream
relays whole SSE events as they arrive and notes the final usage chunk; upstream is always asked
for usage, and when the client did not ask for it the usage chunk is taken out again.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import random
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from types import TracebackType
from typing import Any, TypeVar

import httpx
import structlog
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception

from proxy.config import FallbackSettings
from proxy.errors import (
    ProxyError,
    UpstreamError,
    UpstreamStatus,
    UpstreamTimeout,
    map_upstream_exception,
)

__all__ = ["Upstream", "UpstreamResponse", "UpstreamStream"]

log = structlog.get_logger(__name__)
_T = TypeVar("_T")

MAX_CONNECTIONS = 64
BACKOFF_INITIAL_S = 0.2
BACKOFF_MAX_S = 5.0
RETRY_AFTER_CAP_S = 20.0

_encode = json.JSONEncoder(check_circular=False, separators=(",", ":")).encode
_JSON_HEADERS = {"content-type": "application/json"}
_USAGE_OBJECT = (b'"usage":{', b'"usage": {')
_USAGE_NULL = b'"usage":null'
# Keys of an OpenAI body that the litellm call sets itself.
_LITELLM_OWN = frozenset({"model", "stream", "stream_options", "timeout", "api_key", "api_base"})


@dataclass(frozen=True, kw_only=True)
class UpstreamResponse:
    body: dict[str, Any]
    """The parsed JSON the API answered (a ``chat.completion`` for :meth:`Upstream.chat`)."""
    status: int
    latency_s: float
    """Wall time of the whole call, retries and their waits included."""
    attempts: int


class _RetryableStatus(Exception):
    """Upstream answered a status worth retrying (408, 429, 5xx)."""

    def __init__(self, status: int, retry_after: float | None) -> None:
        super().__init__(f"HTTP {status}")
        self.status = status
        self.retry_after = retry_after


class UpstreamStream:
    """An open upstream SSE stream: iterate it for ``bytes`` made of whole SSE events.

    It exists only once upstream has answered 200. Iterating relays events as they arrive; an
    event split over network reads is held back until it is complete, so an error event written
    after a failure never lands inside a half-sent one. If the connection breaks, iteration
    raises :class:`UpstreamError` (or :class:`UpstreamTimeout`); nothing is retried. After the
    last event, ``usage`` holds the usage upstream reported (or None). Always ``aclose()`` it (or
    use ``async with``); running to the end closes it too.
    """

    __slots__ = ("usage", "latency_s", "attempts", "_source", "_close", "_strip", "_tail", "_done")

    def __init__(
        self,
        source: AsyncIterator[bytes],
        close: Callable[[], Awaitable[None]],
        *,
        strip_usage: bool,
        latency_s: float,
        attempts: int,
    ) -> None:
        self.usage: dict[str, Any] | None = None
        self.latency_s = latency_s
        """Seconds from the call to upstream's response headers, retries included."""
        self.attempts = attempts
        self._source = source
        self._close = close
        self._strip = strip_usage
        self._tail = b""
        self._done = False

    def __aiter__(self) -> UpstreamStream:
        return self

    async def __anext__(self) -> bytes:
        while not self._done:
            try:
                chunk = await self._source.__anext__()
            except StopAsyncIteration:
                tail, self._tail = self._tail, b""
                await self.aclose()
                out = self._scan(tail) if tail.strip() else b""
                if out:
                    return out
                break
            except Exception as exc:
                await self.aclose()
                raise _translate(exc, self.attempts, streaming=True) from exc
            out = self._feed(chunk)
            if out:
                return out
        raise StopAsyncIteration

    def _feed(self, chunk: bytes) -> bytes:
        """Whole events out of what has arrived; the unfinished rest waits for the next read."""
        data = self._tail + chunk if self._tail else chunk
        if b"\r" in data:
            data = data.replace(b"\r\n", b"\n")
        cut = data.rfind(b"\n\n")
        if cut < 0:
            self._tail = data
            return b""
        cut += 2
        if cut < len(data):
            data, self._tail = data[:cut], data[cut:]
        else:
            self._tail = b""
        return self._scan(data)

    def _scan(self, data: bytes) -> bytes:
        if _USAGE_OBJECT[0] in data or _USAGE_OBJECT[1] in data:
            data = self._take_usage(data)
        if self._strip and _USAGE_NULL in data:
            # Asked for usage on the client's behalf: OpenAI would not have added these either.
            data = data.replace(b',"usage":null', b"").replace(b'"usage":null,', b"")
        return data

    def _take_usage(self, data: bytes) -> bytes:
        events = data.split(b"\n\n")
        kept: list[bytes] = []
        for event in events:
            if b'"usage"' in event:
                payload = _data_field(event)
                try:
                    parsed = json.loads(payload) if payload else None
                except ValueError:
                    parsed = None
                if isinstance(parsed, dict) and isinstance(parsed.get("usage"), dict):
                    self.usage = parsed["usage"]
                    if self._strip and parsed.get("choices") == []:
                        continue
            kept.append(event)
        return b"\n\n".join(kept) if len(kept) != len(events) else data

    async def aclose(self) -> None:
        if self._done:
            return
        self._done = True
        close_source = getattr(self._source, "aclose", None)
        try:
            if close_source is not None:
                await close_source()
        finally:
            await self._close()

    async def __aenter__(self) -> UpstreamStream:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


class Upstream:
    """The client of the fallback API. ``await start()`` before use, ``await aclose()`` after.

    ``backoff_s`` is the first retry's backoff (tests make it small).
    """

    def __init__(
        self,
        settings: FallbackSettings,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
        backoff_s: float = BACKOFF_INITIAL_S,
    ) -> None:
        self._settings = settings
        self._transport = transport
        self._routes = {name: _route(target) for name, target in settings.models.items()}
        self._base = settings.api_base.rstrip("/")
        self._urls: dict[str, httpx.URL] = {}
        self._client: httpx.AsyncClient | None = None
        self._litellm: Any = None
        self._backoff_s = backoff_s
        self._retrying = AsyncRetrying(
            stop=self._stop,
            wait=self._wait,
            retry=retry_if_exception(_retryable),
            before_sleep=_log_retry,
            reraise=True,
        )

    # -- life cycle ----------------------------------------------------------------------------

    async def start(self) -> None:
        """Open the connection pool, and import litellm if the model mapping needs it."""
        if self._client is not None:
            return
        s = self._settings
        key = s.api_key()
        self._client = httpx.AsyncClient(
            headers={"authorization": f"Bearer {key}"} if key else None,
            timeout=httpx.Timeout(s.timeout_s, connect=s.connect_timeout_s),
            limits=httpx.Limits(
                max_connections=MAX_CONNECTIONS, max_keepalive_connections=MAX_CONNECTIONS
            ),
            transport=self._transport,
        )
        if self._litellm is None and any(via for _, via in self._routes.values()):
            self._litellm = await asyncio.to_thread(_import_litellm)

    async def aclose(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()

    async def __aenter__(self) -> Upstream:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    # -- what can be asked for -----------------------------------------------------------------

    @property
    def enabled(self) -> bool:
        return self._settings.enabled

    def target(self, requested_model: str) -> str:
        """The model name sent upstream: the mapped target (without ``openai/``), or unchanged."""
        route = self._routes.get(requested_model)
        return route[0] if route is not None else requested_model

    def model_ids(self) -> list[str]:
        """The names the mapping knows, for ``GET /v1/models``."""
        return list(self._settings.models)

    # -- calls ---------------------------------------------------------------------------------

    async def chat(self, body: dict[str, Any], *, request_id: str) -> UpstreamResponse:
        """A non-streamed chat completion (a ``stream`` flag in ``body`` is turned off)."""
        model, via_litellm = self._routes.get(body.get("model", ""), (body.get("model", ""), False))
        forward = {**body, "model": model}
        if forward.get("stream"):
            forward["stream"] = False
            forward.pop("stream_options", None)
        if via_litellm:
            started = time.perf_counter()
            kwargs = self._litellm_kwargs(forward, request_id)
            result, tries = await self._retry(self._litellm_call, kwargs)
            latency = time.perf_counter() - started
            return UpstreamResponse(
                body=result.model_dump(), status=200, latency_s=latency, attempts=tries
            )
        return await self._post(self._url("/chat/completions"), forward, request_id)

    async def chat_stream(self, body: dict[str, Any], *, request_id: str) -> UpstreamStream:
        """Open a streamed chat completion; returns once upstream has answered 200."""
        model, via_litellm = self._routes.get(body.get("model", ""), (body.get("model", ""), False))
        options = body.get("stream_options")
        strip_usage = not (isinstance(options, dict) and options.get("include_usage"))
        forward = {**body, "model": model, "stream": True}
        if strip_usage:
            extra = options if isinstance(options, dict) else {}
            forward["stream_options"] = {**extra, "include_usage": True}
        source: AsyncIterator[bytes]
        close: Callable[[], Awaitable[None]]
        started = time.perf_counter()
        if via_litellm:
            kwargs = self._litellm_kwargs(forward, request_id)
            kwargs.update(stream=True, stream_options=forward["stream_options"])
            result, tries = await self._retry(self._litellm_call, kwargs)
            source, close = _sse_from_litellm(result), result.aclose
        else:
            client = self._ready()
            request = client.build_request(
                "POST",
                self._url("/chat/completions"),
                content=_encode(forward).encode(),
                headers={**_JSON_HEADERS, "x-request-id": request_id},
            )
            response, tries = await self._retry(_open, client, request)
            source, close = response.aiter_bytes(), response.aclose
        latency = time.perf_counter() - started
        return UpstreamStream(
            source, close, strip_usage=strip_usage, latency_s=latency, attempts=tries
        )

    async def post_json(
        self, path: str, body: dict[str, Any], *, request_id: str
    ) -> UpstreamResponse:
        """POST ``body`` to ``api_base + path`` (``/embeddings``, ``/completions``), JSON back.

        A mapped model name is replaced when its target is on ``api_base``; not streamed.
        """
        model = body.get("model")
        if isinstance(model, str):
            route = self._routes.get(model)
            if route is not None and not route[1]:
                body = {**body, "model": route[0]}
        return await self._post(self._url(path), body, request_id)

    async def _retry(self, attempt: Callable[..., Awaitable[_T]], *args: Any) -> tuple[_T, int]:
        """Run ``attempt(*args)`` under the retry policy: its result and the attempts made."""
        tries = 0

        async def once() -> _T:
            nonlocal tries
            tries += 1
            return await attempt(*args)

        try:
            return await self._retrying(once), tries
        except ProxyError:
            raise
        except Exception as exc:
            raise _translate(exc, tries) from exc

    # -- the httpx route -----------------------------------------------------------------------

    def _ready(self) -> httpx.AsyncClient:
        if self._client is None:
            raise RuntimeError("Upstream.start() must be awaited before making calls")
        return self._client

    def _url(self, path: str) -> httpx.URL:
        url = self._urls.get(path)
        if url is None:
            if not self._base:
                raise UpstreamError("no [fallback] api_base is set for this model")
            url = self._urls[path] = httpx.URL(self._base + "/" + path.lstrip("/"))
        return url

    async def _post(
        self, url: httpx.URL, body: dict[str, Any], request_id: str
    ) -> UpstreamResponse:
        client = self._ready()
        content = _encode(body).encode()
        headers = {**_JSON_HEADERS, "x-request-id": request_id}
        started = time.perf_counter()
        (status, data), tries = await self._retry(_post_once, client, url, content, headers)
        return UpstreamResponse(
            body=data, status=status, latency_s=time.perf_counter() - started, attempts=tries
        )

    # -- the litellm route ---------------------------------------------------------------------

    def _litellm_kwargs(self, forward: dict[str, Any], request_id: str) -> dict[str, Any]:
        kwargs = {k: v for k, v in forward.items() if k not in _LITELLM_OWN}
        kwargs.update(
            model=forward["model"],
            timeout=self._settings.timeout_s,
            num_retries=0,
            max_retries=0,
            drop_params=True,
            extra_headers={"x-request-id": request_id},
        )
        if not self._base:
            kwargs["api_key"] = self._settings.api_key() or None
        return kwargs

    async def _litellm_call(self, kwargs: dict[str, Any]) -> Any:
        if self._litellm is None:
            self._litellm = await asyncio.to_thread(_import_litellm)
        return await self._litellm.acompletion(**kwargs)

    # -- retry policy --------------------------------------------------------------------------

    def _backoff(self, attempt: int) -> float:
        """Exponential from ``backoff_s``, doubled per attempt, capped at 5 s."""
        return min(self._backoff_s * 2.0 ** (attempt - 1), BACKOFF_MAX_S)

    def _wait(self, state: RetryCallState) -> float:
        delay = self._backoff(state.attempt_number) + random.uniform(0, self._backoff_s)
        retry_after = _retry_after_of(_exception_of(state))
        return delay if retry_after is None else max(delay, retry_after)

    def _stop(self, state: RetryCallState) -> bool:
        if state.attempt_number > self._settings.max_retries:
            return True
        delay = self._backoff(state.attempt_number)
        retry_after = _retry_after_of(_exception_of(state))
        if retry_after is not None:
            if retry_after > RETRY_AFTER_CAP_S:
                return True
            delay = max(delay, retry_after)
        elapsed = time.monotonic() - state.start_time
        return elapsed + delay > self._settings.timeout_s


# -- helpers ---------------------------------------------------------------------------------


async def _post_once(
    client: httpx.AsyncClient, url: httpx.URL, content: bytes, headers: dict[str, str]
) -> tuple[int, dict[str, Any]]:
    response = await client.post(url, content=content, headers=headers)
    if response.status_code >= 300:
        raise _status_error(response)
    data = json.loads(response.content)
    if not isinstance(data, dict):
        raise UpstreamError("the upstream API answered with JSON that is not an object")
    return response.status_code, data


async def _open(client: httpx.AsyncClient, request: httpx.Request) -> httpx.Response:
    response = await client.send(request, stream=True)
    if response.status_code < 300:
        return response
    try:
        await response.aread()
    finally:
        await response.aclose()
    raise _status_error(response)


def _route(target: str) -> tuple[str, bool]:
    """(model name to send, whether litellm sends it) for a mapped target."""
    provider, slash, name = target.partition("/")
    if not slash:
        return target, False
    if provider == "openai":
        return name, False
    return target, True


def _import_litellm() -> Any:
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    litellm: Any = importlib.import_module("litellm")
    litellm.suppress_debug_info = True  # no "Give Feedback" banner on stdout for each error
    return litellm


async def _sse_from_litellm(stream: Any) -> AsyncGenerator[bytes, None]:
    async for chunk in stream:
        yield b"data: " + _encode(chunk.model_dump()).encode() + b"\n\n"
    yield b"data: [DONE]\n\n"


def _data_field(event: bytes) -> bytes:
    for line in event.split(b"\n"):
        if line.startswith(b"data:"):
            return line[5:].strip()
    return b""


def _status_error(response: httpx.Response) -> Exception:
    """The exception for a non-2xx answer: retryable, passed on (4xx), or a 502."""
    status = response.status_code
    if _retryable_status(status):
        retry_after = _parse_retry_after(response.headers) if status in (429, 503) else None
        return _RetryableStatus(status, retry_after)
    return _refusal(response)


def _retryable_status(status: int) -> bool:
    return status in (408, 429) or status >= 500


def _refusal(response: httpx.Response) -> ProxyError:
    """A status retrying cannot fix; a 4xx is passed on with its body, bar the key's own."""
    status = response.status_code
    if status in (401, 403):
        return UpstreamError(
            f"the upstream API rejected the proxy's credentials (HTTP {status}); "
            "check [fallback] api_key_env"
        )
    if 400 <= status < 500:
        try:
            payload = json.loads(response.content)
        except ValueError:
            payload = None
        return UpstreamStatus(
            status,
            payload if isinstance(payload, dict) else None,
            f"the upstream API refused the request (HTTP {status})",
        )
    return UpstreamError(f"the upstream API answered with an unexpected HTTP {status}")


def _parse_retry_after(headers: httpx.Headers) -> float | None:
    """Seconds to wait from ``retry-after-ms`` or ``Retry-After`` (seconds or an HTTP date)."""
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


def _exception_of(state: RetryCallState) -> BaseException | None:
    outcome = state.outcome
    return outcome.exception() if outcome is not None and outcome.failed else None


def _retry_after_of(exc: BaseException | None) -> float | None:
    if isinstance(exc, _RetryableStatus):
        return exc.retry_after
    headers = getattr(exc, "litellm_response_headers", None)  # the provider's, on litellm errors
    if isinstance(headers, dict) and getattr(exc, "status_code", None) in (429, 503):
        return _parse_retry_after(httpx.Headers(headers))
    return None


def _retryable(exc: BaseException) -> bool:
    if isinstance(
        exc,
        _RetryableStatus | httpx.TimeoutException | httpx.NetworkError | httpx.RemoteProtocolError,
    ):
        return True
    if isinstance(exc, ProxyError | httpx.HTTPError):
        return False
    status = getattr(exc, "status_code", None)  # litellm's errors
    if isinstance(status, int):
        return _retryable_status(status)
    return "Timeout" in type(exc).__name__


def _log_retry(state: RetryCallState) -> None:
    exc = _exception_of(state)
    error = f"HTTP {exc.status}" if isinstance(exc, _RetryableStatus) else type(exc).__name__
    wait = state.next_action.sleep if state.next_action is not None else None
    log.warning("upstream_retry", attempt=state.attempt_number, wait_s=wait, error=error)


def _translate(exc: BaseException, attempts: int, *, streaming: bool = False) -> ProxyError:
    """The one place a failed upstream call becomes the error the client sees."""
    if isinstance(exc, ProxyError):
        return exc
    if isinstance(exc, _RetryableStatus):
        tried = f"{attempts} attempt" + ("s" if attempts != 1 else "")
        if exc.status == 408:
            return UpstreamTimeout(f"the upstream API timed out (HTTP 408) on {tried}")
        what = "rate-limited the proxy" if exc.status == 429 else "failed"
        return UpstreamError(f"the upstream API {what} (HTTP {exc.status}) on {tried}")
    response = getattr(exc, "response", None)  # litellm's errors carry the provider's answer
    if isinstance(response, httpx.Response) and not _retryable_status(response.status_code):
        return _refusal(response)
    if streaming:
        name = type(exc).__name__
        if isinstance(exc, httpx.TimeoutException) or "Timeout" in name:
            return UpstreamTimeout(f"the upstream stream stalled mid-way ({name})")
        return UpstreamError(f"the upstream stream broke off mid-way ({name})")
    return map_upstream_exception(exc)
