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
  :func:`guarded_protocol` is uvicorn's h11 protocol with that timeout: from connecting (or from
  the first byte of a kept-alive connection's next request) to the end of the headers. Past it
  the client gets a 408 and is disconnected. Header size is bounded by h11 (16 KiB: a larger
  head gets a 400).

A response that leaves part of the body unread carries ``Connection: close``, so the rest is not
drained into a connection that is kept alive.
"""

from __future__ import annotations

import asyncio
from typing import ClassVar

import h11
import structlog
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

from proxy.config import ServerSettings
from proxy.errors import PayloadTooLarge, ProxyError, RequestTimeout, TooManyRequests
from proxy.http.render import render
from proxy.http.services import services_in

log = structlog.get_logger("frugal.limits")

UNLIMITED_PATHS = frozenset({"/healthz", "/metrics"})
_CLOSE = (b"connection", b"close")


class InFlight:
    """Requests being handled now (the limited ones); read by the metrics at scrape time."""

    __slots__ = ("count",)

    def __init__(self) -> None:
        self.count = 0


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
            too_large = _too_large(self.max_body, headers={"connection": "close"})
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
                    raise _too_large(max_body)
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


def _chunked(scope: Scope) -> bool:
    return any(name == b"transfer-encoding" for name, _ in scope.get("headers", ()))


def _too_large(limit: int, headers: dict[str, str] | None = None) -> PayloadTooLarge:
    return PayloadTooLarge(
        f"the request body is larger than this proxy accepts ({limit} bytes, "
        "[server] max_body_bytes)",
        headers=headers,
    )


# -- the header timeout -----------------------------------------------------------------------


class HeaderTimeoutProtocol(H11Protocol):
    """uvicorn's h11 protocol, plus a deadline for the request line and headers."""

    header_timeout_s: ClassVar[float] = 10.0
    _header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        if self._header_timer is None and self.conn.their_state is h11.IDLE:
            self._arm()  # the first byte of the next request on a kept-alive connection
        super().data_received(data)
        if self._header_timer is not None and self.conn.their_state is not h11.IDLE:
            self._disarm()  # the headers are in (or h11 gave up on them)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._disarm()
        self._header_timer = self.loop.call_later(self.header_timeout_s, self._headers_late)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_late(self) -> None:
        self._header_timer = None
        if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
            return
        log.info("rejected", status=408, reason="header_timeout")
        if self.conn.our_state is h11.IDLE:  # no request yet, so no app: written here
            late = RequestTimeout(
                f"the request headers did not arrive within {self.header_timeout_s:g} seconds",
                headers={"connection": "close"},
            )
            response = render(late)
            head = b"".join(name + b": " + value + b"\r\n" for name, value in response.raw_headers)
            status_line = b"HTTP/1.1 408 Request Timeout\r\n"
            self.transport.write(status_line + head + b"\r\n" + response.body)
        self.transport.close()


def guarded_protocol(header_timeout_s: float) -> type[HeaderTimeoutProtocol]:
    """The protocol class for ``uvicorn.Config(http=...)`` with this header deadline."""
    return type(
        "HeaderTimeoutProtocol",
        (HeaderTimeoutProtocol,),
        {"header_timeout_s": header_timeout_s},
    )
