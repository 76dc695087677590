"""The end of one exchange: its ledger row, its metrics and its log line, written once.

    finish(ex, services)   the row handed to the ledger (priced there, a local answer recounted
                           off the request path), the router told what happened, the key's
                           budget settled, the metrics and the ``request`` log line; then the
                           drawn shadow audit started (:mod:`proxy.serving.shadow`). Later calls
                           do nothing.

:meth:`proxy.serving.cascade.Cascade.serve` calls it when an answer or an error is sent, and the
events of a stream (their ``on_end``, which the server's :class:`proxy.server.sse.EventStream`
calls) when its last byte is out or its client left.
Prompts and answers reach the log only as ``request_content``, when ``[server] log_content``
is on.

Imports :mod:`proxy.ledger` (the row, pricing, the token count job) and the exchange it reads.
"""

from __future__ import annotations

import time
from typing import Any

import structlog

from proxy.ledger.pricing import PUSD_PER_USD, SEARCH_SIZES, estimate_costs, service_tier
from proxy.ledger.writing.ledger_row import LedgerRow
from proxy.ledger.writing.tokens import CountJob
from proxy.protocol.params import LOCAL_ALIAS
from proxy.serving import shadow
from proxy.serving.exchange import Exchange
from proxy.serving.services import Services

log = structlog.get_logger("frugal.request")

# What the metrics take from the exchange as it is, under the exchange's own names.
_OBSERVED = (
    "endpoint",
    "route",
    "reason",
    "status",
    "quality",
    "prompt_tokens",
    "completion_tokens",
    "local_prompt_tokens",
    "local_completion_tokens",
)
# What the ledger row takes as it is: those, and more. ``token_source`` is set only for an API
# call charged without the provider's usage (proxy.serving.charges); otherwise the writer says
# where the counterfactual tokens came from.
_KEPT = (
    *_OBSERVED,
    "request_id",
    "error",
    "key_name",
    "cached_tokens",
    "predicted_local_ms",
    "actual_local_ms",
    "backend",
    "local_model",
    "predicted_completion_tokens",
    "upstream_attempts",
    "token_source",
    "deferred_tier",
)


def _as_is(ex: Exchange, names: tuple[str, ...]) -> dict[str, Any]:
    """The exchange's fields ``names``, by name."""
    return {name: getattr(ex, name) for name in names}


def _billed(ex: Exchange) -> dict[str, Any]:
    """The ledger's billing columns: the tier the API answer says it was served at, else the
    one it was sent with (for a local answer, the request's tier, which its counterfactual is
    priced at); the search context size it was sent with; its audio tokens; and its web
    searches (a chat request with ``web_search_options`` makes one; a Responses answer counts
    its own)."""
    sent = ex.worst_body if ex.worst_body is not None else (ex.body or {})
    options = sent.get("web_search_options")
    size = options.get("search_context_size") if isinstance(options, dict) else None
    for tool in sent.get("tools") or []:
        if isinstance(tool, dict) and str(tool.get("type", "")).startswith("web_search"):
            size = size or tool.get("search_context_size")
    billed = ex.billed
    searches = billed.web_searches
    if ex.route == "api" and not searches and isinstance(options, dict):
        searches = 1
    return {
        "service_tier": service_tier(
            billed.served_tier if billed.served_tier is not None else sent.get("service_tier")
        ),
        "audio_prompt_tokens": billed.audio_prompt_tokens,
        "audio_completion_tokens": billed.audio_completion_tokens,
        "web_searches": searches if ex.route == "api" else 0,
        "search_context_size": size if size in SEARCH_SIZES else None,
    }


def finish(ex: Exchange, services: Services) -> None:
    """Write the exchange's ledger row, log line and metrics; once, later calls do nothing."""
    if not ex.recording():
        return
    latency_ms = (time.perf_counter() - ex.started) * 1000
    model = ex.model or ""
    row = LedgerRow(
        **_as_is(ex, _KEPT),
        **_billed(ex),
        ts=ex.arrived,
        requested_model=ex.model,
        stream=int(ex.stream),
        quality_reasons=",".join(ex.quality_reasons[:3]) or None,
        latency_ms=round(latency_ms, 2),
        local_ms=round(ex.local_ms, 2),
        api_ms=round(ex.api_ms, 2),
        api_model=services.upstream.target(model) if model != LOCAL_ALIAS else None,
    )
    # Costs for the log and the metrics now; the ledger prices the row itself, recounting
    # a local answer with the requested model's tokenizer off the request path.
    facts = row.as_dict()
    api_cost, counterfactual = estimate_costs(facts, services.prices)
    count = None
    if ex.route == "local" and ex.status < 400 and ex.body and ex.local_completion:
        count = CountJob(model=model, body=ex.body, completion=ex.local_completion)
    services.ledger.record(row, count=count)
    services.router.observe(facts)
    if ex.audit is not None:
        shadow.start(ex, services)
    # A client that left still cost what upstream reported for it, or what was estimated
    # (proxy.serving.charges).
    paid = api_cost if ex.status < 400 or ex.status == 499 else None
    if services.quotas is not None:  # the budget: the real cost replaces the reservation
        services.quotas.settle(ex.reservation, paid if ex.route == "api" else 0)
    services.metrics.observe(
        **_as_is(ex, _OBSERVED),
        latency_s=latency_ms / 1000,
        api_cost_pusd=paid,
        counterfactual_pusd=counterfactual,
    )
    log.info(
        "request",
        request_id=ex.request_id,
        model=ex.model,
        route=ex.route,
        reason=ex.reason,
        status=ex.status,
        stream=ex.stream,
        quality=None if ex.quality is None else round(ex.quality, 3),
        latency_ms=round(latency_ms, 1),
        local_ms=round(ex.local_ms, 1),
        prompt_tokens=ex.prompt_tokens,
        completion_tokens=ex.completion_tokens,
        cost_usd=None if paid is None else paid / PUSD_PER_USD,
        counterfactual_usd=None if counterfactual is None else counterfactual / PUSD_PER_USD,
        key=ex.key_name,
        error=ex.error,
    )
    if ex.content is not None:  # [server] log_content: the operator asked for it
        log.debug(
            "request_content",
            request_id=ex.request_id,
            messages=ex.content.messages,
            completion="".join(ex.content.out),
        )
