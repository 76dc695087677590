"""The fallback client: send a request to the upstream API and hand its answer back.

Which way a request goes depends on the model it names (``[fallback] models`` maps a requested
name to a target; an unmapped name is sent unchanged):

- **direct**, the hot path: a target without a provider prefix, or ``openai/<name>`` (the prefix
  is dropped), goes to ``[fallback] api_base`` over one pooled ``aiohttp.ClientSession`` made at
  start-up. The JSON is serialised once and sent as bytes; the answer's bytes are kept
  (:attr:`UpstreamResponse.raw`) so that they can be relayed without serialising them again.
  aiohttp, not httpx: on this path httpx's client and connection pool cost 4 to 10 times the CPU
  per request (``bench/upstream_clients.py``, numbers in ``bench/README.md``). A proxy set in
  ``HTTPS_PROXY``/``HTTP_PROXY``/``ALL_PROXY`` (and ``NO_PROXY``) is read once, at start-up.
- **litellm**: a mapped target with any other provider prefix (``anthropic/claude-3-5-haiku``),
  sent by :mod:`proxy.upstream.litellm_route`.

Only allow-listed parameters are sent: the body upstream is built from the keys of
:data:`proxy.params.CHAT_PARAMETERS` (``COMPLETIONS_PARAMETERS``, ``EMBEDDINGS_PARAMETERS`` for
:meth:`Upstream.post_json`) that the request sets, on both routes. Validation has already refused
anything else with a 400; this is the second wall (litellm's own keywords are kept out in
:mod:`proxy.upstream.litellm_route`).

Every call runs under the retry policy of :mod:`proxy.upstream.retry`, which lives there and
nowhere else, and only where the API cannot have done (and billed) the work already:

- a connection that could not be made (refused, DNS, TLS, the connect or pool timeout), and
- an answer of 408, 429, 502, 503 or 504.

**Not retried**: a 500 or any other 5xx, a read timeout, a reset or disconnect once the request
was sent, a body cut short, any other 4xx; and a stream is never retried once
:meth:`Upstream.chat_stream` has returned it. The rule is in :mod:`proxy.upstream.failures`.
``timeout_s`` bounds each wait for upstream's next bytes (as httpx's read timeout did),
``connect_timeout_s`` each new connection.

Every call says how many attempts it made: :attr:`UpstreamResponse.attempts` on success,
:attr:`UpstreamStream.attempts` on a stream, and ``attempts`` on the :class:`ProxyError` it
raises.

Failures become :mod:`proxy.errors` in one module, :mod:`proxy.upstream.failures`:
``UpstreamTimeout`` (504), ``UpstreamRateLimited`` (429, with the API's ``Retry-After``),
``UpstreamError`` (502), or ``UpstreamStatus`` carrying a 4xx and OpenAI's error body. No message
carries a key or a prompt.

Streams: :meth:`Upstream.chat_stream` returns an :class:`~proxy.upstream.stream.UpstreamStream`
once upstream has answered 200, so every error before the first byte is raised (and retried)
there.
"""

from __future__ import annotations

import json
import time
import urllib.parse
import urllib.request
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import aiohttp
from yarl import URL

from proxy.config import FallbackSettings
from proxy.errors import UpstreamError
from proxy.params import (
    CHAT_PARAMETERS,
    COMPLETIONS_PARAMETERS,
    EMBEDDINGS_PARAMETERS,
    forwarded,
)
from proxy.upstream.failures import status_error
from proxy.upstream.litellm_route import LitellmRoute, answer_of, sse_of
from proxy.upstream.retry import BACKOFF_INITIAL_S, RetryPolicy
from proxy.upstream.stream import UpstreamStream

__all__ = ["Upstream", "UpstreamResponse", "UpstreamStream"]

MAX_CONNECTIONS = 64

_encode = json.JSONEncoder(check_circular=False, separators=(",", ":")).encode
# The JSON endpoints of post_json and the parameters each may carry.
_POST_PARAMETERS: dict[str, frozenset[str]] = {
    "/completions": frozenset(COMPLETIONS_PARAMETERS),
    "/embeddings": frozenset(EMBEDDINGS_PARAMETERS),
}
_CHAT = frozenset(CHAT_PARAMETERS)


@dataclass(frozen=True, kw_only=True)
class UpstreamResponse:
    body: dict[str, Any]
    """The parsed JSON the API answered (a ``chat.completion`` for :meth:`Upstream.chat`)."""
    status: int
    latency_s: float
    """Wall time of the whole call, retries and their waits included."""
    attempts: int
    raw: bytes = field(default=b"", repr=False)
    """``body`` as bytes: what upstream sent (decompressed), or ``body`` serialised once."""


class Upstream:
    """The client of the fallback API. ``await start()`` before use, ``await aclose()`` after.

    ``backoff_s`` is the first retry's backoff (tests make it small).
    """

    def __init__(
        self,
        settings: FallbackSettings,
        *,
        backoff_s: float = BACKOFF_INITIAL_S,
    ) -> None:
        self._settings = settings
        self._routes = {name: _route(target) for name, target in settings.models.items()}
        self._base = settings.api_base.rstrip("/")
        self._urls: dict[str, URL] = {}
        self._session: aiohttp.ClientSession | None = None
        self._proxy: str | None = None
        self._litellm = LitellmRoute(settings)
        self._retry = RetryPolicy(
            max_retries=settings.max_retries, timeout_s=settings.timeout_s, backoff_s=backoff_s
        ).run

    # -- life cycle ----------------------------------------------------------------------------

    async def start(self) -> None:
        """Open the connection pool, and import litellm if the model mapping needs it."""
        if self._session is not None:
            return
        s = self._settings
        key = s.api_key()
        self._proxy = _env_proxy(self._base) if self._base else None
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=MAX_CONNECTIONS, ttl_dns_cache=300),
            headers={"authorization": f"Bearer {key}"} if key else None,
            timeout=aiohttp.ClientTimeout(
                total=None,
                connect=s.timeout_s,
                sock_connect=s.connect_timeout_s,
                sock_read=s.timeout_s,
            ),
            trust_env=False,  # the proxy variables were read once above, not per request
        )
        if any(via for _, via in self._routes.values()):
            await self._litellm.load()

    async def aclose(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()

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

    def via_litellm(self, requested_model: str) -> bool:
        """Whether a request for ``requested_model`` goes through litellm (not ``api_base``)."""
        route = self._routes.get(requested_model)
        return route is not None and route[1]

    def model_ids(self) -> list[str]:
        """The names the mapping knows, for ``GET /v1/models``."""
        return list(self._settings.models)

    # -- calls ---------------------------------------------------------------------------------

    async def chat(self, body: dict[str, Any], *, request_id: str) -> UpstreamResponse:
        """A non-streamed chat completion (a ``stream`` flag in ``body`` is turned off)."""
        model, via_litellm = self._routes.get(body.get("model", ""), (body.get("model", ""), False))
        forward = forwarded(body, _CHAT)
        forward["model"] = model
        if forward.get("stream"):
            forward["stream"] = False
            forward.pop("stream_options", None)
        if via_litellm:
            started = time.perf_counter()
            kwargs = self._litellm.kwargs(forward, request_id)
            result, tries = await self._retry(self._litellm.call, kwargs)
            latency = time.perf_counter() - started
            data, raw = answer_of(result)
            return UpstreamResponse(
                body=data, status=200, latency_s=latency, attempts=tries, raw=raw
            )
        return await self._post(self._url("/chat/completions"), forward, request_id)

    async def chat_stream(self, body: dict[str, Any], *, request_id: str) -> UpstreamStream:
        """Open a streamed chat completion; returns once upstream has answered 200."""
        model, via_litellm = self._routes.get(body.get("model", ""), (body.get("model", ""), False))
        options = body.get("stream_options")
        strip_usage = not (isinstance(options, dict) and options.get("include_usage"))
        forward = forwarded(body, _CHAT)
        forward.update(model=model, stream=True)
        if strip_usage:
            extra = options if isinstance(options, dict) else {}
            forward["stream_options"] = {**extra, "include_usage": True}
        started = time.perf_counter()
        if via_litellm:
            kwargs = self._litellm.kwargs(forward, request_id)
            kwargs.update(stream=True, stream_options=forward["stream_options"])
            result, tries = await self._retry(self._litellm.call, kwargs)
            stream = UpstreamStream(
                sse_of(result),
                result.aclose,
                strip_usage=strip_usage,
                latency_s=time.perf_counter() - started,
                attempts=tries,
            )
            return stream
        session = self._ready()
        content = _encode(forward).encode()
        headers = _headers(request_id)
        url = self._url("/chat/completions")
        response, tries = await self._retry(_open, session, url, content, headers, self._proxy)
        return UpstreamStream(
            response.content.iter_any(),
            _closer(response),
            strip_usage=strip_usage,
            latency_s=time.perf_counter() - started,
            attempts=tries,
        )

    async def post_json(
        self, path: str, body: dict[str, Any], *, request_id: str
    ) -> UpstreamResponse:
        """POST ``body`` to ``api_base + path`` (``/embeddings``, ``/completions``), JSON back.

        A mapped model name is replaced when its target is on ``api_base``; not streamed. Only
        the parameters of that endpoint are sent.
        """
        allowed = _POST_PARAMETERS.get(path)
        if allowed is None:
            raise ValueError(f"post_json does not know the endpoint {path!r}")
        body = forwarded(body, allowed)
        model = body.get("model")
        if isinstance(model, str):
            route = self._routes.get(model)
            if route is not None and not route[1]:
                body = {**body, "model": route[0]}
        return await self._post(self._url(path), body, request_id)

    async def post_direct(
        self, path: str, body: dict[str, Any], *, request_id: str
    ) -> UpstreamResponse:
        """POST a ``body`` the caller built from its own allow-list to ``api_base + path``
        (:mod:`proxy.upstream.responses_api`), JSON back, under the retry policy."""
        return await self._post(self._url(path), body, request_id)

    async def open_direct(
        self, path: str, body: dict[str, Any], *, request_id: str
    ) -> UpstreamStream:
        """Open a streamed POST of such a ``body``; returns once upstream has answered 200."""
        started = time.perf_counter()
        content = _encode(body).encode()
        response, tries = await self._retry(
            _open, self._ready(), self._url(path), content, _headers(request_id), self._proxy
        )
        return UpstreamStream(
            response.content.iter_any(),
            _closer(response),
            strip_usage=False,
            latency_s=time.perf_counter() - started,
            attempts=tries,
        )

    # -- the direct route ----------------------------------------------------------------------

    def _ready(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("Upstream.start() must be awaited before making calls")
        return self._session

    def _url(self, path: str) -> URL:
        url = self._urls.get(path)
        if url is None:
            if not self._base:
                raise UpstreamError("no [fallback] api_base is set for this model")
            url = self._urls[path] = URL(self._base + "/" + path.lstrip("/"))
        return url

    async def _post(self, url: URL, body: dict[str, Any], request_id: str) -> UpstreamResponse:
        session = self._ready()
        content = _encode(body).encode()
        started = time.perf_counter()
        (status, data, raw), tries = await self._retry(
            _post_once, session, url, content, _headers(request_id), self._proxy
        )
        return UpstreamResponse(
            body=data,
            status=status,
            latency_s=time.perf_counter() - started,
            attempts=tries,
            raw=raw,
        )


# -- helpers ---------------------------------------------------------------------------------


def _headers(request_id: str) -> dict[str, str]:
    return {"content-type": "application/json", "x-request-id": request_id}


async def _post_once(
    session: aiohttp.ClientSession,
    url: URL,
    content: bytes,
    headers: dict[str, str],
    proxy: str | None,
) -> tuple[int, dict[str, Any], bytes]:
    async with session.post(
        url, data=content, headers=headers, proxy=proxy, allow_redirects=False
    ) as response:
        raw = await response.read()
        status = response.status
        if status >= 300:
            raise status_error(status, response.headers, raw)
    data = json.loads(raw)
    if not isinstance(data, dict):
        raise UpstreamError("the upstream API answered with JSON that is not an object")
    return status, data, raw


async def _open(
    session: aiohttp.ClientSession,
    url: URL,
    content: bytes,
    headers: dict[str, str],
    proxy: str | None,
) -> aiohttp.ClientResponse:
    response = await session.post(
        url, data=content, headers=headers, proxy=proxy, allow_redirects=False
    )
    if response.status < 300:
        return response
    try:
        raw = await response.read()
    finally:
        response.release()
    raise status_error(response.status, response.headers, raw)


def _closer(response: aiohttp.ClientResponse) -> Callable[[], Awaitable[None]]:
    """Give the connection back when the body was read to its end; otherwise drop it."""

    async def close() -> None:
        if response.content.at_eof():
            response.release()
        else:
            response.close()

    return close


def _env_proxy(base: str) -> str | None:
    """The proxy that ``*_PROXY``/``NO_PROXY`` name for ``base`` (read once, like httpx did)."""
    parts = urllib.parse.urlsplit(base)
    if parts.hostname and urllib.request.proxy_bypass(parts.hostname):
        return None
    proxies = urllib.request.getproxies_environment()
    return proxies.get(parts.scheme) or proxies.get("all") or None


def _route(target: str) -> tuple[str, bool]:
    """(model name to send, whether litellm sends it) for a mapped target."""
    provider, slash, name = target.partition("/")
    if not slash:
        return target, False
    if provider == "openai":
        return name, False
    return target, True
