"""The direct route: an OpenAI-compatible API at ``[fallback] api_base``, over aiohttp.

The hot path: a target without a provider prefix, or ``openai/<name>`` (the prefix is dropped),
and every unmapped model name. One pooled ``aiohttp.ClientSession`` is made at start-up; the
JSON is serialised once and sent as bytes, and the answer's bytes are kept so that they can be
relayed without serialising them again. aiohttp, not httpx: on this path httpx's client and
connection pool cost 4 to 10 times the CPU per request (``bench/upstream_clients.py``, numbers
in ``bench/README.md``). A proxy set in ``HTTPS_PROXY``/``HTTP_PROXY``/``ALL_PROXY`` (and
``NO_PROXY``) is read once, at start-up. A call sent with ``service_tier: "flex"`` waits
``[fallback] flex_timeout_s`` for its answer instead of ``timeout_s``.

Each method is one attempt; :class:`~proxy.upstream.client.Upstream` retries it. A status of
300 or more becomes a :class:`~proxy.errors.ProxyError` through
:func:`proxy.upstream.failures.status_error`.

An answer's body is read chunk by chunk up to ``[fallback] max_answer_bytes``
(:func:`read_bounded`): a bigger one is cut off there, its connection dropped, and the call
fails with a 502 that says so (never retried: the API has done the work). A body over
:data:`PARSE_IN_THREAD_BYTES` is parsed in a thread, so that the event loop (``/healthz``, the
other requests) is not held while it is. An error status's body is read up to
:data:`ERROR_BODY_BYTES` only: what is past it is not needed to tell the client.
"""

from __future__ import annotations

import asyncio
import json
import urllib.parse
import urllib.request
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import aiohttp
from yarl import URL

from proxy.config import FallbackSettings
from proxy.errors import UpstreamError
from proxy.upstream.failures import status_error
from proxy.upstream.model_list import ModelList
from proxy.upstream.route import Answer, Opened, too_large

MAX_CONNECTIONS = 64
KEEPALIVE_S = 4.0
"""How long an idle pooled connection is kept for reuse: under the 5 s after which uvicorn (the
servers of vLLM, llama-cpp-python, our fake API) and llama-server close an idle connection. Kept
longer, a request can be written into a connection just as the server closes it; it is then reset
and, being possibly billed, not retried: a 502 for nothing."""

PARSE_IN_THREAD_BYTES = 256 * 1024
"""A JSON answer bigger than this is parsed in a thread; a smaller one on the loop, where a
thread's hand-over would cost more than the parse (the hot path)."""
ERROR_BODY_BYTES = 64 * 1024
"""The most bytes of an error status's body read (for the API's own error message)."""
_CHUNK = 64 * 1024

_encode = json.JSONEncoder(check_circular=False, separators=(",", ":")).encode


class DirectRoute:
    """The :class:`~proxy.upstream.route.Route` to ``api_base``, plus ``post`` for the JSON
    endpoints other than chat (``/completions``, ``/embeddings``), and ``send`` and
    ``open_get`` for the Files and Batch APIs."""

    def __init__(self, settings: FallbackSettings, *, api_key: str | None = None) -> None:
        self._settings = settings
        self._key = api_key  # sent instead of api_key_env's: a litellm provider's own key
        self._base = settings.api_base.rstrip("/")
        self._urls: dict[str, URL] = {}
        self._session: aiohttp.ClientSession | None = None
        self._proxy: str | None = None
        self._waits = {
            flex: aiohttp.ClientTimeout(
                total=None, connect=wait, sock_connect=settings.connect_timeout_s, sock_read=wait
            )
            for flex, wait in ((False, settings.timeout_s), (True, settings.flex_timeout_s))
        }
        self.models = ModelList(self._base + "/models", self._ready, proxy=lambda: self._proxy)
        """The upstream's own model list (``GET api_base/models``), cached and bounded."""

    async def start(self) -> None:
        """Open the connection pool (once)."""
        if self._session is not None:
            return
        s = self._settings
        key = self._key or s.api_key()
        self._proxy = _env_proxy(self._base) if self._base else None
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(
                limit=MAX_CONNECTIONS, ttl_dns_cache=300, keepalive_timeout=KEEPALIVE_S
            ),
            headers={"authorization": f"Bearer {key}"} if key else None,
            timeout=self._timeout({}),
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

    async def post(
        self, path: str, body: dict[str, Any], request_id: str, limit: int | None = None
    ) -> Answer:
        """One POST of ``body`` to ``api_base + path``; its status, JSON object and bytes (at
        most ``limit`` of them: by default ``[fallback] max_answer_bytes``)."""
        session, url = self._ready(), self._url(path)
        content = _encode(body).encode()
        async with session.post(
            url,
            data=content,
            headers=_headers(request_id),
            proxy=self._proxy,
            allow_redirects=False,
            timeout=self._timeout(body),
        ) as response:
            status = response.status
            if status >= 300:
                raw = await read_bounded(response, ERROR_BODY_BYTES, cut=True)
                raise status_error(status, response.headers, raw)
            raw = await read_bounded(response, limit or self._settings.max_answer_bytes)
        data = json.loads(raw) if len(raw) <= PARSE_IN_THREAD_BYTES else await _parse(raw)
        if not isinstance(data, dict):
            raise UpstreamError("the upstream API answered with JSON that is not an object")
        return status, data, raw

    async def send(
        self,
        method: str,
        path: str,
        request_id: str,
        body: dict[str, Any] | None = None,
        form: Mapping[str, str | tuple[str, bytes]] | None = None,
    ) -> Answer:
        """One ``method`` request to ``api_base + path`` with a JSON ``body``, a multipart
        ``form`` (a field is a string, or a file as ``(filename, content)``) or neither; its
        status, JSON object and bytes (at most ``[fallback] max_answer_bytes``). For the Files
        and Batch APIs (:mod:`proxy.upstream.batch_api`); the form is made again each attempt."""
        session, url = self._ready(), self._url(path)
        headers = {"x-request-id": request_id}
        data: Any = None
        if form is not None:
            data = aiohttp.FormData()
            for name, value in form.items():
                if isinstance(value, tuple):
                    data.add_field(
                        name, value[1], filename=value[0], content_type="application/jsonl"
                    )
                else:
                    data.add_field(name, value)
        elif body is not None:
            data = _encode(body).encode()
            headers["content-type"] = "application/json"
        async with session.request(
            method, url, data=data, headers=headers, proxy=self._proxy, allow_redirects=False
        ) as response:
            status = response.status
            if status >= 300:
                raw = await read_bounded(response, ERROR_BODY_BYTES, cut=True)
                raise status_error(status, response.headers, raw)
            raw = await read_bounded(response, self._settings.max_answer_bytes)
        data = json.loads(raw) if len(raw) <= PARSE_IN_THREAD_BYTES else await _parse(raw)
        if not isinstance(data, dict):
            raise UpstreamError("the upstream API answered with JSON that is not an object")
        return status, data, raw

    async def open_get(self, path: str, request_id: str) -> Opened:
        """A ``GET`` of ``api_base + path`` whose body is read by the caller, chunk by chunk (a
        file's content); returns once the API has answered 2xx."""
        session, url = self._ready(), self._url(path)
        response = await session.get(
            url, headers={"x-request-id": request_id}, proxy=self._proxy, allow_redirects=False
        )
        if response.status < 300:
            return Opened(response.content.iter_chunked(_CHUNK), _closer(response))
        try:
            raw = await read_bounded(response, ERROR_BODY_BYTES, cut=True)
        finally:
            response.release()
        raise status_error(response.status, response.headers, raw)

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
            timeout=self._timeout(forward),
        )
        if response.status < 300:
            return Opened(response.content.iter_any(), _closer(response))
        try:
            raw = await read_bounded(response, ERROR_BODY_BYTES, cut=True)
        finally:
            response.release()
        raise status_error(response.status, response.headers, raw)

    def _timeout(self, body: dict[str, Any]) -> aiohttp.ClientTimeout:
        """The waits of a call of ``body``: ``[fallback] flex_timeout_s`` in place of
        ``timeout_s`` for a flex call (the API answers those slowly by contract)."""
        return self._waits[body.get("service_tier") == "flex"]

    def _ready(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("Upstream.start() must be awaited before making calls")
        return self._session

    def _url(self, path: str) -> URL:
        url = self._urls.get(path)
        if url is None:
            url = self._urls[path] = URL(self._base + "/" + path.lstrip("/"))
        return url


async def read_bounded(response: aiohttp.ClientResponse, limit: int, *, cut: bool = False) -> bytes:
    """The body of ``response``, read chunk by chunk (decompressed) up to ``limit`` bytes.

    Past ``limit`` the connection is dropped and, unless ``cut`` (then the first ``limit``
    bytes are the body), :class:`~proxy.errors.UpstreamError` says the answer was too large. A
    ``Content-Length`` over the limit fails before a byte is read."""
    declared = response.content_length
    if declared is not None and declared > limit and not cut:
        response.close()
        raise too_large("answer", limit)
    if declared is not None and declared <= limit and "content-encoding" not in response.headers:
        return await response.read()  # exactly the bytes declared: the hot path, as before
    parts: list[bytes] = []
    size = 0
    async for chunk in response.content.iter_chunked(_CHUNK):
        size += len(chunk)
        if size > limit:
            response.close()
            if not cut:
                raise too_large("answer", limit)
            parts.append(chunk[: len(chunk) - (size - limit)])
            break
        parts.append(chunk)
    return b"".join(parts)


async def _parse(raw: bytes) -> Any:
    return await asyncio.to_thread(json.loads, raw)


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
