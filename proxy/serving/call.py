"""What a service is handed, and what it hands back: no HTTP in either.

    Call     one request as the services read it: its id, its key (the name the ledger row
             takes, and the record whose share of the local queue it uses), the ``x-frugal``
             headers and ``cache-control`` the cascade reads, and its body to read (``read``:
             parsed and checked by the check the service names)
    Answer   a JSON answer: the object (or the upstream's bytes as they came), its headers,
             its status
    Events   a stream of Server-Sent Events: the bytes as they come, the headers, and how it
             ends (``on_end``, called once, writes the row; ``cleanups``, each awaited once,
             close what the stream held)
    BodyCut  raised by ``read`` when the client closes its socket in the middle of its body

The server makes a :class:`Call` from its request in one place (:mod:`proxy.server.calls`), and
turns an :class:`Answer` or :class:`Events` into its response there too.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from proxy.ledger.tenants.keys import ClientKey
from proxy.serving.clients import Caller

Check = Callable[[dict[str, Any]], dict[str, Any]]
Read = Callable[[Check], Awaitable[dict[str, Any]]]
Cleanup = Callable[[], Awaitable[None]]


class BodyCut(Exception):
    """The client closed its socket in the middle of its body: it left, nothing failed."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Call:
    """One request, as a service reads it (see the module's docstring)."""

    request_id: str
    key_name: str | None  # the key's name, for the row, the metrics and the log line
    client: ClientKey | None  # its record: its identity is its share of the queue and cache
    route: str | None  # x-frugal-route, as sent
    min_quality: str | None  # x-frugal-min-quality, as sent
    cache_control: str  # cache-control, "" when absent
    read: Read  # the body, parsed and checked by the check given
    caller: Caller  # what the stored responses read a caller's rights from

    @property
    def identity(self) -> str | None:
        """The key's identity (its share of the local queue, its cache entries), or None."""
        return None if self.client is None else self.client.identity


@dataclass(frozen=True, slots=True)
class Answer:
    """A JSON answer: ``body``, or ``raw`` (the upstream's bytes, parsed once, not encoded
    again); neither for a status alone (a client that left in the middle of its body)."""

    body: dict[str, Any] | None = None
    headers: dict[str, str] = field(default_factory=dict)
    raw: bytes | None = None
    status: int = 200


@dataclass(frozen=True, slots=True)
class Events:
    """A ``text/event-stream`` answer; whoever sends it calls ``on_end(finished)`` once,
    however it ends (``finished``: it ran to its end, or sent ``[DONE]``), after awaiting each
    of ``cleanups`` (idempotent: the chunks' own ``finally`` may have done the same)."""

    chunks: AsyncGenerator[bytes, None]
    headers: dict[str, str]
    on_end: Callable[[bool], None]
    cleanups: tuple[Cleanup, ...] = ()


Outcome = Answer | Events
