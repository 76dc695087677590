"""The services one running app shares, typed: what handlers and middleware are given.

:class:`Services` is built once, by the lifespan in :mod:`proxy.server.lifespan`, after every part
has started, and kept on ``app.state.services``. It is frozen: a part is never swapped while the app
serves. Handlers receive it when they are made; middleware are made before the lifespan runs, so
they look it up per request with :func:`services_in` (``None`` until the lifespan has built it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from proxy.serving.body_check import BodyChecker

if TYPE_CHECKING:
    from proxy.audit.runner import AuditRunner
    from proxy.config import Settings
    from proxy.engine.local_engine import LocalEngine
    from proxy.ledger.pricing import PriceBook
    from proxy.ledger.writing.writer import Ledger
    from proxy.routing.router import Router
    from proxy.serving.background_responses import BackgroundResponses
    from proxy.serving.batches_state import BatchesState
    from proxy.serving.clients import Authenticator
    from proxy.serving.in_flight import InFlight
    from proxy.serving.metrics import Metrics
    from proxy.serving.quotas import Quotas
    from proxy.serving.responses_state import ResponsesState
    from proxy.upstream.client import Upstream


@dataclass(frozen=True, slots=True, kw_only=True)
class Services:
    """Everything a request may use: settings, the ledger, the API client, the engine, ..."""

    settings: Settings
    started_at: float  # time.time() when the app started serving (for /v1/models, /healthz)
    prices: PriceBook
    ledger: Ledger
    auth: Authenticator
    upstream: Upstream
    engine: LocalEngine
    router: Router
    metrics: Metrics
    in_flight: InFlight
    audit: AuditRunner | None = None  # shadow audits (docs/audit.md); None: not running
    quotas: Quotas | None = None  # key budgets, limits and the response cache (issue 19)
    responses: ResponsesState | None = None  # stored Responses (issue 26); None: not kept
    batches: BatchesState | None = None  # files and batches (issue 41); None: not served
    background: BackgroundResponses | None = None  # background responses (issue 41)
    bodies: BodyChecker = field(default_factory=BodyChecker)  # large bodies checked off the loop
