"""The fallback client: send a request to the upstream API and hand its answer back.

Which way a request goes depends on the model it names (``[fallback] models`` maps a requested
name to a target; an unmapped name is sent unchanged). Each way is a
:class:`~proxy.upstream.route.Route`, and :data:`KINDS` says which target takes which:

- **direct**, the hot path (:mod:`proxy.upstream.direct_route`): a target without a provider
  prefix, or ``openai/<name>`` (the prefix is dropped), goes to ``[fallback] api_base`` over
  one pooled aiohttp session. The answer's bytes are kept (:attr:`UpstreamResponse.raw`) so
  that they can be relayed without serialising them again.
- **litellm** (:mod:`proxy.upstream.litellm_route`): a mapped target with any other provider
  prefix (``anthropic/claude-3-5-haiku``).

Everything else is done here, once for every route: the allow-list, the retries, the attempts
counted, the latency, the stream's usage.

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

No secret the proxy knows leaves through this client (:class:`~proxy.config.secrets.Secrets`,
given by the app; by default the fallback's key and the secret-named variables of the
environment): an answer's bytes, a refusal's body and a stream's events are scrubbed of them
before they are relayed, stored or logged, whatever the API echoed.

Streams: :meth:`Upstream.chat_stream` returns an :class:`~proxy.upstream.stream.UpstreamStream`
once upstream has answered 200, so every error before the first byte is raised (and retried)
there.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from proxy.config import FallbackSettings, Settings
from proxy.config.secrets import Secrets
from proxy.errors import UpstreamError
from proxy.params import (
    CHAT_PARAMETERS,
    COMPLETIONS_PARAMETERS,
    EMBEDDINGS_PARAMETERS,
    forwarded,
)
from proxy.upstream.direct_route import DirectRoute
from proxy.upstream.litellm_route import LitellmRoute
from proxy.upstream.retry import BACKOFF_INITIAL_S, RetryPolicy
from proxy.upstream.route import DIRECT, Answer, Kinds, Opened, Route
from proxy.upstream.stream import Closing, UpstreamStream

__all__ = ["KINDS", "Upstream", "UpstreamResponse", "UpstreamStream"]

KINDS = Kinds(
    routes=MappingProxyType({"litellm": LitellmRoute}),
    prefixes=MappingProxyType({"openai": DIRECT}),
)
"""The routes the proxy ships besides ``direct``, and the prefixes that name them."""

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


class Upstream(Closing):
    """The client of the fallback API. ``await start()`` before use, ``await aclose()`` after.

    ``backoff_s`` is the first retry's backoff (tests make it small); ``kinds`` the routes and
    which targets take them (:data:`KINDS`); ``secrets`` what no body relayed may hold (by
    default those :meth:`Secrets.known` finds for these settings alone).
    """

    def __init__(
        self,
        settings: FallbackSettings,
        *,
        backoff_s: float = BACKOFF_INITIAL_S,
        kinds: Kinds = KINDS,
        secrets: Secrets | None = None,
    ) -> None:
        self._settings = settings
        self._secrets = Secrets.known(Settings(fallback=settings)) if secrets is None else secrets
        self._direct = DirectRoute(settings)
        self._ways: dict[str, Route] = {DIRECT: self._direct}
        self._ways.update((name, make(settings)) for name, make in kinds.routes.items())
        self._routes = {name: kinds.resolve(target) for name, target in settings.models.items()}
        for way, _ in self._routes.values():
            if way not in self._ways:
                raise ValueError(f"no route named {way!r} (see proxy.upstream.client.KINDS)")
        self._retry = RetryPolicy(
            max_retries=settings.max_retries,
            timeout_s=settings.timeout_s,
            backoff_s=backoff_s,
            secrets=self._secrets,
        ).run

    # -- life cycle ----------------------------------------------------------------------------

    async def start(self) -> None:
        """Open the direct route's connection pool, and start the other routes the model
        mapping uses (litellm is imported only then)."""
        used = {DIRECT} | {way for way, _ in self._routes.values()}
        for name in sorted(used):
            await self._ways[name].start()

    async def aclose(self) -> None:
        for way in self._ways.values():
            await way.aclose()

    async def __aenter__(self) -> Upstream:
        await self.start()
        return self

    # -- what can be asked for -----------------------------------------------------------------

    @property
    def enabled(self) -> bool:
        return self._settings.enabled

    def target(self, requested_model: str) -> str:
        """The model name sent upstream: the mapped target (without a dropped prefix such as
        ``openai/``), or unchanged."""
        route = self._routes.get(requested_model)
        return route[1] if route is not None else requested_model

    def via_litellm(self, requested_model: str) -> bool:
        """Whether a request for ``requested_model`` goes another way than the direct route
        to ``api_base`` (litellm)."""
        route = self._routes.get(requested_model)
        return route is not None and route[0] != DIRECT

    def model_ids(self) -> list[str]:
        """The names the mapping knows, for ``GET /v1/models``."""
        return list(self._settings.models)

    # -- calls ---------------------------------------------------------------------------------

    def _way(self, body: dict[str, Any]) -> tuple[Route, str]:
        requested = body.get("model", "")
        name, model = self._routes.get(requested, (DIRECT, requested))
        way = self._ways[name]
        way.ready()
        return way, model

    async def chat(self, body: dict[str, Any], *, request_id: str) -> UpstreamResponse:
        """A non-streamed chat completion (a ``stream`` flag in ``body`` is turned off)."""
        way, model = self._way(body)
        forward = forwarded(body, _CHAT)
        forward["model"] = model
        if forward.get("stream"):
            forward["stream"] = False
            forward.pop("stream_options", None)
        return await self._answered(way.complete, forward, request_id)

    async def chat_stream(self, body: dict[str, Any], *, request_id: str) -> UpstreamStream:
        """Open a streamed chat completion; returns once upstream has answered 200."""
        way, model = self._way(body)
        options = body.get("stream_options")
        strip_usage = not (isinstance(options, dict) and options.get("include_usage"))
        forward = forwarded(body, _CHAT)
        forward.update(model=model, stream=True)
        if strip_usage:
            extra = options if isinstance(options, dict) else {}
            forward["stream_options"] = {**extra, "include_usage": True}
        return await self._opened(strip_usage, way.open_stream, forward, request_id)

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
            if route is not None and route[0] == DIRECT:
                body = {**body, "model": route[1]}
        return await self.post_direct(path, body, request_id=request_id)

    async def post_direct(
        self, path: str, body: dict[str, Any], *, request_id: str
    ) -> UpstreamResponse:
        """POST a ``body`` the caller built from its own allow-list to ``api_base + path``
        (:mod:`proxy.upstream.responses_api`), JSON back, under the retry policy."""
        self._direct.ready()
        return await self._answered(self._direct.post, path, body, request_id)

    async def open_direct(
        self, path: str, body: dict[str, Any], *, request_id: str
    ) -> UpstreamStream:
        """Open a streamed POST of such a ``body``; returns once upstream has answered 200."""
        self._direct.ready()
        return await self._opened(False, self._direct.open_stream, body, request_id, path)

    async def _answered(
        self, attempt: Callable[..., Awaitable[Answer]], *args: Any
    ) -> UpstreamResponse:
        """``attempt(*args)`` under the retry policy, its answer with its time and attempts."""
        started = time.perf_counter()
        (status, data, raw), tries = await self._retry(attempt, *args)
        clean = self._secrets.scrub(raw)
        if clean is not raw:  # the API echoed a secret in its answer: relay it without
            try:
                raw, data = clean, _parsed(clean)
            except UpstreamError as exc:
                exc.attempts = tries
                raise
        return UpstreamResponse(
            body=data,
            status=status,
            latency_s=time.perf_counter() - started,
            attempts=tries,
            raw=raw,
        )

    async def _opened(
        self, strip_usage: bool, attempt: Callable[..., Awaitable[Opened]], *args: Any
    ) -> UpstreamStream:
        """The stream ``attempt(*args)`` opens under the retry policy, with its time and
        attempts (``strip_usage``: the usage chunk asked for the ledger is not relayed)."""
        started = time.perf_counter()
        opened, tries = await self._retry(attempt, *args)
        return UpstreamStream(
            opened.chunks,
            opened.close,
            strip_usage=strip_usage,
            latency_s=time.perf_counter() - started,
            attempts=tries,
            secrets=self._secrets,
        )


def _parsed(raw: bytes) -> dict[str, Any]:
    """An answer's JSON object again, once scrubbed."""
    try:
        data = json.loads(raw)
    except ValueError:
        data = None
    if not isinstance(data, dict):
        raise UpstreamError("the upstream API's answer held a secret and could not be cleared")
    return data
