"""Limits that keep one client from tying the server up: body size, concurrency, timeouts.

- ``[server] max_body_bytes``: a declared ``Content-Length`` over it gets a 413 before a byte of
  the body is read; a body without one (chunked) is counted as it is received, and the request
  fails with a 413 as soon as the count passes the limit. Nothing reads an unbounded body.
- ``[server] body_timeout_s``: the whole body must arrive within this time, or a 408.
- ``[server] max_concurrency``: one request more than this many in flight gets a 429 with
  ``Retry-After``, in OpenAI's shape, so the client's SDK backs off and retries by itself.
  ``/healthz`` and ``/metrics`` are neither counted nor refused, so monitoring works under load.
- ``[server] header_timeout_s``: uvicorn has no timeout for the request line and headers (its
  keep-alive timer stops at the first byte of the next request, and a fresh connection has
  none), so a client dribbling headers a byte at a time would hold a connection forever.
  :func:`guarded_protocol` is uvicorn's httptools protocol with that timeout: from connecting
  (or from the first byte of a kept-alive connection's next request) to the end of the headers.
  Past it the client gets a 408 and is disconnected.
- The request head (line and headers) may take at most 16 KiB (:data:`MAX_HEAD_BYTES`, the
  limit h11 keeps), and an HTTP/1.1 request must name its ``Host``, as h11 requires; otherwise a
  400, and the connection is closed. httptools (llhttp) parses the rest as strictly as h11 does
  (a ``Content-Length`` beside ``Transfer-Encoding``, a bad header name: a 400), and costs about
  a quarter less CPU per API request (``bench/README.md``).

A response that leaves part of the body unread carries ``Connection: close``, so the rest is not
drained into a connection that is kept alive.
"""

from __future__ import annotations

import asyncio
from typing import ClassVar

import structlog
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from proxy.config import ServerSettings
from proxy.errors import PayloadTooLarge, ProxyError, RequestTimeout, TooManyRequests
from proxy.server.lookup import services_in
from proxy.server.render import render
from proxy.serving.in_flight import InFlight

log = structlog.get_logger("frugal.limits")

UNLIMITED_PATHS = frozenset({"/healthz", "/metrics"})
UPLOAD_PATHS = frozenset({"/v1/files", "/files"})  # a body too large there names ``file``
_CLOSE = (b"connection", b"close")


class LimitsMiddleware:
    def __init__(self, app: ASGIApp, settings: ServerSettings, in_flight: InFlight) -> None:
        self.app = app
        self.max_body = settings.max_body_bytes
        self.body_timeout_s = settings.body_timeout_s
        self.max_concurrency = settings.max_concurrency
        self.in_flight = in_flight  # the app's (Services.in_flight), read by the metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path") in UNLIMITED_PATHS:
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_body:
            too_large = _too_large(self.max_body, scope, headers={"connection": "close"})
            await self._refuse(scope, receive, send, too_large, "too_large")
            return
        if self.in_flight.count >= self.max_concurrency:
            busy = TooManyRequests(
                f"this proxy is handling its limit of {self.max_concurrency} requests at once; "
                "retry shortly"
            )
            await self._refuse(scope, receive, send, busy, "too_many")  # with Retry-After
            return
        self.in_flight.count += 1
        try:
            await self.app(scope, *self._guard(scope, declared, receive, send))
        finally:
            self.in_flight.count -= 1

    def _guard(
        self, scope: Scope, declared: int | None, receive: Receive, send: Send
    ) -> tuple[Receive, Send]:
        """receive: counts the body and enforces its deadline; send: closes the connection
        when the body was not read to its end."""
        deadline = asyncio.get_running_loop().time() + self.body_timeout_s
        received = 0
        body_done = declared == 0 or (declared is None and not _chunked(scope))
        cut_short = False
        max_body = self.max_body

        async def guarded_receive() -> Message:
            nonlocal received, body_done, cut_short
            if body_done:
                return await receive()
            try:
                async with asyncio.timeout_at(deadline):
                    message = await receive()
            except TimeoutError:
                cut_short = body_done = True
                self._count(scope, "body_timeout")
                raise RequestTimeout(
                    f"the request body did not arrive within {self.body_timeout_s:g} seconds"
                ) from None
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > max_body:
                    cut_short = body_done = True
                    self._count(scope, "too_large")
                    raise _too_large(max_body, scope)
                body_done = not message.get("more_body", False)
            else:
                body_done = True
            return message

        async def guarded_send(message: Message) -> None:
            if message["type"] == "http.response.start" and (cut_short or not body_done):
                message["headers"] = [*message.get("headers", []), _CLOSE]
            await send(message)

        return guarded_receive, guarded_send

    def _count(self, scope: Scope, reason: str) -> None:
        services = services_in(scope)
        if services is not None:
            services.metrics.rejected(reason)

    async def _refuse(
        self, scope: Scope, receive: Receive, send: Send, error: ProxyError, reason: str
    ) -> None:
        self._count(scope, reason)
        log.info(
            "rejected",
            request_id=scope.get("state", {}).get("request_id"),
            key=scope.get("state", {}).get("key_name"),
            method=scope.get("method"),
            path=str(scope.get("path", ""))[:100],
            status=error.status,
            reason=reason,
        )
        await render(error, scope.get("state", {}).get("request_id"))(scope, receive, send)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def body_pending(scope: Scope) -> bool:
    """Whether the request has a body still to be read (a declared length, or chunked): a
    refusal sent before it is read closes the connection, so the rest is never waited for."""
    declared = _content_length(scope)
    return (declared is None and _chunked(scope)) or bool(declared)


def _chunked(scope: Scope) -> bool:
    return any(name == b"transfer-encoding" for name, _ in scope.get("headers", ()))


def _too_large(limit: int, scope: Scope, headers: dict[str, str] | None = None) -> PayloadTooLarge:
    return PayloadTooLarge(
        f"the request body is larger than this proxy accepts ({limit} bytes, "
        "[server] max_body_bytes)",
        headers=headers,
        param="file" if scope.get("path") in UPLOAD_PATHS else None,
    )


# -- the request head: its deadline and its size ----------------------------------------------

MAX_HEAD_BYTES = 16 * 1024
"""The most a request line and its headers may take (h11's limit, which this protocol keeps)."""


class _BadHead(Exception):
    """A request head this server refuses: uvicorn answers it with a 400 and closes."""


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, plus a deadline for the request line and headers, a 16 KiB
    bound on them, and ``Host`` required of HTTP/1.1, as h11 requires it.

    The deadline runs from connecting, or from the first byte of a kept-alive connection's next
    request, to the end of the headers. The size is counted twice: every byte received while a
    head is incomplete (so a header value that never ends is not buffered without bound), and
    the parsed line and headers (so a head that arrives in one read is held to it too).
    """

    header_timeout_s: ClassVar[float] = 10.0
    _header_timer: asyncio.TimerHandle | None = None
    _in_head = False  # between a request's first byte (or the connection) and its headers' end
    _head_bytes = 0  # bytes received since then
    _parsed = 0  # bytes of request line and headers parsed since then
    _has_host = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._begin_head()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._in_head:
            self._head_bytes += len(data)
        super().data_received(data)
        if self._in_head and self._head_bytes > MAX_HEAD_BYTES and not self.transport.is_closing():
            self.send_400_response("Invalid HTTP request received.")

    def on_message_begin(self) -> None:
        if not self._in_head:
            self._begin_head()  # the first byte of the next request on a kept-alive connection
        self._has_host = False
        self._parsed = 0
        super().on_message_begin()

    def on_url(self, url: bytes) -> None:
        self._count(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count(len(name) + len(value) + 4)
        if name.lower() == b"host":
            self._has_host = True
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        if not self._has_host and self.parser.get_http_version() == "1.1":
            raise _BadHead("HTTP/1.1 without Host")
        self._in_head = False
        self._disarm()
        super().on_headers_complete()

    def _count(self, size: int) -> None:
        self._parsed += size
        if self._parsed > MAX_HEAD_BYTES:
            raise _BadHead("request head too large")

    def _begin_head(self) -> None:
        self._in_head = True
        self._head_bytes = 0
        self._disarm()
        self._header_timer = self.loop.call_later(self.header_timeout_s, self._headers_late)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_late(self) -> None:
        self._header_timer = None
        if self.transport.is_closing() or not self._in_head:
            return
        log.info("rejected", status=408, reason="header_timeout")
        if self.cycle is None or self.cycle.response_complete:  # no answer under way
            late = RequestTimeout(
                f"the request headers did not arrive within {self.header_timeout_s:g} seconds",
                headers={"connection": "close"},
            )
            response = render(late)
            head = b"".join(name + b": " + value + b"\r\n" for name, value in response.raw_headers)
            status_line = b"HTTP/1.1 408 Request Timeout\r\n"
            self.transport.write(status_line + head + b"\r\n" + response.body)
        self.transport.close()


def guarded_protocol(header_timeout_s: float) -> type[GuardedHttpToolsProtocol]:
    """The protocol class for ``uvicorn.Config(http=...)`` with this header deadline."""
    return type(
        "GuardedHttpToolsProtocol",
        (GuardedHttpToolsProtocol,),
        {"header_timeout_s": header_timeout_s},
    )
