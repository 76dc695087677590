"""The background audit of one request, and the threshold a target precision keeps in force.

:class:`AuditRunner` is made once per app (in :mod:`proxy.server.lifespan`) and is handed
every local attempt of a chat completion that produced an answer (:meth:`AuditRunner.offer`),
accepted or rejected alike. A drawn attempt is audited in the background, off the request path:

* **accepted** (:meth:`AuditRunner.shadow`): the client's answer is already on its way. The same
  request (allow-listed parameters, not streamed) goes to the API through the upstream client,
  the *shadow* call, and its answer is the reference;
* **rejected** (:meth:`AuditRunner.reference`): the API's answer the client got is the
  reference, at no extra cost. No API answer (the fallback failed) is a failed audit.

Then the exact check (:mod:`proxy.audit.verdict`), and only when it does not decide, one judge
call (:mod:`proxy.audit.judge`, through the same upstream client, ``judge_model`` or the
requested model). What the shadow and judge calls cost is priced with the ledger's
:class:`~proxy.ledger.pricing.PriceBook`, counted against the month's audit budget and stored
with the audit: money paid, never money saved. They are also paid from the budget of the client
key whose request was audited (``purse``, :class:`proxy.serving.quotas.AuditPurse`): the calls were
made for that key's requests, and they are paid the way a request's API call is. Each call's
worst case is held before it is made, and its real cost replaces the hold after; a key whose
budget cannot hold the call gets no audit (error ``over_budget``), so an audit never takes a
key past its limit. The gate's features are computed again here, in a thread, so that the
request path does not carry them. One row per audit goes to the ledger's writer
(:meth:`~proxy.ledger.writing.writer.Ledger.record_audit`); no text unless ``[server] log_content``.

With ``[quality] target_precision``, the runner keeps the router's threshold in force: the
choice of :func:`proxy.ledger.audits.threshold.choose_threshold` over the recent audits of this
local model, read from the ledger at start and brought up to date after every audit.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol, TypeVar

import structlog

from proxy.audit.judge import JudgeOutcome, ask_judge, judge_body
from proxy.audit.sampler import Sampler, Ticket, month_of
from proxy.audit.verdict import answer_text, exact_check
from proxy.config import Settings
from proxy.errors import ProxyError
from proxy.ledger.audits.audit_record import AuditRecord
from proxy.ledger.audits.table import read_rows, spend_pusd
from proxy.ledger.audits.threshold import ThresholdChoice, choose_threshold
from proxy.ledger.db import access
from proxy.ledger.db.location import Database
from proxy.ledger.pricing import PriceBook
from proxy.ledger.writing.writer import Ledger
from proxy.routing.prerouter import request_features
from proxy.routing.router import Router
from proxy.upstream.client import Upstream

log = structlog.get_logger(__name__)

WINDOW_S = 30 * 86400.0  # the threshold is read from the last 30 days of audits ...
WINDOW_AUDITS = 10_000  # ... at most this many, the newest
T = TypeVar("T")


class Purse(Protocol):
    """The budget an audit's calls are paid from, by the client key's name."""

    async def hold(self, key_name: str, body: dict[str, Any]) -> Any:
        """Hold the worst case of the API call ``body`` against the key's budget; returns what
        :meth:`pay` settles (None: the key has no budget). Raises a :class:`ProxyError` when
        the budget cannot hold it (spent, or its database unreachable)."""
        ...

    def pay(self, held: Any, cost_pusd: int) -> None:
        """The call's real cost (0: it failed) replaces the hold."""
        ...


@dataclass(frozen=True, kw_only=True)
class Case:
    """What the audit of one request needs (references to the request's own objects)."""

    request_id: str
    body: dict[str, Any]  # the validated chat request
    completion: dict[str, Any]  # the local answer, as the engine returned it
    accepted: bool
    score: float | None
    threshold: float
    key_name: str | None = None  # the client key whose request this is: its budget pays


class AuditRunner:
    """Draws, runs and records audits; keeps the threshold of a target precision in force."""

    def __init__(
        self,
        settings: Settings,
        *,
        upstream: Upstream,
        ledger: Ledger,
        prices: PriceBook,
        router: Router,
        database: Database,
        local_model: str,
        purse: Purse | None = None,
    ) -> None:
        self.settings = settings.audit
        self.target = settings.quality.target_precision or None
        self.configured = settings.quality.threshold
        self.log_content = settings.server.log_content
        self.judge_timeout_s = settings.fallback.timeout_s
        self.upstream = upstream
        self.ledger = ledger
        self.prices = prices
        self.router = router
        self.database = database
        self.local_model = local_model
        self.purse = purse
        self.sampler = Sampler(self.settings)
        self.failed = 0
        self.verdicts = {"correct": 0, "wrong": 0}
        self._window: deque[tuple[float, float, bool | None, float]] = deque(maxlen=WINDOW_AUDITS)
        self.choice = choose_threshold((), target_precision=self.target, configured=self.configured)

    # -- life cycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """Read this month's audit spend (the budget survives a restart) and, with a target
        precision, the recent audits the threshold is chosen from. A ledger that cannot be read
        leaves audits at zero spend and the configured threshold, and says so in the log."""
        try:
            spent, recent = await asyncio.to_thread(self._read_ledger)
        except Exception as exc:  # noqa: BLE001 - audits never stop the proxy from serving
            log.warning("audit_ledger_unread", error=type(exc).__name__)
            spent, recent = 0, []
        self.sampler = Sampler(self.settings, spent_pusd=spent)
        for row in recent:
            if row.get("score") is None:
                continue
            verdict = None if row.get("verdict") is None else bool(row["verdict"])
            self._window.append((float(row["ts"]), float(row["score"]), verdict, row["weight"]))
        self._choose()

    def _read_ledger(self) -> tuple[int, list[dict[str, Any]]]:
        now = time.time()
        month = datetime.strptime(month_of(now), "%Y-%m").replace(tzinfo=UTC).timestamp()
        with access.connect(self.database) as conn:
            spent = spend_pusd(conn, since=month, until=now + 1)
            recent: list[dict[str, Any]] = []
            if self.target is not None:
                recent = read_rows(
                    conn,
                    since=now - WINDOW_S,
                    until=now + 1,
                    local_model=self.local_model,
                    limit=WINDOW_AUDITS,
                )
        return spent, recent

    async def close(self, timeout_s: float = 5.0) -> None:
        """Wait a little for the audits in flight, cancel the rest (their rows are not written:
        an audit is a sample, and the shutdown must stay bounded)."""
        cancelled = await self.sampler.drain(timeout_s)
        if cancelled:
            log.info("audits_cancelled", audits=cancelled)

    # -- the draw ---------------------------------------------------------------------------

    def offer(self, *, accepted: bool) -> Ticket | None:
        """Whether this local attempt is audited; see :meth:`Sampler.offer`. No fallback API
        means no reference and no judge: nothing is drawn."""
        if not self.upstream.enabled:
            return None
        return self.sampler.offer(accepted=accepted)

    def give_back(self, ticket: Ticket) -> None:
        """A drawn audit that will not run (the request ended another way): its slot freed."""
        self.sampler.finish(ticket, 0)

    def shadow(self, ticket: Ticket, case: Case) -> None:
        """Audit an accepted answer: a shadow call to the API for the reference, in the
        background; returns at once."""
        self.sampler.submit(ticket, lambda: self._audit(ticket, case, None, shadow=True))

    def reference(self, ticket: Ticket, case: Case, reference: dict[str, Any] | None) -> None:
        """Audit a rejected answer against the API's answer the client got (None: there was
        none), in the background; returns at once."""
        self.sampler.submit(ticket, lambda: self._audit(ticket, case, reference, shadow=False))

    # -- one audit ---------------------------------------------------------------------------

    async def _audit(
        self, ticket: Ticket, case: Case, reference: dict[str, Any] | None, *, shadow: bool
    ) -> int:
        """Run the audit of ``case``; returns what it cost in pico-dollars (the sampler adds it
        to the month's spend), whatever its verdict. It never raises for a failed call."""
        model = str(case.body.get("model") or "")
        cost = 0
        error: str | None = None
        if shadow:
            paid = await self._paid(case, case.body, lambda: self._shadow(case))
            if paid is None:
                error = "over_budget"
            else:
                reply, spent = paid
                cost += spent
                if reply is None:
                    error = "shadow_failed"
                else:
                    reference = reply
        elif reference is None:
            error = "no_reference"
        features, kind = await asyncio.to_thread(_features, case.body, case.completion)
        candidate = answer_text(case.completion)
        ref_text = answer_text(reference) if reference is not None else ""
        verdict: bool | None = None
        method: str | None = None
        judge_model: str | None = None
        reason: str | None = None
        messages = list(case.body.get("messages") or [])
        correctness = self.settings.correctness
        if error is None and not ref_text:
            error = "empty_reference"
        if error is None:
            matched = exact_check(ref_text, candidate, correctness=correctness, request=messages)
            if matched is not None:
                verdict, method = True, "exact"
            else:
                judge_model = self.settings.judge_for(model)
                body = judge_body(
                    model=judge_model,
                    messages=messages,
                    reference=ref_text,
                    candidate=candidate,
                    correctness=correctness,
                )
                paid_judge = await self._paid(case, body, lambda: self._judge(case, body))
                method = "judge"
                if paid_judge is None:
                    error = "over_budget"
                else:
                    outcome, spent = paid_judge
                    cost += spent
                    if outcome.failed:
                        error = f"judge_{outcome.error}"
                        log.info(
                            "audit_judge_failed",
                            request_id=case.request_id,
                            error=outcome.error,
                            error_type=outcome.error_type or None,
                        )
                    else:
                        verdict, reason = outcome.correct, outcome.reason
        record = AuditRecord(
            accepted=case.accepted,
            verdict=verdict,
            weight=ticket.weight,
            request_id=case.request_id,
            ts=time.time(),
            requested_model=model,
            task_kind=kind,
            local_model=self.local_model,
            features=features,
            score=case.score,
            threshold=case.threshold,
            method=method,
            error=error,
            correctness=correctness,
            judge_model=judge_model,
            cost_pusd=cost,
            prompt=json.dumps(messages, ensure_ascii=False) if self.log_content else None,
            reference=ref_text or None,
            candidate=candidate,
            judge_reason=reason,
        )
        self.ledger.record_audit(record.row(log_content=self.log_content))
        self._learn(record)
        return cost

    async def _paid(
        self, case: Case, body: dict[str, Any], call: Callable[[], Awaitable[tuple[T, int]]]
    ) -> tuple[T, int] | None:
        """``call`` (which returns its result and what it cost), with its worst case held
        against the key's budget first and its real cost paid after, whatever happens; None
        when the budget cannot hold it (the call is not made)."""
        held = None
        if self.purse is not None and case.key_name:
            try:
                held = await self.purse.hold(case.key_name, body)
            except ProxyError as exc:
                log.info("audit_over_budget", request_id=case.request_id, code=exc.code)
                return None
        spent = 0
        try:
            result, spent = await call()
        finally:
            if self.purse is not None and case.key_name:
                self.purse.pay(held, spent)
        return result, spent

    async def _shadow(self, case: Case) -> tuple[dict[str, Any] | None, int]:
        """The shadow call: the API's answer (None: the call failed) and what it cost."""
        try:
            reply = await self.upstream.chat(case.body, request_id=case.request_id + ".audit")
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - a failed shadow call is a failed audit
            log.info("audit_shadow_failed", request_id=case.request_id, error=type(exc).__name__)
            return None, 0
        model = str(case.body.get("model") or "")
        return reply.body, self._price(model, reply.body.get("usage"))

    async def _judge(self, case: Case, body: dict[str, Any]) -> tuple[JudgeOutcome, int]:
        """The judge call: its outcome and what it cost."""
        outcome = await ask_judge(
            self._transport(case.request_id), body, timeout_s=self.judge_timeout_s
        )
        return outcome, self._price(str(body["model"]), outcome.usage)

    def _transport(self, request_id: str) -> Any:
        async def send(body: dict[str, Any]) -> dict[str, Any]:
            reply = await self.upstream.chat(body, request_id=request_id + ".judge")
            return reply.body

        return send

    def _price(self, model: str, usage: Any) -> int:
        """What one call cost, from its usage; 0 when unpriced (the price book logs that)."""
        if not isinstance(usage, dict):
            return 0
        try:
            prompt = int(usage.get("prompt_tokens") or 0)
            completion = int(usage.get("completion_tokens") or 0)
            cached = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
        except (TypeError, ValueError, AttributeError):
            return 0
        if not (0 <= prompt < 2**31 and 0 <= completion < 2**31 and 0 <= cached <= prompt):
            return 0
        return self.prices.cost(self.upstream.target(model), prompt, completion, cached) or 0

    # -- what the audits say ----------------------------------------------------------------

    def _learn(self, record: AuditRecord) -> None:
        if record.verdict is None:
            self.failed += 1
        else:
            self.verdicts["correct" if record.verdict else "wrong"] += 1
        if record.score is not None:
            self._window.append((record.ts, record.score, record.verdict, record.weight))
        self._choose()

    def _choose(self) -> None:
        """The threshold in force from the audits of the window, handed to the router."""
        if self.target is None:
            return
        horizon = time.time() - WINDOW_S
        while self._window and self._window[0][0] < horizon:
            self._window.popleft()
        choice = choose_threshold(
            ((s, v, w) for _, s, v, w in self._window),
            target_precision=self.target,
            configured=self.configured,
        )
        if choice.source != self.choice.source:
            log.warning(
                "threshold_in_force",
                threshold=choice.threshold,
                source=choice.source,
                why=choice.why,
            )
        self.choice = choice
        self.router.set_threshold_in_force(
            None if choice.source == "configured" else choice.threshold
        )

    def threshold_in_force(self) -> dict[str, Any]:
        """Which threshold is in force and why, for ``/healthz``."""
        return threshold_block(self.choice, self.target)

    def health(self) -> dict[str, Any]:
        """The ``audit`` block of ``/healthz``."""
        return {
            **self.sampler.health(),
            "correctness": self.settings.correctness,
            "judge_model": self.settings.judge_model or None,
            "verdicts": dict(self.verdicts),
            "failed": self.failed,
        }


def threshold_block(choice: ThresholdChoice, target: float | None) -> dict[str, Any]:
    """A threshold choice as ``/healthz`` and the report show it."""
    return {
        "value": choice.threshold,
        "source": choice.source,
        "why": choice.why,
        "target_precision": target,
        "audits": choice.n,
        "precision_low": choice.precision_low,
        "accepts_nothing": choice.source == "accept_nothing",
    }


def _features(body: dict[str, Any], completion: dict[str, Any]) -> tuple[dict[str, float], str]:
    """The gate's features of this answer (without the embedding signal, which needs the
    engine's model) and the request's task kind."""
    import quality
    from quality.combiner import default_combiner

    try:
        signals = quality.signals(body, completion)
        features = default_combiner().features(signals)
    except Exception as exc:  # noqa: BLE001 - an audit without features is still an audit
        log.warning("audit_features_failed", error=type(exc).__name__)
        return {}, "other"
    kind = next(
        (name[5:] for name, value in features.items() if name.startswith("task_") and value),
        "other",
    )
    merged = {k: float(v) for k, v in features.items()}
    # The request's own features, which the pre-router learns from (proxy/routing/prerouter.py).
    for name, value in request_features(body).items():
        merged.setdefault(name, value)
    return merged, kind
