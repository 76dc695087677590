"""The app's lifespan: the parts it starts, in order, and how it stops them.

:func:`lifespan` opens the ledger, the key store, the quotas, the stored Responses, the files and
batches (their expiry swept every minute) and the upstream client, then starts the engine and the
router, the shadow audits, (with ``[quality] auto_calibrate``) the calibrator, and the batch
runner (:func:`_start_batch_runner`). It keeps the typed
:class:`~proxy.serving.services.Services` on ``app.state.services`` and makes one handler per
endpoint from them, each into the :class:`~proxy.server.endpoints.Mounted` its route serves, and
serves once the ledger's token counter is in. On shutdown (after uvicorn has drained in-flight
requests) it stops the batch runner first (the lines it holds go back to pending, for the next
start or another replica; lines with the upstream stay there, and are resumed), then the
calibrator, the audits, the quotas and the stored Responses, then
:func:`proxy.server.shutdown.shutdown` flushes the ledger first, so that the rows of finished
requests are safe whatever happens next, stops the rest with a bound on each step, and closes the
ledger last (see :func:`proxy.server.shutdown.shutdown_budget_s`).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import structlog
from starlette.applications import Starlette

from proxy.audit.refit import AutoCalibrator
from proxy.audit.runner import AuditRunner
from proxy.config import Settings
from proxy.config.secrets import Secrets
from proxy.engine.local_engine import LocalEngine
from proxy.ledger.batches.store import BatchStore
from proxy.ledger.db.connections import Pool
from proxy.ledger.db.location import from_settings
from proxy.ledger.pricing import PriceBook, load_price_map
from proxy.ledger.writing.writer import Ledger
from proxy.routing.router import Router
from proxy.server.endpoints import Mounted
from proxy.server.shutdown import AUDIT_STOP_S, AUX_STOP_S, bounded, shutdown
from proxy.serving import record
from proxy.serving.background_responses import BackgroundResponses
from proxy.serving.batch_attempt import BatchAttempt
from proxy.serving.batch_gauges import BatchGauges
from proxy.serving.batch_lines import LedgerPurse
from proxy.serving.batch_runner import BatchRunner
from proxy.serving.batches_state import BatchesState
from proxy.serving.clients import Authenticator
from proxy.serving.holders import holder
from proxy.serving.in_flight import InFlight
from proxy.serving.metrics import Metrics
from proxy.serving.quotas import AuditPurse, Quotas
from proxy.serving.responses_state import ResponsesState
from proxy.serving.services import Services
from proxy.upstream.client import Upstream
from proxy.upstream.deferred import Deferred

log = structlog.get_logger("frugal.app")


@dataclass(slots=True)
class _Parts:
    """The services the lifespan has started so far: what :func:`_stop` stops when the app
    ends, or when a later part fails to start. The router, the audits and the calibrator are
    kept here before their own start, so that one whose start fails is stopped too."""

    prices: PriceBook
    ledger: Ledger
    auth: Authenticator
    quotas: Quotas
    stored: ResponsesState
    batches: BatchesState
    upstream: Upstream
    engine: LocalEngine
    owns_engine: bool  # False: the caller's engine, which the app neither starts nor stops
    router: Router | None = None
    audit: AuditRunner | None = None
    calibrator: AutoCalibrator | None = None
    runner: BatchRunner | None = None
    runner_pool: Pool | None = None


def lifespan(
    settings: Settings,
    in_flight: InFlight,
    engine: LocalEngine | None,
    mounted: tuple[Mounted, ...],
) -> Callable[[Starlette], contextlib.AbstractAsyncContextManager[None]]:
    """The app's lifespan: starts the parts in order, serves, then stops them (:func:`_stop`).
    ``engine``: the caller's started engine, which the app neither starts nor stops;
    ``mounted``: the endpoints the app routes, each given its handler here."""

    @contextlib.asynccontextmanager
    async def run(app: Starlette) -> AsyncIterator[None]:
        started_at = time.time()
        parts = await _open_parts(settings, engine)
        try:
            await _start_routing(settings, parts)
            await _start_audit(settings, parts)
            _start_calibrator(settings, parts)
            await _start_batch_runner(settings, parts)
            services = _services(settings, parts, started_at, in_flight)
            _mount_handlers(app, services, mounted)
            assert services.background is not None
            # fails those a stopped proxy left open, each with its row
            await services.background.start(lambda ex: record.finish(ex, services))
            await _ready(settings, parts)
            yield
        finally:
            await _stop(settings, parts, app)

    return run


async def _open_parts(settings: Settings, engine: LocalEngine | None) -> _Parts:
    """The prices, then the ledger, the key store, the quotas, the stored Responses and the
    upstream client, each started; and the engine, made but not started (``engine``: the
    caller's). A failure here stops nothing: it ends the start-up."""
    prices = PriceBook.from_settings(load_price_map(), settings.pricing)
    ledger = Ledger(
        from_settings(settings.ledger),
        prices=prices,
        flush_interval_s=settings.ledger.flush_interval_s,
        batch_size=settings.ledger.batch_size,
        busy_timeout_s=settings.ledger.busy_timeout_s,
        max_queue=settings.ledger.max_queue,
        shutdown_timeout_s=settings.ledger.shutdown_timeout_s,
    )
    await ledger.start()
    auth = Authenticator(settings)
    await auth.start()
    quotas = Quotas(settings, from_settings(settings.ledger), prices)
    await quotas.start()
    stored = ResponsesState(settings, from_settings(settings.ledger))
    await stored.start()
    batches = BatchesState(settings, from_settings(settings.ledger), prices)
    await batches.start()
    upstream = Upstream(settings.fallback, secrets=Secrets.known(settings))
    await upstream.start()
    local = engine or LocalEngine(
        settings.local,
        relevance=settings.quality.relevance,
        private_env=(settings.fallback.api_key_env, settings.server.api_keys_env),
        weights_path=settings.quality.weights_path,
        weights_optional=settings.quality.auto_calibrate,
    )
    return _Parts(
        prices=prices,
        ledger=ledger,
        auth=auth,
        quotas=quotas,
        stored=stored,
        batches=batches,
        upstream=upstream,
        engine=local,
        owns_engine=engine is None,
    )


async def _start_routing(settings: Settings, parts: _Parts) -> None:
    """The engine (unless it is the caller's), then the router over it and the upstream."""
    if parts.owns_engine:
        await parts.engine.start()
    parts.router = Router(settings, parts.engine, parts.upstream.enabled)
    await parts.router.start()


async def _start_audit(settings: Settings, parts: _Parts) -> None:
    """The shadow audits (docs/audit.md), which a key pays for through the quotas."""
    assert parts.router is not None  # started by _start_routing
    parts.audit = AuditRunner(
        settings,
        upstream=parts.upstream,
        ledger=parts.ledger,
        prices=parts.prices,
        router=parts.router,
        database=parts.ledger.database,
        local_model=str(parts.engine.health().get("model") or settings.local.model_path),
        purse=AuditPurse(parts.quotas, parts.auth.stored_key, parts.upstream),
    )
    await parts.audit.start()


def _start_calibrator(settings: Settings, parts: _Parts) -> None:
    """With ``[quality] auto_calibrate``: the background refit of ``weights_path`` from the
    audits; the worker picks the new file up on its next answer (proxy/engine/weights.py)."""
    if not settings.quality.auto_calibrate:
        return
    parts.calibrator = AutoCalibrator(
        parts.ledger.database,
        parts.engine.model_path,
        settings.quality.weights_path,
        target=settings.quality.target_precision or None,
        configured_threshold=settings.quality.threshold,
    )
    parts.calibrator.start()


async def _start_batch_runner(settings: Settings, parts: _Parts) -> None:
    """The batch runner (:mod:`proxy.serving.batch_runner`): ``[local] parallel`` lines at a
    time, each tried by the router on the bundled engine and the remote backends in the
    engine's ``deferred`` class (:class:`~proxy.serving.batch_attempt.BatchAttempt`), the rejects
    sent to the upstream's Batch API together (``[batch] fallback``), each key's budget held
    for them. It resumes what a previous run left claimed or with the upstream. A line the
    router cannot plan locally (embeddings, a feature no local backend has) goes straight to
    the upstream; with no API fallback configured, a local answer is kept whatever its score,
    and a line only the API can serve ends in the batch's error file. Its store is on a pool of
    its own, so that its claims never wait behind the Files and Batches endpoints'."""
    assert parts.router is not None  # started by _start_routing
    batch = settings.batch
    parts.runner_pool = Pool(from_settings(settings.ledger), size=2, timeout_s=10.0)
    auth = parts.auth

    def budget_of(key_name: str) -> int | None:
        key = auth.stored_key(key_name)
        return None if key is None else key.monthly_budget_pusd

    deferred = Deferred(parts.upstream, batch)
    parts.runner = BatchRunner(
        BatchStore(parts.runner_pool, prices=parts.prices, lease_s=batch.line_lease_s),
        BatchAttempt(
            parts.router,
            count=parts.ledger.counter.submit,
            default_max_tokens=settings.local.default_max_tokens,
            audit=parts.audit,
        ),
        deferred,
        width=settings.local.parallel,
        lease_s=batch.line_lease_s,
        max_claims=batch.line_max_claims,
        purse=LedgerPurse(
            parts.quotas.budgets,
            parts.prices,
            budget_of,
            ttl_s=batch.line_lease_s,
            tier_of=deferred.tier,
        ),
        key_name=auth.name_by_identity,
        # the claims' owner, kept on each line it ran: which replica (host, process) ran it
        worker=f"{holder()}:{secrets.token_hex(3)}",
    )
    await parts.runner.start()


def _services(
    settings: Settings, parts: _Parts, started_at: float, in_flight: InFlight
) -> Services:
    """The typed, frozen bundle of the started parts, and the metrics over them."""
    assert parts.router is not None  # started by _start_routing
    return Services(
        settings=settings,
        started_at=started_at,
        prices=parts.prices,
        ledger=parts.ledger,
        auth=parts.auth,
        upstream=parts.upstream,
        engine=parts.engine,
        router=parts.router,
        metrics=Metrics(
            in_flight=in_flight,
            engine=parts.engine,
            router=parts.router,
            ledger=parts.ledger,
            batches=BatchGauges(
                parts.quotas.pool, runner=None if parts.runner is None else parts.runner.gauges
            ),
        ),
        in_flight=in_flight,
        audit=parts.audit,
        quotas=parts.quotas,
        responses=parts.stored,
        batches=parts.batches,
        background=BackgroundResponses(
            parts.stored,
            max_per_key=settings.responses.max_background_per_key,
            lease_s=settings.batch.line_lease_s,
        ),
    )


def _mount_handlers(app: Starlette, services: Services, mounted: tuple[Mounted, ...]) -> None:
    """``app.state.services`` (for the middleware and the plain routes), and each endpoint's
    handler made from them, into the :class:`Mounted` its route serves."""
    app.state.services = services
    for place in mounted:
        place.fill(services)


async def _ready(settings: Settings, parts: _Parts) -> None:
    """Waits for the ledger's token counter, then says that the app serves, and how."""
    # litellm (the ledger's token counter) imported alongside the engine's start; serve once it
    # is in, so that the import never competes with requests for the GIL.
    await parts.ledger.counter_ready()
    if not parts.upstream.enabled:
        log.warning("local_only", detail=_no_fallback_detail(settings))
    log.info(
        "serving",
        auth=parts.auth.enabled,
        fallback=parts.upstream.enabled,
        threshold=settings.quality.threshold,
        stream_mode=settings.router.stream_mode,
    )


async def _stop(settings: Settings, parts: _Parts, app: Starlette) -> None:
    """Stops what started, after uvicorn's drain: the calibrator, the audits, the quotas, the
    stored Responses, the body checker, then :func:`proxy.server.shutdown.shutdown` (the ledger
    flushed first and closed last), each step bounded. The batch runner goes first: the lines
    it holds go back to pending (its local attempts cancelled), and the rows of those it
    finished are in the ledger's hands before the flush."""
    if parts.runner is not None:
        await bounded(parts.runner.stop(), AUX_STOP_S, "batch_runner")
    if parts.runner_pool is not None:
        await asyncio.to_thread(parts.runner_pool.close)
    if parts.calibrator is not None:
        await bounded(parts.calibrator.close(), AUX_STOP_S, "calibrator")
    if parts.audit is not None:
        # The audits before the quotas: an audit that ends pays its cost from the key's budget
        # through them (the ledger's flush comes after both, in shutdown).
        await bounded(parts.audit.close(AUDIT_STOP_S), AUDIT_STOP_S + 0.5, "audit")
    built = getattr(app.state, "services", None)
    if built is not None and built.background is not None:  # before the store they write to
        await bounded(built.background.stop(), AUX_STOP_S, "background")
    await bounded(parts.quotas.stop(), AUX_STOP_S, "quotas")
    await bounded(parts.stored.stop(), AUX_STOP_S, "responses")
    await bounded(parts.batches.stop(), AUX_STOP_S, "batches")
    if built is not None:
        built.bodies.close()
    await shutdown(
        settings,
        ledger=parts.ledger,
        auth=parts.auth,
        upstream=parts.upstream,
        engine=parts.engine if parts.owns_engine else None,
        router=parts.router,
    )


def _no_fallback_detail(settings: Settings) -> str:
    """Why there is no API fallback, and what to set."""
    fallback = settings.fallback
    if not (fallback.api_base or fallback.models):
        return "no API fallback: [fallback] api_base is empty"
    return (
        f"no API fallback: the environment variable {fallback.api_key_env} (named by "
        '[fallback] api_key_env) is not set; set it, or set [fallback] api_key_env = "" '
        "for an upstream that needs no key"
    )
