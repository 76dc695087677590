"""The direct route: an OpenAI-compatible API at ``[fallback] api_base``, over aiohttp.

The hot path: a target without a provider prefix, or ``openai/<name>`` (the prefix is dropped),
and every unmapped model name. One pooled ``aiohttp.ClientSession`` is made at start-up; the
JSON is serialised once and sent as bytes, and the answer's bytes are kept so that they can be
relayed without serialising them again. aiohttp, not httpx: on this path httpx's client and
connection pool cost 4 to 10 times the CPU per request (``bench/upstream_clients.py``, numbers
in ``bench/README.md``). A proxy set in ``HTTPS_PROXY``/``HTTP_PROXY``/``ALL_PROXY`` (and
``NO_PROXY``) is read once, at start-up.

Each method is one attempt; :class:`~proxy.upstream.client.Upstream` retries it. A status of
300 or more becomes a :class:`~proxy.errors.ProxyError` through
:func:`proxy.upstream.failures.status_error`.
"""

from __future__ import annotations

import json
import urllib.parse
import urllib.request
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from yarl import URL

from proxy.config import FallbackSettings
from proxy.errors import UpstreamError
from proxy.upstream.failures import status_error
from proxy.upstream.model_list import ModelList
from proxy.upstream.route import Answer, Opened

MAX_CONNECTIONS = 64
KEEPALIVE_S = 4.0
"""How long an idle pooled connection is kept for reuse: under the 5 s after which uvicorn (the
servers of vLLM, llama-cpp-python, our fake API) and llama-server close an idle connection. Kept
longer, a request can be written into a connection just as the server closes it; it is then reset
and, being possibly billed, not retried: a 502 for nothing."""

_encode = json.JSONEncoder(check_circular=False, separators=(",", ":")).encode


class DirectRoute:
    """The :class:`~proxy.upstream.route.Route` to ``api_base``, plus ``post`` for the JSON
    endpoints other than chat (``/completions``, ``/embeddings``)."""

    def __init__(self, settings: FallbackSettings) -> None:
        self._settings = settings
        self._base = settings.api_base.rstrip("/")
        self._urls: dict[str, URL] = {}
        self._session: aiohttp.ClientSession | None = None
        self._proxy: str | None = None
        self.models = ModelList(self._base + "/models", self._ready, proxy=lambda: self._proxy)
        """The upstream's own model list (``GET api_base/models``), cached and bounded."""

    async def start(self) -> None:
        """Open the connection pool (once)."""
        if self._session is not None:
            return
        s = self._settings
        key = s.api_key()
        self._proxy = _env_proxy(self._base) if self._base else None
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(
                limit=MAX_CONNECTIONS, ttl_dns_cache=300, keepalive_timeout=KEEPALIVE_S
            ),
            headers={"authorization": f"Bearer {key}"} if key else None,
            timeout=aiohttp.ClientTimeout(
                total=None,
                connect=s.timeout_s,
                sock_connect=s.connect_timeout_s,
                sock_read=s.timeout_s,
            ),
            trust_env=False,  # the proxy variables were read once above, not per request
        )

    async def aclose(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    def ready(self) -> None:
        """Raise, before any attempt, what no attempt could get past."""
        self._ready()
        if not self._base:
            raise UpstreamError("no [fallback] api_base is set for this model")

    async def complete(self, forward: dict[str, Any], request_id: str) -> Answer:
        return await self.post("/chat/completions", forward, request_id)

    async def post(self, path: str, body: dict[str, Any], request_id: str) -> Answer:
        """One POST of ``body`` to ``api_base + path``; its status, JSON object and bytes."""
        session, url = self._ready(), self._url(path)
        content = _encode(body).encode()
        async with session.post(
            url,
            data=content,
            headers=_headers(request_id),
            proxy=self._proxy,
            allow_redirects=False,
        ) as response:
            raw = await response.read()
            status = response.status
            if status >= 300:
                raise status_error(status, response.headers, raw)
        data = json.loads(raw)
        if not isinstance(data, dict):
            raise UpstreamError("the upstream API answered with JSON that is not an object")
        return status, data, raw

    async def open_stream(
        self, forward: dict[str, Any], request_id: str, path: str = "/chat/completions"
    ) -> Opened:
        """A streamed POST to ``api_base + path`` (chat, or the Responses API's own)."""
        session, url = self._ready(), self._url(path)
        content = _encode(forward).encode()
        response = await session.post(
            url,
            data=content,
            headers=_headers(request_id),
            proxy=self._proxy,
            allow_redirects=False,
        )
        if response.status < 300:
            return Opened(response.content.iter_any(), _closer(response))
        try:
            raw = await response.read()
        finally:
            response.release()
        raise status_error(response.status, response.headers, raw)

    def _ready(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("Upstream.start() must be awaited before making calls")
        return self._session

    def _url(self, path: str) -> URL:
        url = self._urls.get(path)
        if url is None:
            url = self._urls[path] = URL(self._base + "/" + path.lstrip("/"))
        return url


def _headers(request_id: str) -> dict[str, str]:
    return {"content-type": "application/json", "x-request-id": request_id}


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
