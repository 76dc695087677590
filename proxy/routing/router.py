"""The cascade policy: which route a request takes, and whether a local answer is good enough.

    plan()          forced route, model alias ``local``, or a feature the engine lacks;
                    the local backend with the lowest predicted finish (``proxy.routing``),
                    ``context_overflow`` when the prompt certainly cannot fit it, and
                    ``predicted_slow`` when even that one cannot make the deadline;
                    ``predicted_reject`` when the pre-router (``prerouter.py``, [router]
                    prereject) predicts the local answer would be rejected.
                    Definite reasons (forced, unsupported, context_overflow) always win over
                    the predicted one.
    try_local()     run that backend before the deadline; classify what came back
    accept?         score >= threshold  -> local;  otherwise the API, when there is one

The deadline is the backend's (``[local] timeout_s``, or a remote backend's own), except for
deferred work. A batch line is planned with its batch's window (``plan(..., window_s=)``) as its
deadline and runs in the engine's ``deferred`` priority class (``Plan.priority``), which yields to
interactive requests. A request with ``service_tier: "flex"`` (:func:`deferred_tier`) said that slow
is fine, and gets ``[batch] flex_timeout_s`` instead, both for the ``predicted_slow`` check and
for the attempt itself; the objective "latency" does not send it to a faster API either. So
does a background response (``Router.plan(..., deferred=True)``), which also runs as the engine's
deferred class (:attr:`Plan.priority`, ``proxy/engine/priority.py``): it yields its place to
interactive requests.

The router knows nothing of HTTP; ``proxy.serving.chat`` turns its decisions into answers.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from prometheus_client.core import Metric

from proxy.config import Settings
from proxy.engine.fair_queue import KEYLESS, share_label
from proxy.engine.local_engine import LocalEngine
from proxy.engine.priority import DEFERRED, INTERACTIVE
from proxy.errors import BadRequest, EngineError
from proxy.protocol.params import LOCAL_ALIAS
from proxy.routing.base import Choice
from proxy.routing.estimator import Prediction, Predictor
from proxy.routing.pool import BackendPool
from proxy.routing.prerouter import PreRouter
from proxy.routing.reasons import Reason
from proxy.routing.servable import local_blocker

ROUTE_HEADER = "x-frugal-route"
FLEX = "flex"  # service_tier: OpenAI's "slow is fine, at the flex price"
DEFERRED_TIERS = frozenset({FLEX})
"""The ``service_tier`` values that make a request deferred work (the batch tier joins them)."""


def deferred_tier(body: dict[str, Any]) -> str | None:
    """The tier ``body`` asks for when it is deferred work (``flex``), else None: what its
    ledger row's ``deferred_tier`` says, and what gives it the long local deadline."""
    tier = body.get("service_tier")
    return tier if isinstance(tier, str) and tier in DEFERRED_TIERS else None


@dataclass(frozen=True, kw_only=True)
class Plan:
    route: str  # "local" first, or "api" straight away
    reason: Reason | None  # why it was pre-routed to the API; None for a local attempt
    local_only: bool  # the client asked for the local model: never fall back
    forced: bool = False
    choice: Choice | None = None  # the local backend picked, with its predicted finish
    share: str = KEYLESS  # the client key's label: whose turn a local attempt waits in
    priority: str = (
        INTERACTIVE  # the engine's class: "deferred" for a batch line or a background response
    )


@dataclass(kw_only=True)
class LocalAttempt:
    completion: dict[str, Any] | None = None
    reason: Reason = Reason.LOCAL_ERROR  # until it ran: accepted | low_quality | local_timeout ...
    quality: float | None = None
    quality_reasons: list[str] = field(default_factory=list)
    error: str | None = None
    elapsed_ms: float = 0.0
    choice: Choice | None = None  # where it ran (another backend if its own went down)
    prediction: Prediction | None = None  # the prediction it was routed on
    actual_s: float | None = None  # when it ran to its end where predicted

    @property
    def accepted(self) -> bool:
        return self.reason == Reason.ACCEPTED


class Router:
    def __init__(self, settings: Settings, engine: LocalEngine, fallback_enabled: bool) -> None:
        self.settings = settings
        self.engine = engine
        self.fallback_enabled = fallback_enabled
        self.predictor = Predictor(settings.router)
        self.pool = BackendPool.build(settings, engine, self.predictor.lengths)
        self.prerouter = PreRouter(settings.quality.weights_path, enabled=settings.router.prereject)
        # [quality] target_precision: the threshold picked from the audits (proxy.audit, which
        # sets it); None while the configured thresholds are in force.
        self._in_force: float | None = None

    async def start(self) -> None:
        """Probe the remote backends and learn answer lengths from the ledger (background)."""
        await self.pool.start()
        if not self.settings.ledger.url.lower().startswith("postgres"):
            # Seeded from a SQLite ledger only; on PostgreSQL it learns from live requests.
            self.predictor.start(self.settings.ledger.path)

    async def close(self) -> None:
        await self.predictor.close()
        await self.pool.close()

    def plan(
        self,
        body: dict[str, Any],
        forced_header: str | None,
        *,
        client: str | None = None,
        window_s: float | None = None,
        deferred: bool = False,
    ) -> Plan:
        """The route of ``body``; ``client`` is the identity of the key that sent it (None:
        keyless), whose share of the local queue a local attempt waits in. ``window_s``: a
        batch line's seconds left in its batch's window, its local deadline (in place of any
        other). ``deferred``: deferred work however ``body`` asks (a background response), with
        flex's long deadline. Both run in the engine's ``deferred`` class; flex keeps its class."""
        share = share_label(client)
        yields = window_s is not None or deferred
        slow_ok = yields or deferred_tier(body) is not None
        planned = self._plan(body, forced_header, share, window_s, slow_ok)
        return replace(planned, share=share, priority=DEFERRED if yields else INTERACTIVE)

    def _plan(
        self,
        body: dict[str, Any],
        forced_header: str | None,
        share: str,
        window_s: float | None,
        deferred: bool,
    ) -> Plan:
        model = body["model"]
        local_only = model == LOCAL_ALIAS
        forced = (forced_header or "").strip().lower()
        if forced and forced not in ("local", "api"):
            raise BadRequest(
                f"header '{ROUTE_HEADER}' must be 'local' or 'api', got {forced_header!r}",
                param=ROUTE_HEADER,
            )
        if forced == "api" and local_only:
            raise BadRequest(
                f"model 'local' cannot be sent to the API ({ROUTE_HEADER}: api)", param="model"
            )
        if forced == "api":
            return Plan(route="api", reason=Reason.FORCED, local_only=False, forced=True)
        blocker = local_blocker(body, thinks=self.pool.thinks())
        if blocker is not None:
            if local_only or forced == "local":
                raise BadRequest(
                    f"the local model cannot serve this request ({blocker})",
                    param="model",
                    code="unsupported_locally",
                )
            return Plan(route="api", reason=Reason.UNSUPPORTED, local_only=False)
        kind = "chat" if "messages" in body else "complete"
        choice = self._deadline(self.pool.choose(body, kind, share), window_s, deferred)
        # Definite reasons win over predicted ones: a prompt that cannot fit is not "slow".
        overflow = choice.backend.cannot_fit(body)
        if overflow is not None and not (local_only or forced == "local"):
            if self.fallback_enabled:
                return Plan(
                    route="api", reason=Reason.CONTEXT_OVERFLOW, local_only=False, choice=choice
                )
        if forced == "local":
            return Plan(route="local", reason=None, local_only=True, forced=True, choice=choice)
        if (
            not local_only
            and self.fallback_enabled
            and choice.backend.admits(body, kind)  # a full queue says so itself: local_busy
            and self.predictor.too_slow(
                choice.prediction.seconds,
                choice.timeout_s,
                deferred=deferred,
            )
        ):
            return Plan(route="api", reason=Reason.PREDICTED_SLOW, local_only=False, choice=choice)
        if (
            not local_only
            and self.fallback_enabled
            and kind == "chat"
            and self.prerouter.predicted_reject(body)
        ):
            return Plan(
                route="api", reason=Reason.PREDICTED_REJECT, local_only=False, choice=choice
            )
        return Plan(
            route="local", reason=None, local_only=local_only, forced=local_only, choice=choice
        )

    def _deadline(self, choice: Choice, window_s: float | None, deferred: bool) -> Choice:
        """``choice`` with the seconds a request may wait for its local answer: a batch line's
        ``window_s``, ``[batch] flex_timeout_s`` for other ``deferred`` work, else the
        backend's own."""
        if window_s is not None:
            return replace(choice, timeout_s=window_s)
        if not deferred:
            return choice
        return replace(choice, timeout_s=self.settings.batch.flex_timeout_s)

    def set_threshold_in_force(self, value: float | None) -> None:
        """The threshold a target precision picked from the audits (above 1: accept nothing),
        or None to go back to the configured ones."""
        self._in_force = value

    def threshold(self, header: str | None, model: str) -> float:
        """The bar a local answer must reach: the ``x-frugal-min-quality`` header, else the
        threshold a target precision picked (:meth:`set_threshold_in_force`), else the
        requested model's ``[quality.models]`` entry, else ``[quality] threshold``."""
        if header is None:
            if self._in_force is not None:
                return self._in_force
            quality = self.settings.quality
            return quality.models.get(model, quality.threshold)
        try:
            value = float(header)
        except ValueError:
            value = -1.0
        if not 0.0 <= value <= 1.0:
            raise BadRequest(
                "header 'x-frugal-min-quality' must be a number between 0 and 1",
                param="x-frugal-min-quality",
            )
        return value

    async def try_local(
        self,
        body: dict[str, Any],
        *,
        threshold: float,
        on_token: Callable[[str], None] | None = None,
        kind: str = "chat",
        plan: Plan | None = None,
    ) -> LocalAttempt:
        """Ask the backend ``plan`` picked (or the best one now); ``kind="complete"`` for a
        legacy text completion."""
        started = time.perf_counter()
        choice = plan.choice if plan is not None and plan.choice is not None else None
        choice = choice or self._deadline(
            self.pool.choose(body, kind), None, deferred_tier(body) is not None
        )
        deadline = time.monotonic() + choice.timeout_s
        attempt = LocalAttempt(choice=choice, prediction=choice.prediction)
        try:
            # A batch line or a background response runs as the engine's deferred class
            # (Plan.priority): it yields to interactive work.
            completion, attempt.choice = await self.pool.run(
                body,
                choice,
                deadline=deadline,
                on_token=on_token,
                kind=kind,
                share=plan.share if plan is not None else KEYLESS,
                priority=plan.priority if plan is not None else INTERACTIVE,
            )
        except EngineError as exc:
            attempt.reason = Reason(exc.reason)  # the engine's own words, one of ours
            attempt.error = str(exc)
        else:
            attempt.completion = completion
            info = completion.get("frugal") or {}
            verdict = info.get("quality") or {}
            attempt.quality = verdict.get("value")
            attempt.quality_reasons = list(verdict.get("reasons") or [])
            if info.get("stop_cause") == "deadline":
                attempt.reason = Reason.LOCAL_TIMEOUT
            elif attempt.quality is not None and attempt.quality >= threshold:
                attempt.reason = Reason.ACCEPTED
            else:
                attempt.reason = Reason.LOW_QUALITY
        attempt.elapsed_ms = (time.perf_counter() - started) * 1000
        attempt.actual_s = self.predictor.learn(
            body,
            attempt.completion,
            predicted_s=choice.prediction.seconds,
            elapsed_s=attempt.elapsed_ms / 1000,
            comparable=attempt.choice is choice,
        )
        if attempt.actual_s is not None and choice.prediction.seconds is not None:
            self.pool.finished(choice.backend.name, choice.prediction.seconds, attempt.actual_s)
        return attempt

    def observe(self, row: dict[str, Any]) -> None:
        """A finished request's ledger row (the API's latency, for objective "latency")."""
        self.predictor.observe(row)

    def health(self) -> dict[str, Any]:
        return {**self.predictor.health(), "backends": self.pool.health()}

    def metrics(self) -> Iterator[Metric]:
        yield from self.predictor.metrics()
        yield from self.pool.metrics()
