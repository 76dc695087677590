"""The orderly stop of the app's services, and the longest it can take.

After uvicorn has drained the requests in flight, :func:`shutdown` lets the audits in flight end,
flushes the ledger first (so the rows of finished requests are safe whatever happens next), stops
the router, the engine, the upstream client and the key store (each step bounded, so one that
hangs cannot hold up the next), and closes the ledger last. :func:`shutdown_budget_s` adds those
bounds up; the systemd unit's ``TimeoutStopSec`` must stay above it (a test checks it).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import structlog

from proxy.audit.runner import AuditRunner
from proxy.config import Settings
from proxy.engine.local_engine import LocalEngine
from proxy.ledger.writing.writer import Ledger
from proxy.routing.router import Router
from proxy.serving.clients import Authenticator
from proxy.upstream.client import Upstream

log = structlog.get_logger("frugal.app")


# Bounds of the shutdown steps after the ledger's flush; see shutdown_budget_s.
ENGINE_STOP_S = 8.0  # LocalEngine.stop: 3 s for the worker to leave, then kill and 3 s more
AUX_STOP_S = 1.0  # each of the router's, the upstream client's and the key store's close
AUDIT_STOP_S = 1.0  # audits in flight, waited for before the ledger's flush, then cancelled
LEDGER_CLOSE_MIN_S = 1.0  # the ledger's close, when its flush used all of shutdown_timeout_s


def shutdown_budget_s(settings: Settings) -> float:
    """The longest a stop can take, SIGTERM to exit, less the interpreter's own exit.

    uvicorn drains requests in flight for ``[server] drain_s`` (rounded to whole seconds, at
    least 1, plus its 0.1 s pause), then the lifespan: the ledger's flush and close together
    take at most ``[ledger] shutdown_timeout_s`` (or ``busy_timeout_s``, if longer) +
    LEDGER_CLOSE_MIN_S, the engine's stop
    ENGINE_STOP_S, the three other closes AUX_STOP_S each. ``deploy/frugal-proxy.service``'s
    ``TimeoutStopSec`` must stay above it with a margin (a test checks it).
    """
    drain = max(1, round(settings.server.drain_s)) + 0.1
    # A lock wait under way when the stop begins is not cut short: busy_timeout_s bounds it.
    ledger = max(settings.ledger.shutdown_timeout_s, settings.ledger.busy_timeout_s)
    ledger += LEDGER_CLOSE_MIN_S
    return drain + ledger + ENGINE_STOP_S + 4 * AUX_STOP_S + AUDIT_STOP_S  # + quotas' stop


async def bounded(step: Any, timeout_s: float, part: str) -> None:
    """Await one shutdown step for at most ``timeout_s``; a step that fails or hangs is logged
    and left behind, so that the steps after it (the ledger's close) still run."""
    try:
        await asyncio.wait_for(step, timeout_s)
    except TimeoutError:
        log.error("stop_step_timeout", part=part, waited_s=timeout_s)
    except Exception as exc:  # noqa: BLE001 - the ledger must still be closed
        log.error("stop_step_failed", part=part, error=type(exc).__name__)


async def shutdown(
    settings: Settings,
    *,
    ledger: Ledger,
    auth: Authenticator,
    upstream: Upstream,
    engine: LocalEngine | None,
    router: Router | None,
    audit: AuditRunner | None = None,
) -> None:
    """Let the audits in flight end (bounded: the rest are cancelled), flush the ledger, stop
    the router, the engine (``None``: not the app's to stop), the upstream client and the key
    store (each bounded), then close the ledger, spilling what a locked database would not
    take."""
    if audit is not None:
        await bounded(audit.close(AUDIT_STOP_S), AUDIT_STOP_S + 0.5, "audit")
    budget = settings.ledger.shutdown_timeout_s
    started = time.monotonic()
    flushed = await ledger.flush(budget)
    spent = time.monotonic() - started
    if router is not None:
        await bounded(router.close(), AUX_STOP_S, "router")
    if engine is not None:
        await bounded(engine.stop(), ENGINE_STOP_S, "engine")
    await bounded(upstream.aclose(), AUX_STOP_S, "upstream")
    await bounded(auth.stop(), AUX_STOP_S, "auth")
    await ledger.close(max(LEDGER_CLOSE_MIN_S, budget - spent))
    log.info(
        "stopped",
        ledger_rows_written=ledger.written,
        ledger_flushed=flushed,
        ledger_rows_spilled=ledger.spilled,
        ledger_rows_lost=ledger.lost,
    )
