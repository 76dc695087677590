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
:data:`proxy.protocol.params.CHAT_PARAMETERS` (``COMPLETIONS_PARAMETERS``,
``EMBEDDINGS_PARAMETERS`` for :meth:`Upstream.post_json`) that the request sets, on both routes.
Validation has already refused anything else with a 400; this is the second wall (litellm's own
keywords are kept out in :mod:`proxy.upstream.litellm_route`). The JSON body of each call is built
in one place, :meth:`Upstream.sent`, which a key's budget reserves the worst case of before the call
(:mod:`proxy.serving.quotas`): what is reserved for and what is posted are the same body.

Every call runs under the retry policy of :mod:`proxy.upstream.retry`, which lives there and
nowhere else, and only where the API cannot have done (and billed) the work already:

- a connection that could not be made (refused, DNS, TLS, the connect or pool timeout), and
- an answer of 408, 429, 502, 503 or 504.

**Not retried**: a 500 or any other 5xx, a read timeout, a reset or disconnect once the request
was sent, a body cut short, any other 4xx; and a stream is never retried once
:meth:`Upstream.chat_stream` has returned it. The rule is in :mod:`proxy.upstream.failures`.
``timeout_s`` bounds each wait for upstream's next bytes (as httpx's read timeout did),
``connect_timeout_s`` each new connection, and ``max_answer_bytes`` the bytes read of one
answer (or of one event of a stream; an embeddings answer may also take
:data:`EMBEDDING_BYTES` per input): past it, a 502 that says the answer was too large.

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

from proxy.config import BatchSettings, FallbackSettings, Settings
from proxy.config.secrets import Secrets
from proxy.errors import UpstreamError
from proxy.protocol.forwarding import forwarded
from proxy.protocol.params import CHAT_PARAMETERS, COMPLETIONS_PARAMETERS, EMBEDDINGS_PARAMETERS
from proxy.upstream.batch_api import BatchAPI, DirectWire
from proxy.upstream.direct_route import DirectRoute
from proxy.upstream.litellm_route import LitellmRoute
from proxy.upstream.retry import BACKOFF_INITIAL_S, RetryPolicy
from proxy.upstream.route import DIRECT, Answer, Kinds, Opened, Route
from proxy.upstream.stream import Closing, UpstreamStream

__all__ = [
    "CHAT_PATH",
    "COMPLETIONS_PATH",
    "EMBEDDINGS_PATH",
    "KINDS",
    "RESPONSES_PATH",
    "Upstream",
    "UpstreamResponse",
    "UpstreamStream",
]

KINDS = Kinds(
    routes=MappingProxyType({"litellm": LitellmRoute}),
    prefixes=MappingProxyType({"openai": DIRECT}),
)
"""The routes the proxy ships besides ``direct``, and the prefixes that name them."""

# The paths of the upstream calls, under api_base.
CHAT_PATH = "/chat/completions"
COMPLETIONS_PATH = "/completions"
EMBEDDINGS_PATH = "/embeddings"
RESPONSES_PATH = "/responses"
COMPACT_PATH = "/responses/compact"
# The JSON endpoints of post_json and the parameters each may carry.
_POST_PARAMETERS: dict[str, frozenset[str]] = {
    COMPLETIONS_PATH: frozenset(COMPLETIONS_PARAMETERS),
    EMBEDDINGS_PATH: frozenset(EMBEDDINGS_PARAMETERS),
}
_CHAT = frozenset(CHAT_PARAMETERS)
EMBEDDING_BYTES = 128 * 1024
"""The bytes one embedding may take in an answer: 3,072 floats as JSON text come to about
70 KB. An embeddings answer may be ``max_answer_bytes`` or this much per input, whichever is
more (2,048 inputs of OpenAI's largest model, as JSON floats, are about 140 MB)."""


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

    def batch_api(self, settings: BatchSettings, requested_model: str = "") -> BatchAPI | None:
        """The Files and Batch APIs that lines for ``requested_model`` go to
        (:mod:`proxy.upstream.batch_api`), under this client's retries and secrets: those of
        ``api_base`` for a model on the direct route; for a model that litellm sends, its
        provider's where they are OpenAI's (:mod:`proxy.upstream.litellm_batches`), else None
        (its lines go one call each: see :mod:`proxy.upstream.deferred`)."""
        way, name = self._model({"model": requested_model})
        limit = self._settings.max_answer_bytes
        if way == DIRECT:
            wire = DirectWire(self._direct)
            return BatchAPI(wire, self._retry, self._secrets, settings, max_line_bytes=limit)
        route = self._ways[way]
        found = route.batch_wire(name) if isinstance(route, LitellmRoute) else None
        if found is None:
            return None
        provider, model = found
        return BatchAPI(
            provider, self._retry, self._secrets, settings, max_line_bytes=limit, model=model
        )

    async def listed_models(self) -> list[str]:
        """The upstream's own model ids, for ``GET /v1/models``: cached and bounded
        (:mod:`proxy.upstream.model_list`); none without a fallback or when it cannot be read."""
        if not self.enabled or not self._settings.api_base:
            return []
        return await self._direct.models.ids()

    # -- calls ---------------------------------------------------------------------------------

    def _model(self, body: dict[str, Any]) -> tuple[str, str]:
        """(the route's name, the model name it is sent) of a request for ``body``."""
        requested = body.get("model", "")
        return self._routes.get(requested, (DIRECT, requested))

    def _way(self, body: dict[str, Any]) -> Route:
        way = self._ways[self._model(body)[0]]
        way.ready()
        return way

    def sent(self, path: str, body: dict[str, Any], *, stream: bool = False) -> dict[str, Any]:
        """The JSON body that a call for ``body`` posts to ``api_base + path``, exactly:
        ``/chat/completions`` (its allow-list, the mapped model, ``stream`` and the usage chunk
        asked for), ``/completions`` and ``/embeddings`` (theirs, a mapped model on the direct
        route), ``/responses`` (the body :mod:`proxy.upstream.responses_api` built, with its
        ``stream`` flag) and ``/responses/compact`` (the body it built, as it is). Each call
        below posts what this returns, and a key's budget reserves
        its worst case from the same (:mod:`proxy.serving.quotas`), so the two cannot differ."""
        if path == CHAT_PATH:
            forward = forwarded(body, _CHAT)
            forward["model"] = self._model(body)[1]
            if stream:
                options = body.get("stream_options")
                extra = options if isinstance(options, dict) else {}
                forward.update(stream=True, stream_options={**extra, "include_usage": True})
            elif forward.get("stream"):
                forward["stream"] = False
                forward.pop("stream_options", None)
            return forward
        if path == RESPONSES_PATH:
            return {**body, "stream": stream}
        if path == COMPACT_PATH:  # built by responses_api.compact_body; never streamed
            return dict(body)
        allowed = _POST_PARAMETERS.get(path)
        if allowed is None:
            raise ValueError(f"no upstream call posts to {path!r}")
        forward = forwarded(body, allowed)
        model = forward.get("model")
        if isinstance(model, str):
            route = self._routes.get(model)
            if route is not None and route[0] == DIRECT:
                forward["model"] = route[1]
        return forward

    async def chat(self, body: dict[str, Any], *, request_id: str) -> UpstreamResponse:
        """A non-streamed chat completion (a ``stream`` flag in ``body`` is turned off)."""
        way = self._way(body)
        forward = self.sent(CHAT_PATH, body)
        return await self._answered(way.complete, forward, request_id)

    async def chat_stream(self, body: dict[str, Any], *, request_id: str) -> UpstreamStream:
        """Open a streamed chat completion; returns once upstream has answered 200."""
        way = self._way(body)
        options = body.get("stream_options")
        strip_usage = not (isinstance(options, dict) and options.get("include_usage"))
        forward = self.sent(CHAT_PATH, body, stream=True)
        return await self._opened(strip_usage, way.open_stream, forward, request_id)

    async def post_json(
        self, path: str, body: dict[str, Any], *, request_id: str
    ) -> UpstreamResponse:
        """POST ``body`` to ``api_base + path`` (``/embeddings``, ``/completions``), JSON back.

        A mapped model name is replaced when its target is on ``api_base``; not streamed. Only
        the parameters of that endpoint are sent (:meth:`sent`).
        """
        if path not in _POST_PARAMETERS:
            raise ValueError(f"post_json does not know the endpoint {path!r}")
        sent = self.sent(path, body)
        limit = None
        if path == EMBEDDINGS_PATH:  # a batch's vectors: up to EMBEDDING_BYTES each
            inputs = sent.get("input")
            count = len(inputs) if isinstance(inputs, list) else 1
            limit = max(self._settings.max_answer_bytes, count * EMBEDDING_BYTES)
        return await self.post_direct(path, sent, request_id=request_id, limit=limit)

    async def post_direct(
        self, path: str, body: dict[str, Any], *, request_id: str, limit: int | None = None
    ) -> UpstreamResponse:
        """POST a ``body`` the caller built from its own allow-list to ``api_base + path``
        (:mod:`proxy.upstream.responses_api`), JSON back, under the retry policy; an answer
        of at most ``limit`` bytes (by default ``[fallback] max_answer_bytes``)."""
        self._direct.ready()
        return await self._answered(self._direct.post, path, body, request_id, limit)

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
            max_event_bytes=self._settings.max_answer_bytes,
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
