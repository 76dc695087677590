"""An upstream SSE stream that has started: whole events relayed as they arrive, usage noted.

:meth:`proxy.upstream.client.Upstream.chat_stream` returns an :class:`UpstreamStream` once
upstream has answered 200. Upstream is always asked for usage; when the client did not ask for
it, the usage chunk (and the ``"usage":null`` OpenAI adds to every chunk then) is taken out
again.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from types import TracebackType
from typing import Any

from proxy.upstream.errors import translate

__all__ = ["UpstreamStream"]

_USAGE_OBJECT = (b'"usage":{', b'"usage": {')
_USAGE_NULL = b'"usage":null'


class UpstreamStream:
    """An open upstream SSE stream: iterate it for ``bytes`` made of whole SSE events.

    It exists only once upstream has answered 200. Iterating relays events as they arrive; an
    event split over network reads is held back until it is complete, so an error event written
    after a failure never lands inside a half-sent one. If the connection breaks, iteration
    raises :class:`~proxy.errors.UpstreamError` (or :class:`~proxy.errors.UpstreamTimeout`);
    nothing is retried. After the last event, ``usage`` holds the usage upstream reported (or
    None). Always ``aclose()`` it (or use ``async with``); running to the end closes it too.
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
                raise translate(exc, self.attempts, streaming=True) from exc
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


def _data_field(event: bytes) -> bytes:
    for line in event.split(b"\n"):
        if line.startswith(b"data:"):
            return line[5:].strip()
    return b""
