"""What a way to the paid API is (:class:`Route`), and which way each ``[fallback] models``
target takes (:class:`Kinds`; the proxy's own are ``proxy.upstream.client.KINDS``).

A target is a bare model name or ``<provider>/<model>``:

- a bare name, and every model name the mapping does not know, takes the ``direct`` route
  (:mod:`proxy.upstream.direct_route`, an OpenAI-compatible API at ``api_base``);
- a provider prefix listed in :attr:`Kinds.prefixes` takes that kind's route, the prefix
  dropped (``openai/gpt-4o-mini`` goes ``direct`` as ``gpt-4o-mini``);
- any other prefix takes the ``litellm`` route (:mod:`proxy.upstream.litellm_route`), the
  target sent whole: litellm reads the provider from it.

A route only sends. :class:`~proxy.upstream.client.Upstream` does the rest, the same for every
route: the allow-list of forwarded parameters, the model name, the retries
(:mod:`proxy.upstream.retry`, around one attempt of the route), the attempts counted, the
latency, and the stream relayed (:mod:`proxy.upstream.stream`). A route raises what the API
answered as it comes; foreign errors are turned into :mod:`proxy.errors` by
:func:`proxy.upstream.failures.translate`, and a status it reads itself by
:func:`~proxy.upstream.failures.status_error`.

A new kind of provider is one module with a class that has these methods, a constructor taking
:class:`~proxy.config.FallbackSettings`, and its line in ``proxy.upstream.client.KINDS`` (the
recipe is in ``docs/architecture.md``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from proxy.config import FallbackSettings
from proxy.errors import UpstreamError

Answer = tuple[int, dict[str, Any], bytes]
"""A non-streamed answer: its HTTP status, its JSON object (a ``chat.completion``), and the
bytes of that JSON, relayed as they are."""


@dataclass(frozen=True, slots=True)
class Opened:
    """A stream the API has answered (200): OpenAI's SSE bytes, ``data: [DONE]`` at the end,
    and how to let go of it (read to its end or not)."""

    chunks: AsyncIterator[bytes]
    close: Callable[[], Awaitable[None]]


class Route(Protocol):
    """One way to the paid API. ``forward`` is the allow-listed body, its ``model`` the name to
    send; ``request_id`` goes with the call (``x-request-id``)."""

    async def start(self) -> None:
        """Get ready (open a pool, import a library): once, at start-up, when used."""

    async def aclose(self) -> None:
        """Let go of what ``start`` opened."""

    def ready(self) -> None:
        """Raise, before any attempt, the :class:`~proxy.errors.ProxyError` that no attempt
        could get past (nothing configured to call): such a call counts no attempt."""

    async def complete(self, forward: dict[str, Any], request_id: str) -> Answer:
        """One attempt at a non-streamed chat completion."""
        ...

    async def open_stream(self, forward: dict[str, Any], request_id: str) -> Opened:
        """One attempt at opening a streamed chat completion (``forward`` has ``stream`` and
        ``stream_options.include_usage`` set); returns once the API has answered 200."""
        ...


DIRECT = "direct"


def too_large(what: str, limit: int) -> UpstreamError:
    """The 502 of an upstream ``what`` ("answer", "stream event") read past ``limit`` bytes
    (``[fallback] max_answer_bytes``), whatever the route."""
    return UpstreamError(
        f"the upstream API's {what} was too large: more than {limit} bytes "
        "([fallback] max_answer_bytes)"
    )


@dataclass(frozen=True, kw_only=True)
class Kinds:
    """The kinds of route, and which provider prefixes take which."""

    routes: Mapping[str, Callable[[FallbackSettings], Route]]
    """Each route by name, as a constructor; ``direct`` is always there (and made by the
    client itself, which also sends ``/completions`` and ``/embeddings`` through it)."""
    prefixes: Mapping[str, str] = field(default_factory=dict)
    """A provider prefix and the route it takes; the prefix is dropped from the model sent."""
    other: str = "litellm"
    """The route of a provider prefix not in ``prefixes``, the target sent whole."""

    def resolve(self, target: str) -> tuple[str, str]:
        """(route name, model name to send) for a ``[fallback] models`` target."""
        provider, slash, name = target.partition("/")
        if not slash:
            return DIRECT, target
        route = self.prefixes.get(provider)
        if route is not None:
            return route, name
        return self.other, target
