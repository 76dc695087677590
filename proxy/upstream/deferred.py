"""Work that can wait, sent to the paid API: one call for the three ways of ``[batch] fallback``.

The batch runner hands :meth:`Deferred.send` the lines it must send upstream (those the local
model did not answer well enough, or cannot serve), each a :class:`DeferredLine`: its
``custom_id``, its ``url`` (``/v1/chat/completions``, ``/v1/completions``, ``/v1/responses``,
``/v1/embeddings``) and its ``body`` as the client sent it. It gets one
:class:`DeferredOutcome` back: an answer per ``custom_id`` that has one (a 200 with its body and
usage, or the API's refusal of that line), and the lines left *unanswered*: never run by the
API (never billed), for the runner to send again. A line with an answer is never in that set.

How the lines go, by ``[batch] fallback``:

- ``batch`` (the default): the upstream's own Batch API (:mod:`proxy.upstream.batch_api`): one
  batch per endpoint and model (OpenAI takes one of each per batch), uploaded, polled and read
  back. The lines of an ``expired``, ``failed`` or ``cancelled`` batch that have no answer are
  unanswered.
- ``flex``: one call per line, with ``service_tier: "flex"`` on chat and responses (OpenAI's
  slow and cheaper tier); ``sync``: one call per line as an interactive request would make it.
  At most ``[batch] sync_concurrency`` calls are in flight. A line refused by the API (a 4xx)
  has that refusal as its answer; a line rate-limited after the retries (a 429: not run) is
  unanswered; any other failure (a 5xx, a timeout: the API may have run, and billed, it) is
  that line's answer, with the proxy's error, and is not sent again.

Each body is the one the interactive path would send (:meth:`Upstream.sent`: the endpoint's
allow-list, the mapped model), and a ``/v1/responses`` body must already be the one
:mod:`proxy.upstream.responses_api` builds.

A model that ``[fallback.models]`` maps to a litellm provider: where the provider's Files and
Batch APIs are OpenAI's (``groq``, ``deepinfra``, ``nebius``: see
:mod:`proxy.upstream.litellm_batches`, which also says why the others are not), its chat lines
go in ``batch`` mode as one batch through the proxy's own wire, at the base URL and with the key
litellm's resolver gives for that provider, each line under the provider's own model name, so
they are billed at the provider's batch rate. Every other litellm provider, and a litellm
model's lines on other endpoints than chat, are sent one call per line (``sync``, chat through
the litellm route). A listed provider that refuses to make the batch (a 404, or a 400 that says
batches are not supported) has that batch's lines sent one call each, once, and a warning
``upstream_batch_unsupported`` says so (the provider, the requested model, the status, the
count of lines: no key, no content). litellm's own file and batch functions were tried against
the fake API (``hosted_vllm``) and not used: for the OpenAI-compatible providers they resolve
neither base nor key from the provider's variables (the caller must), they build an ``openai``
client per call whose connections are never closed (five sockets left open by one small
batch), and a poll of a finished batch makes litellm read its whole output file in the
background to price it, with no bound (unless ``litellm_metadata`` says
``batch_ignore_default_logging``). The proxy's wire has none of these faults: one pool per
base and key, closed at shutdown, and every read bounded as on the direct route.

For a batch, ``send`` calls ``submitted(batch_id, custom_ids)`` once the upstream has made it
and before it is polled, so that the runner can record the id and, after a restart, pick the
batch up again with :meth:`Deferred.resume` instead of sending its lines twice.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import structlog

from proxy.config import BatchSettings
from proxy.errors import ProxyError, UpstreamRateLimited, UpstreamStatus
from proxy.upstream.batch_api import BatchAPI, LineResult
from proxy.upstream.client import (
    CHAT_PATH,
    COMPLETIONS_PATH,
    EMBEDDINGS_PATH,
    RESPONSES_PATH,
    Upstream,
)

__all__ = ["ENDPOINTS", "Deferred", "DeferredLine", "DeferredOutcome", "LineResult"]

ENDPOINTS: dict[str, str] = {
    "/v1/chat/completions": CHAT_PATH,
    "/v1/completions": COMPLETIONS_PATH,
    "/v1/responses": RESPONSES_PATH,
    "/v1/embeddings": EMBEDDINGS_PATH,
}
"""A line's ``url`` and the upstream path under ``api_base`` it is sent to."""
FLEX_PATHS = frozenset({CHAT_PATH, RESPONSES_PATH})
"""The endpoints OpenAI serves at the flex tier."""
CHAT_URL = "/v1/chat/completions"
UNSUPPORTED = re.compile(r"not (yet )?supported|unsupported|not enabled|not available", re.I)
"""What a 400 says when a provider makes no batch of these lines (this account, model or base
has no Batch API): the lines go one call each instead."""

log = structlog.get_logger("frugal.upstream")

Submitted = Callable[[str, tuple[str, ...]], Awaitable[None]]


@dataclass(frozen=True, kw_only=True, slots=True)
class DeferredLine:
    """One request that can wait: its ``custom_id`` (unique in a call), ``url`` and ``body``."""

    custom_id: str
    url: str
    body: dict[str, Any]


@dataclass(frozen=True, kw_only=True)
class DeferredOutcome:
    """What came back for the lines of one :meth:`Deferred.send`."""

    results: dict[str, LineResult] = field(default_factory=dict)
    """Per ``custom_id``: the API's answer (``ok``), or its refusal of that line."""
    unanswered: tuple[str, ...] = ()
    """The ``custom_id``\\ s the API never ran (an expired, failed or cancelled batch; a 429),
    in the order they were given: to be sent again. None of them is in ``results``."""
    ignored: int = 0
    """Output lines ignored: a ``custom_id`` not sent, a second answer, a line that is not an
    answer's JSON (a hostile or broken upstream)."""
    batches: tuple[dict[str, Any], ...] = ()
    """The upstream batch objects, as they ended (``status``, ``errors``, ``request_counts``)."""

    def merged(self, other: DeferredOutcome) -> DeferredOutcome:
        return DeferredOutcome(
            results={**self.results, **other.results},
            unanswered=self.unanswered + other.unanswered,
            ignored=self.ignored + other.ignored,
            batches=self.batches + other.batches,
        )


class Deferred:
    """Sends lines that can wait through ``upstream``, as ``settings.fallback`` says."""

    def __init__(self, upstream: Upstream, settings: BatchSettings) -> None:
        self._upstream = upstream
        self._settings = settings
        self._apis: dict[str, BatchAPI | None] = {}

    def api(self, requested_model: str = "") -> BatchAPI | None:
        """The Batch API that lines for ``requested_model`` go to (``api_base``'s for an
        unmapped model), for a runner that polls, cancels or deletes itself; None when they go
        one call each."""
        if requested_model not in self._apis:
            self._apis[requested_model] = self._upstream.batch_api(self._settings, requested_model)
        return self._apis[requested_model]

    def _batch_api(self, lines: Sequence[DeferredLine]) -> BatchAPI:
        api = self.api(_model(lines[0])) if lines else None
        if api is None:
            raise ValueError("these lines are not sent as a batch")
        return api

    @property
    def mode(self) -> str:
        return self._settings.fallback

    async def send(
        self,
        lines: Sequence[DeferredLine],
        *,
        request_id: str,
        submitted: Submitted | None = None,
    ) -> DeferredOutcome:
        """Send ``lines`` upstream and wait for their answers (see the module's docstring).

        Raises a :class:`~proxy.errors.ProxyError` when a batch could not be made (no line was
        answered) or its answers could not be read (its id was given to ``submitted``).
        """
        ids = [line.custom_id for line in lines]
        if len(set(ids)) != len(ids):
            raise ValueError("each line sent together needs its own custom_id")
        for line in lines:
            if line.url not in ENDPOINTS:
                raise ValueError(f"a deferred line cannot be sent to {line.url!r}")
        outcome = DeferredOutcome()
        singles = [line for line in lines if self._single(line)]
        if singles:
            outcome = outcome.merged(await self._one_by_one(singles, request_id))
        groups: dict[tuple[str, str], list[DeferredLine]] = {}
        for line in lines:
            if not self._single(line):
                groups.setdefault((line.url, _model(line)), []).append(line)
        for (url, model), group in groups.items():
            sent = [(line.custom_id, self._sent(line)) for line in group]
            try:
                batch_id = await self._batch_api(group).submit(url, sent, request_id=request_id)
            except UpstreamStatus as exc:
                if not (self._upstream.via_litellm(model) and _unsupported(exc)):
                    raise
                log.warning(
                    "upstream_batch_unsupported",
                    provider=self._upstream.target(model).partition("/")[0],
                    model=model,
                    status=exc.status,
                    lines=len(group),
                    sent_as="sync",
                )
                outcome = outcome.merged(await self._one_by_one(group, request_id))
                continue
            if submitted is not None:
                await submitted(batch_id, tuple(cid for cid, _ in sent))
            outcome = outcome.merged(await self.resume(batch_id, group, request_id=request_id))
        return outcome

    async def resume(
        self, batch_id: str, lines: Sequence[DeferredLine], *, request_id: str
    ) -> DeferredOutcome:
        """Wait for the upstream batch ``batch_id``, made of ``lines``, and read its answers."""
        api = self._batch_api(lines)
        batch = await api.wait(batch_id, request_id=request_id)
        sent = [line.custom_id for line in lines]
        collected = await api.collect(batch, frozenset(sent), request_id=request_id)
        return DeferredOutcome(
            results=collected.results,
            unanswered=tuple(cid for cid in sent if cid not in collected.results),
            ignored=collected.ignored,
            batches=(batch,),
        )

    async def cancel(
        self, batch_id: str, lines: Sequence[DeferredLine], *, request_id: str
    ) -> dict[str, Any]:
        """Cancel the upstream batch made of ``lines``; :meth:`resume` then reads what it had
        answered."""
        return await self._batch_api(lines).cancel(batch_id, request_id=request_id)

    # -- one call per line ---------------------------------------------------------------------

    def _single(self, line: DeferredLine) -> bool:
        """Whether the line goes as its own call: the flex and sync modes, a model whose
        provider has no batch API here, and a line for a litellm-routed model on another
        endpoint than chat (the only one that route sends)."""
        if self._settings.fallback != "batch":
            return True
        model = _model(line)
        if line.url != CHAT_URL and self._upstream.via_litellm(model):
            return True
        return self.api(model) is None

    def tier(self, url: str, body: dict[str, Any]) -> str | None:
        """The tier a line for ``url`` with ``body`` is billed at at worst, for its
        reservation: ``batch`` when it goes in an upstream batch that cannot turn into single
        calls; otherwise the tier of its own call (``flex``, or None: the standard rate), since a
        litellm provider that refuses a batch has its lines sent one call each."""
        line = DeferredLine(custom_id="", url=url, body=body)
        if not self._single(line) and not self._upstream.via_litellm(_model(line)):
            return "batch"
        return self._single_tier(ENDPOINTS.get(url, ""))

    def _single_tier(self, path: str) -> str | None:
        """The tier a line sent as its own call to ``path`` is billed at."""
        return "flex" if self._settings.fallback == "flex" and path in FLEX_PATHS else None

    def _sent(self, line: DeferredLine) -> dict[str, Any]:
        return self._upstream.sent(ENDPOINTS[line.url], line.body)

    async def _one_by_one(self, lines: Sequence[DeferredLine], request_id: str) -> DeferredOutcome:
        gate = asyncio.Semaphore(self._settings.sync_concurrency)

        async def one(index: int, line: DeferredLine) -> LineResult | None:
            path = ENDPOINTS[line.url]
            body = dict(line.body)
            tier = self._single_tier(path)
            if tier is not None:
                body["service_tier"] = tier
            rid = f"{request_id}.{index}"
            async with gate:
                try:
                    if path == CHAT_PATH:
                        answer = await self._upstream.chat(body, request_id=rid)
                    elif path == RESPONSES_PATH:
                        sent = self._upstream.sent(path, body)
                        answer = await self._upstream.post_direct(path, sent, request_id=rid)
                    else:
                        answer = await self._upstream.post_json(path, body, request_id=rid)
                except UpstreamRateLimited:
                    return None  # refused before it was run: sent again later
                except ProxyError as exc:  # a refusal (its error passed on), or a failure
                    return LineResult(status_code=exc.status, body=exc.body(), tier=tier)
            return LineResult(
                status_code=answer.status, body=answer.body, request_id=rid, tier=tier
            )

        done = await asyncio.gather(*(one(i, line) for i, line in enumerate(lines)))
        results = {
            line.custom_id: result
            for line, result in zip(lines, done, strict=True)
            if result is not None
        }
        unanswered = tuple(line.custom_id for line in lines if line.custom_id not in results)
        return DeferredOutcome(results=results, unanswered=unanswered)


def _unsupported(exc: UpstreamStatus) -> bool:
    """Whether a provider's refusal of a batch says it has no Batch API for it: a 404 (no such
    endpoint), or a 400 that says so."""
    return exc.status == 404 or (exc.status == 400 and UNSUPPORTED.search(exc.message) is not None)


def _model(line: DeferredLine) -> str:
    model = line.body.get("model")
    return model if isinstance(model, str) else ""
