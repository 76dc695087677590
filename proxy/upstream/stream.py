"""An upstream SSE stream that has started: whole events relayed as they arrive, usage noted.

:meth:`proxy.upstream.client.Upstream.chat_stream` returns an :class:`UpstreamStream` once
upstream has answered 200. Upstream is always asked for usage; when the client did not ask for
it, the usage chunk (and the ``"usage":null`` OpenAI adds to every chunk then) is taken out
again.

A stream whose client left is not simply dropped: the API bills every token it generated.
:meth:`UpstreamStream.drain` reads on (sending nothing) for a bounded time, so that the usage
chunk can still come, and :meth:`UpstreamStream.generated` gives the text that did come (the
events are kept, up to :data:`KEPT_BYTES`), for a count of its tokens when no usage came.

One event is held until it is whole, and no longer than ``max_event_bytes`` (``[fallback]
max_answer_bytes``): an event (a line without its end) that grows past it ends the stream with
:class:`~proxy.errors.UpstreamError`. Its pieces are kept as they came and joined once, when
its end arrives, so an event that grows read by read is not copied again at each read.

Every event is cleared of the proxy's secrets before it is relayed or kept
(:meth:`~proxy.config.secrets.Secrets.scrub`): an API or a gateway that echoes the request's
``Authorization`` in an error event mid-stream hands the tenant nothing. An event that carries
an error object is also cleared of anything shaped like a key
(:meth:`~proxy.config.secrets.Secrets.scrub_error`).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from types import TracebackType
from typing import Any, Self

import anyio

from proxy.config.secrets import NO_SECRETS, Secrets
from proxy.upstream.failures import translate
from proxy.upstream.route import too_large

__all__ = ["KEPT_BYTES", "MAX_EVENT_BYTES", "Generated", "UpstreamStream"]

KEPT_BYTES = 4 * 1024 * 1024
"""Bytes of a stream's events kept for counting what was generated; past it, only the bytes are
counted, and the text kept stands for the rest in proportion."""
MAX_EVENT_BYTES = 32 * 1024 * 1024
"""The default bound of one event (``[fallback] max_answer_bytes``)."""
_USAGE_OBJECT = (b'"usage":{', b'"usage": {')
_USAGE_NULL = b'"usage":null'
_ERROR_OBJECT = (b'"error":{', b'"error": {')
# The typed events of a Responses stream (the API's own /v1/responses) that carry generated text.
_RESPONSES_DELTAS = frozenset(
    {
        "response.output_text.delta",
        "response.refusal.delta",
        "response.function_call_arguments.delta",
    }
)


class Closing:
    """Something ``aclose()`` ends, which ``async with`` ends as well: the upstream client
    (:class:`proxy.upstream.client.Upstream`, whose ``async with`` also starts it) and the
    stream below."""

    async def aclose(self) -> None:
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


class UpstreamStream(Closing):
    """An open upstream SSE stream: iterate it for ``bytes`` made of whole SSE events.

    It exists only once upstream has answered 200. Iterating relays events as they arrive; an
    event split over network reads is held back until it is complete, so an error event written
    after a failure never lands inside a half-sent one. If the connection breaks, iteration
    raises :class:`~proxy.errors.UpstreamError` (or :class:`~proxy.errors.UpstreamTimeout`);
    nothing is retried. After the last event, ``usage`` holds the usage upstream reported (or
    None). Always ``aclose()`` it (or use ``async with``); running to the end closes it too.
    """

    __slots__ = (
        "usage",
        "latency_s",
        "attempts",
        "received_bytes",
        "_source",
        "_close",
        "_strip",
        "_tail",
        "_tail_bytes",
        "_max_event",
        "_done",
        "_ended",
        "_kept",
        "_kept_bytes",
        "_secrets",
    )

    def __init__(
        self,
        source: AsyncIterator[bytes],
        close: Callable[[], Awaitable[None]],
        *,
        strip_usage: bool,
        latency_s: float,
        attempts: int,
        max_event_bytes: int = MAX_EVENT_BYTES,
        secrets: Secrets = NO_SECRETS,
    ) -> None:
        self.usage: dict[str, Any] | None = None
        self.service_tier: str | None = None  # the usage event's: the tier the call was billed at
        self.latency_s = latency_s
        """Seconds from the call to upstream's response headers, retries included."""
        self.attempts = attempts
        self.received_bytes = 0
        """Bytes of whole events read from upstream (relayed or drained)."""
        self._source = source
        self._close = close
        self._strip = strip_usage
        self._tail: list[bytes] = []  # an unfinished event's pieces, joined once it ends
        self._tail_bytes = 0
        self._max_event = max_event_bytes
        self._done = False
        self._ended = False  # read to its end (not closed early, not broken off)
        self._kept: list[bytes] = []
        self._kept_bytes = 0
        self._secrets = secrets

    @property
    def ended(self) -> bool:
        """Whether upstream's stream was read to its end."""
        return self._ended

    def __aiter__(self) -> UpstreamStream:
        return self

    async def __anext__(self) -> bytes:
        while not self._done:
            try:
                chunk = await self._source.__anext__()
            except StopAsyncIteration:
                self._ended = True
                tail = b"".join(self._tail)
                self._tail, self._tail_bytes = [], 0
                await self.aclose()
                out = self._scan(tail) if tail.strip() else b""
                if out:
                    return out
                break
            except Exception as exc:
                await self.aclose()
                raise translate(exc, self.attempts, streaming=True) from exc
            try:
                out = self._feed(chunk)
            except _EventTooLarge:
                await self.aclose()
                raise too_large("stream event", self._max_event) from None
            if out:
                return out
        raise StopAsyncIteration

    def _feed(self, chunk: bytes) -> bytes:
        """Whole events out of what has arrived; the unfinished rest waits for the next read."""
        if self._tail and not _may_end_event(b"".join(self._tail[-3:])[-3:], chunk):
            self._hold(chunk)
            return b""
        data = b"".join((*self._tail, chunk)) if self._tail else chunk
        self._tail, self._tail_bytes = [], 0
        if b"\r" in data:
            data = data.replace(b"\r\n", b"\n")
        cut = data.rfind(b"\n\n")
        if cut < 0:
            self._hold(data)
            return b""
        cut += 2
        if cut < len(data):
            data, rest = data[:cut], data[cut:]
            self._hold(rest)
        return self._scan(data)

    def _hold(self, piece: bytes) -> None:
        """Keep ``piece`` of an unfinished event; past ``max_event_bytes``, _EventTooLarge."""
        self._tail.append(piece)
        self._tail_bytes += len(piece)
        if self._tail_bytes > self._max_event:
            self._tail, self._tail_bytes = [], 0
            raise _EventTooLarge

    def _scan(self, data: bytes) -> bytes:
        self.received_bytes += len(data)
        data = self._secrets.scrub(data)
        if _ERROR_OBJECT[0] in data or _ERROR_OBJECT[1] in data:
            data = self._secrets.scrub_error(data)
        if self._kept_bytes < KEPT_BYTES:  # references to bytes made anyway: no copy
            self._kept.append(data)
            self._kept_bytes += len(data)
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
                    tier = parsed.get("service_tier")
                    self.service_tier = tier if isinstance(tier, str) else self.service_tier
                    if self._strip and parsed.get("choices") == []:
                        continue
                elif isinstance(parsed, dict) and isinstance(parsed.get("response"), dict):
                    usage = parsed["response"].get("usage")  # a Responses stream's last event
                    if isinstance(usage, dict):
                        self.usage = usage
                        tier = parsed["response"].get("service_tier")
                        self.service_tier = tier if isinstance(tier, str) else self.service_tier
            kept.append(event)
        return b"\n\n".join(kept) if len(kept) != len(events) else data

    async def drain(self, seconds: float) -> None:
        """Read on, sending nothing, until the stream ends, fails, or ``seconds`` pass: the
        client left, and the usage chunk at the end may still come. Never raises a failure."""
        if self._done or seconds <= 0:
            return
        try:
            # anyio's, not asyncio's: this runs in the shielded clean-up of a response whose
            # client left, where an asyncio timeout's cancellation is held back by the shield.
            with anyio.move_on_after(seconds):
                async for _ in self:
                    if self.usage is not None:
                        break
        except Exception:  # noqa: BLE001 - a timeout or a failure: what came is counted
            return

    def generated(self) -> Generated:
        """What the events read so far carried: each choice's text and tool calls."""
        found = Generated(received_bytes=self.received_bytes, kept_bytes=self._kept_bytes)
        for data in self._kept:
            for event in data.split(b"\n\n"):
                payload = _data_field(event)
                if not payload.startswith(b"{"):
                    continue
                try:
                    parsed = json.loads(payload)
                except ValueError:
                    continue
                if isinstance(parsed, dict):
                    found.add(parsed)
        return found

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


class Generated:
    """The text and tool calls of a stream's chunks, per choice, as a ``chat.completion``'s
    choices (:meth:`completion`), for a tokenizer to count."""

    def __init__(self, *, received_bytes: int, kept_bytes: int) -> None:
        self.received_bytes = received_bytes
        self.kept_bytes = kept_bytes
        self._texts: dict[int, list[str]] = {}
        self._calls: dict[int, dict[int, list[str]]] = {}

    def add(self, chunk: dict[str, Any]) -> None:
        kind, delta_text = chunk.get("type"), chunk.get("delta")
        if kind in _RESPONSES_DELTAS and isinstance(delta_text, str):  # a Responses stream's
            self._texts.setdefault(0, []).append(delta_text)
            return
        choices = chunk.get("choices")
        for choice in choices if isinstance(choices, list) else []:
            if not isinstance(choice, dict):
                continue
            raw_index = choice.get("index")
            index = raw_index if isinstance(raw_index, int) else 0
            delta = choice.get("delta")
            if not isinstance(delta, dict):
                continue
            for field in ("content", "refusal"):
                if isinstance(delta.get(field), str) and delta[field]:
                    self._texts.setdefault(index, []).append(delta[field])
            calls = delta.get("tool_calls")
            pieces = [c for c in calls if isinstance(c, dict)] if isinstance(calls, list) else []
            if isinstance(delta.get("function_call"), dict):
                pieces.append({"index": -1, "function": delta["function_call"]})
            for call in pieces:
                function = call.get("function")
                if not isinstance(function, dict):
                    continue
                raw_slot = call.get("index")
                slot = raw_slot if isinstance(raw_slot, int) else 0
                parts = self._calls.setdefault(index, {}).setdefault(slot, [])
                for field in ("name", "arguments"):
                    if isinstance(function.get(field), str):
                        parts.append(function[field])

    @property
    def scale(self) -> float:
        """Received bytes over kept bytes: how much more came than the text here (>= 1)."""
        return self.received_bytes / self.kept_bytes if self.kept_bytes else 1.0

    def completion(self) -> dict[str, Any]:
        """The generated text as the choices of a ``chat.completion`` (what the tokenizer of
        :mod:`proxy.ledger.writing.tokens` counts)."""
        choices = []
        for index in sorted(set(self._texts) | set(self._calls)):
            calls = [
                {"function": {"name": "", "arguments": "".join(parts)}}
                for _, parts in sorted(self._calls.get(index, {}).items())
            ]
            message: dict[str, Any] = {"content": "".join(self._texts.get(index, []))}
            if calls:
                message["tool_calls"] = calls
            choices.append({"index": index, "message": message})
        return {"choices": choices}

    def text_bytes(self) -> int:
        """UTF-8 bytes of everything generated (the crude count when no tokenizer is ready)."""
        total = sum(len(t.encode()) for texts in self._texts.values() for t in texts)
        for calls in self._calls.values():
            total += sum(len(p.encode()) for parts in calls.values() for p in parts)
        return total


class _EventTooLarge(Exception):
    """One event grew past ``max_event_bytes`` before its end came."""


def _may_end_event(last: bytes, chunk: bytes) -> bool:
    """Whether ``chunk``, read after ``last`` (the held bytes' last three), may end an event
    (a blank line, CRLF or LF, in it or where the two meet)."""
    if b"\n\n" in chunk or b"\r\n\r\n" in chunk:
        return True
    if b"\r" in chunk and b"\n\n" in chunk.replace(b"\r\n", b"\n"):
        return True
    seam = last + chunk[:3]
    return b"\n\n" in seam.replace(b"\r\n", b"\n")


def _data_field(event: bytes) -> bytes:
    for line in event.split(b"\n"):
        if line.startswith(b"data:"):
            return line[5:].strip()
    return b""
