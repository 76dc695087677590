"""The app's Prometheus metrics, in a registry of its own (served at ``GET /metrics`` by
:mod:`proxy.server.scrape`).

Each app builds its own :class:`Metrics` (with its own ``CollectorRegistry``, never the global
one), so tests can build as many apps as they like. A request costs one :meth:`Metrics.observe`
call, made from the code that writes its ledger row. What lives elsewhere (the engine's queue
and profiled rates, the ledger's counters, requests in flight) is read when Prometheus scrapes,
by :class:`_StateCollector`, and costs nothing in between.

Money is added up as integer pico-dollars, as the ledger stores it, and turned into USD only
when scraped. It is what the request knew when it ended: for a local answer the ledger may later
refine the counterfactual with the requested model's tokenizer, so ``frugal report`` is the
figure to bill by, and the metrics are the one to watch.

``frugal_saved_usd_total`` adds each request's counterfactual − actual cost when that is
positive; a request that cost more than its counterfactual (a model mapped to a
pricier one) cannot make a counter go down, so the exact figure over any window is
``frugal_counterfactual_cost_usd_total - frugal_api_cost_usd_total``.

    frugal_requests_total{endpoint,route,reason,status}    answered requests
    frugal_request_duration_seconds{endpoint,route}        arrival to last byte (histogram)
    frugal_tokens_total{route,kind}                        tokens of the answers sent
    frugal_local_tokens_total{kind}                        tokens the local engine worked on,
                                                           rejected attempts included
    frugal_quality_score{route}                            local answers' scores (histogram)
    frugal_rejected_requests_total{reason}                 401 / 408 / 413 / 429 before the app
    frugal_api_cost_usd_total, frugal_counterfactual_cost_usd_total, frugal_saved_usd_total
    frugal_in_flight_requests
    frugal_engine_up, frugal_engine_busy, frugal_engine_queue_depth, frugal_engine_max_queue
    frugal_engine_prefill_tokens_per_second, frugal_engine_decode_tokens_per_second
    frugal_engine_{completed,timeouts,crashes,restarts}_total
    frugal_engine_active_sequences, frugal_engine_batch_rows_per_step,
    frugal_engine_{batch,sequence}_tokens_per_second, frugal_engine_draft_acceptance_ratio
    frugal_prediction_error_ratio, frugal_prediction_samples    MdAPE of predicted local times
    frugal_api_latency_seconds                             the API's latency (moving average)
    frugal_backend_{up,queue_depth,predicted_wait_seconds}{backend}
    frugal_backend_{prefill,decode}_tokens_per_second{backend}
    frugal_backend_finish_seconds{backend,measure}         predicted and actual finish (summary)
    frugal_backend_published_requests{backend,state}       load a remote server publishes
    frugal_backend_foreign_requests{backend}               other clients' requests there
    frugal_ledger_rows_{written,rejected,dropped,spilled,lost}_total
    frugal_ledger_usage_invalid_total, frugal_ledger_write_{failures,retries}_total
    frugal_ledger_pending_rows, frugal_ledger_max_queue, frugal_ledger_degraded
    frugal_batch_lines{state}, frugal_batches{status}      deferred work: open batch lines by
                                                           state, batches by status, read every
                                                           few seconds (proxy.serving.batch_gauges)
    frugal_batch_runner_lines{state}                       this replica's runner: lines running
                                                           locally, held, with the upstream
    frugal_batch_runner_lines_finished_total{route}        lines it finished, local or api
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from proxy.ledger.pricing import PUSD_PER_USD
from proxy.routing.reasons import Reason

if TYPE_CHECKING:
    from proxy.engine.local_engine import LocalEngine
    from proxy.ledger.writing.writer import Ledger
    from proxy.routing.router import Router
    from proxy.serving.batch_gauges import BatchGauges
    from proxy.serving.in_flight import InFlight

LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0, 120.0)
QUALITY_BUCKETS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)


class Metrics:
    """The app's counters, and the parts read when Prometheus scrapes (each one optional)."""

    def __init__(
        self,
        *,
        in_flight: InFlight | None = None,
        engine: LocalEngine | None = None,
        router: Router | None = None,
        ledger: Ledger | None = None,
        batches: BatchGauges | None = None,
    ) -> None:
        self.registry = CollectorRegistry()
        self.batches = batches
        reg = self.registry
        self.requests = Counter(
            "frugal_requests",
            "Requests answered, by endpoint, route (local|api|none), reason and HTTP status.",
            ["endpoint", "route", "reason", "status"],
            registry=reg,
        )
        self.latency = Histogram(
            "frugal_request_duration_seconds",
            "Time from a request's arrival to its last byte, by endpoint and route.",
            ["endpoint", "route"],
            buckets=LATENCY_BUCKETS,
            registry=reg,
        )
        self.tokens = Counter(
            "frugal_tokens",
            "Tokens of the answers sent, by route and kind (prompt|completion).",
            ["route", "kind"],
            registry=reg,
        )
        self.local_tokens = Counter(
            "frugal_local_tokens",
            "Tokens the local engine processed, rejected attempts included, by kind.",
            ["kind"],
            registry=reg,
        )
        self.quality = Histogram(
            "frugal_quality_score",
            "Quality scores of local answers, by the route the request finally took.",
            ["route"],
            buckets=QUALITY_BUCKETS,
            registry=reg,
        )
        self.rejections = Counter(
            "frugal_rejected_requests",
            "Requests refused before the app saw them, by reason "
            "(unauthorized|too_large|too_many|body_timeout|key_share|key_rpm).",
            ["reason"],
            registry=reg,
        )
        self.api_cost_pusd = 0
        self.counterfactual_pusd = 0
        self.saved_pusd = 0
        reg.register(_StateCollector(self, in_flight, engine, router, ledger))

    def observe(
        self,
        *,
        endpoint: str,
        route: str,
        reason: Reason,
        status: int,
        latency_s: float,
        prompt_tokens: int | None = None,
        completion_tokens: int | None = None,
        local_prompt_tokens: int | None = None,
        local_completion_tokens: int | None = None,
        quality: float | None = None,
        api_cost_pusd: int | None = None,
        counterfactual_pusd: int | None = None,
    ) -> None:
        """One finished request (called once per request, where its ledger row is made)."""
        self.requests.labels(endpoint, route, reason, str(status)).inc()
        self.latency.labels(endpoint, route).observe(latency_s)
        if prompt_tokens:
            self.tokens.labels(route, "prompt").inc(prompt_tokens)
        if completion_tokens:
            self.tokens.labels(route, "completion").inc(completion_tokens)
        if local_prompt_tokens:
            self.local_tokens.labels("prompt").inc(local_prompt_tokens)
        if local_completion_tokens:
            self.local_tokens.labels("completion").inc(local_completion_tokens)
        if quality is not None:
            self.quality.labels(route).observe(quality)
        if status < 400 and api_cost_pusd is not None and counterfactual_pusd is not None:
            self.api_cost_pusd += api_cost_pusd
            self.counterfactual_pusd += counterfactual_pusd
            self.saved_pusd += max(0, counterfactual_pusd - api_cost_pusd)

    def rejected(self, reason: str) -> None:
        self.rejections.labels(reason).inc()

    async def fresh(self) -> None:
        """Bring what is read from the database up to date, within its bound (awaited by the
        scrape before :meth:`render`, which never waits on the database itself)."""
        if self.batches is not None:
            await self.batches.fresh()

    def render(self) -> bytes:
        return generate_latest(self.registry)


@dataclass(eq=False)  # the registry keys its collectors by identity
class _StateCollector(Collector):
    """What is read at scrape time: money totals, in-flight count, engine and ledger."""

    metrics: Metrics
    in_flight: InFlight | None
    engine: LocalEngine | None
    router: Router | None
    ledger: Ledger | None

    def collect(self) -> Iterator[Metric]:
        m = self.metrics
        for name, doc, pusd in (
            ("frugal_api_cost_usd", "USD actually paid to the API.", m.api_cost_pusd),
            (
                "frugal_counterfactual_cost_usd",
                "USD the API would have charged for every answered request.",
                m.counterfactual_pusd,
            ),
            (
                "frugal_saved_usd",
                "USD saved: counterfactual minus actual cost, summed over requests where it "
                "is positive.",
                m.saved_pusd,
            ),
        ):
            yield CounterMetricFamily(name, doc, value=pusd / PUSD_PER_USD)
        if self.in_flight is not None:
            yield GaugeMetricFamily(
                "frugal_in_flight_requests",
                "Requests being handled now.",
                value=self.in_flight.count,
            )
        if self.engine is not None:
            yield from _engine_metrics(self.engine.health())
        if self.router is not None:  # predictions and local backends (proxy.routing)
            yield from self.router.metrics()
        if self.ledger is not None:
            yield from _ledger_metrics(self.ledger.health())
        if m.batches is not None:
            yield from m.batches.collect()


def _ledger_metrics(health: dict[str, Any]) -> Iterator[Metric]:
    for keys, name, doc in (
        (("rows_written", "written"), "frugal_ledger_rows_written", "Ledger rows written."),
        (
            ("write_failures",),
            "frugal_ledger_write_failures",
            "Ledger transactions that failed (their rows are retried, or tried one by one).",
        ),
        (
            ("write_retries",),
            "frugal_ledger_write_retries",
            "Ledger writes that failed on the database (locked, busy, full) and were retried.",
        ),
        (
            ("rows_rejected",),
            "frugal_ledger_rows_rejected",
            "Ledger rows the database refused alone, put aside in the rejected-rows file.",
        ),
        (
            ("rows_dropped", "dropped"),
            "frugal_ledger_rows_dropped",
            "Ledger rows dropped because the queue was full ([ledger] max_queue).",
        ),
        (
            ("rows_spilled",),
            "frugal_ledger_rows_spilled",
            "Ledger rows still unwritten at shutdown, saved to the rejected-rows file.",
        ),
        (
            ("rows_lost",),
            "frugal_ledger_rows_lost",
            "Ledger rows neither the database nor the rejected-rows file took.",
        ),
        (
            ("usage_invalid",),
            "frugal_ledger_usage_invalid",
            "Ledger rows written with impossible usage figures stored as NULL.",
        ),
    ):
        value = next((health[k] for k in keys if health.get(k) is not None), None)
        if value is not None:
            yield CounterMetricFamily(name, doc, value=float(value))
    for key, name, doc in (
        ("pending", "frugal_ledger_pending_rows", "Ledger rows recorded but not written yet."),
        ("max_queue", "frugal_ledger_max_queue", "Rows the ledger may hold ([ledger] max_queue)."),
    ):
        if health.get(key) is not None:
            yield GaugeMetricFamily(name, doc, value=float(health[key]))
    if health.get("state") is not None:
        yield GaugeMetricFamily(
            "frugal_ledger_degraded",
            "1 while ledger writes fail or its queue is full, or soon after a row was dropped "
            "or rejected.",
            value=float(health["state"] != "ok"),
        )


def _engine_metrics(health: dict[str, Any]) -> Iterator[Metric]:
    gauges = (
        ("frugal_engine_up", "1 when the local engine is ready.", health["state"] == "ready"),
        ("frugal_engine_busy", "1 while the local engine is generating.", health.get("busy")),
        (
            "frugal_engine_queue_depth",
            "Requests waiting for the local engine.",
            health.get("queue_depth"),
        ),
        (
            "frugal_engine_max_queue",
            "Requests allowed to wait for the local engine ([local] max_queue).",
            health.get("max_queue"),
        ),
        (
            "frugal_engine_prefill_tokens_per_second",
            "Profiled prompt-processing rate of the local engine.",
            health.get("prefill_tok_s"),
        ),
        (
            "frugal_engine_decode_tokens_per_second",
            "Profiled generation rate of the local engine.",
            health.get("decode_tok_s"),
        ),
    )
    batch = health.get("batch") or {}
    speculative = health.get("speculative") or {}
    more: tuple[tuple[str, str, Any], ...] = (
        (
            "frugal_engine_active_sequences",
            "Requests being generated by the local engine now ([local] parallel at most).",
            health.get("active_sequences"),
        ),
        (
            "frugal_engine_batch_rows_per_step",
            "Mean rows per decode step of the local engine's batch loop.",
            batch.get("mean_rows_per_step"),
        ),
        (
            "frugal_engine_batch_tokens_per_second",
            "Tokens per second decoded by the batch loop, all sequences together.",
            batch.get("aggregate_tok_s"),
        ),
        (
            "frugal_engine_sequence_tokens_per_second",
            "Decode rate of one sequence in the batch (moving average).",
            batch.get("sequence_tok_s"),
        ),
        (
            "frugal_engine_draft_acceptance_ratio",
            "Drafted tokens accepted by speculative decoding, over tokens drafted.",
            speculative.get("acceptance_rate"),
        ),
    )
    for name, doc, value in (*gauges, *more):
        if value is not None:
            yield GaugeMetricFamily(name, doc, value=float(value))
    for key, doc in (
        ("completed", "Local generations completed."),
        ("timeouts", "Local generations stopped at their deadline."),
        ("crashes", "Local engine worker crashes."),
        ("restarts", "Local engine worker restarts."),
    ):
        value = health.get(key)
        if value is not None:
            yield CounterMetricFamily(f"frugal_engine_{key}", doc, value=float(value))
