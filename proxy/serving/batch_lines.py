"""What the batch runner needs to know of one line: how its local attempt is asked for and
answered, how it is billed, and how its upstream call is reserved against the key's budget.

**The local attempt.** The runner does not know the cascade: it is handed a
:class:`LocalAttempt`, a callable ``(url, body, deadline=, priority=)`` that runs the line the
way an interactive request's local attempt runs (its plan, the engine, the gate against
``[quality]``) and answers one of three things:

- :class:`Accepted`: the local answer passed the gate; its status (200), its body as the
  endpoint answers it, and its usage;
- :class:`Rejected`: the local model answered and the gate refused it (``reason``, one of the
  router's reasons: ``low_quality``, ``local_error``...);
- :class:`CannotServe`: the local model cannot serve the line at all (embeddings, images,
  built-in tools, a prompt past its context): ``reason`` says which.

``deadline`` is a unix time: the batch's window, not ``[local] timeout_s``. ``priority`` is
``"deferred"``: the hook for the engine's priority class, which lets interactive requests go
first; an attempt that does not know it yet ignores it. ``asker`` (an :class:`Asker`) says
whose line it is: the batch owner's key, whose share of the local queue the attempt waits in
(the engine's per-key fair share, as the key's interactive requests do), and whose budget pays
the line's shadow audit, if one is drawn (:func:`proxy.serving.shadow.offer_line`).

**Billing.** :func:`local_row` and :func:`api_row` make a line's :class:`LedgerRow`, marked
``deferred_tier`` ``batch``. A line answered locally is priced at the ``batch`` tier, so that
the report counts it as saving what the provider's Batch API would have charged; a line
answered by the API at the tier its call was billed at (``LineResult.tier``): ``batch`` in an
upstream batch, ``flex`` or the standard rate when it went as its own call. The store writes
the row in the transaction that writes the line's result
(:meth:`proxy.ledger.batches.store.BatchStore.finish`), once.

**Budgets.** A :class:`Purse` reserves a line's worst case before it is sent upstream and
settles it with what the line cost. :class:`LedgerPurse` is the ledger's own
(:class:`proxy.ledger.tenants.budgets.Budgets`), at the rate of the tier the line's call may
be billed at (``tier_of``: the batch rate, unless it may go as its own call); a line past its key's
budget gets OpenAI's ``insufficient_quota`` error as its result (:func:`over_budget`), as an
interactive request gets a 429. A reservation lives while its line waits for the upstream (the
runner's ticker calls :meth:`Purse.renew`, every third of ``[batch] line_lease_s``: a purse's
``ttl_s`` must be at least that), and expires if the runner dies, as the interactive path's do.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from proxy.ledger.batches.objects import Line, LineResult
from proxy.ledger.pricing import PriceBook
from proxy.ledger.tenants.budgets import Budgets, Reservation
from proxy.ledger.writing.ledger_row import LedgerRow
from proxy.upstream.batch_api import LineResult as UpstreamResult

TIER = "batch"
"""The tier a batch line is priced at: the provider's Batch API rate."""
PRIORITY = "deferred"
"""The engine's priority class for batch lines (passed through to the local attempt)."""
ENDPOINT_NAMES = {
    "/v1/chat/completions": "chat.completions",
    "/v1/completions": "completions",
    "/v1/responses": "responses",
    "/v1/embeddings": "embeddings",
}
"""A line's ``url`` and the ledger's name of its endpoint."""
DEFAULT_COMPLETION_TOKENS = 4096
"""Completion tokens reserved for a line that names no ``max_tokens`` (or its kin)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Accepted:
    status_code: int
    body: dict[str, Any]
    usage: dict[str, Any] | None = None
    local_ms: float = 0.0
    local_model: str | None = None
    # the counterfactual (prompt, completion) tokens, the requested model's count, when the
    # cascade has it; None: the local model's usage stands in, as the writer does
    counted: tuple[int, int] | None = None
    # the ledger row's reason: "accepted" by the gate, "no_fallback" (kept with no API to send
    # it to), "bad_request" (the line's own 400, answered as its endpoint answers it)
    reason: str = "accepted"


@dataclass(frozen=True, kw_only=True, slots=True)
class Rejected:
    reason: str
    local_ms: float = 0.0


@dataclass(frozen=True, kw_only=True, slots=True)
class CannotServe:
    reason: str


Attempted = Accepted | Rejected | CannotServe


@dataclass(frozen=True, kw_only=True, slots=True)
class Asker:
    """Whose line it is: ``client``, the identity of the key that made the batch (None: the
    keyless proxy); ``key_name``, that key's name (None: no key, or one revoked since); and
    ``line_id``, the line's id (its ledger row's request id, and its audit's)."""

    client: str | None = None
    key_name: str | None = None
    line_id: str = ""


class LocalAttempt(Protocol):
    async def __call__(
        self,
        url: str,
        body: dict[str, Any],
        *,
        deadline: float,
        priority: str,
        asker: Asker | None = None,
    ) -> Attempted: ...


def _tokens(usage: dict[str, Any] | None, *names: str) -> int | None:
    for name in names:
        value = (usage or {}).get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
    return None


def _model(line: Line) -> str | None:
    model = line.body.get("model")
    return model if isinstance(model, str) else None


def local_row(line: Line, answer: Accepted, *, key_name: str | None, started: float) -> LedgerRow:
    """The ledger row of a line the local model answered, at the batch tier."""
    usage = answer.usage
    prompt = _tokens(usage, "prompt_tokens", "input_tokens")
    completion = _tokens(usage, "completion_tokens", "output_tokens")
    return LedgerRow(
        request_id=line.id,
        ts=started,
        endpoint=ENDPOINT_NAMES.get(line.url, line.url),
        requested_model=_model(line),
        route="local",
        reason=answer.reason,
        status=answer.status_code,
        prompt_tokens=prompt,
        completion_tokens=completion,
        local_prompt_tokens=prompt,
        local_completion_tokens=completion,
        latency_ms=(time.time() - started) * 1000.0,
        local_ms=answer.local_ms,
        key_name=key_name,
        local_model=answer.local_model,
        service_tier=TIER,
        deferred_tier=TIER,
    )


def api_row(
    line: Line,
    result: UpstreamResult,
    *,
    reason: str,
    key_name: str | None,
    started: float,
    attempts: int,
) -> LedgerRow:
    """The ledger row of a line the upstream answered (or refused), priced from its usage at
    the tier its call was billed at: the batch tier for a line of an upstream batch, the flex
    or the standard rate for one sent as its own call (``[batch] fallback``, or a provider
    with no Batch API)."""
    usage = result.usage
    model = result.body.get("model")
    return LedgerRow(
        request_id=line.id,
        ts=started,
        endpoint=ENDPOINT_NAMES.get(line.url, line.url),
        requested_model=_model(line),
        route="api",
        reason=reason,
        status=result.status_code,
        prompt_tokens=_tokens(usage, "prompt_tokens", "input_tokens"),
        completion_tokens=_tokens(usage, "completion_tokens", "output_tokens"),
        latency_ms=(time.time() - started) * 1000.0,
        api_model=model if isinstance(model, str) else _model(line),
        key_name=key_name,
        upstream_attempts=attempts,
        service_tier=result.tier,
        deferred_tier=TIER,
        error=None if result.ok else "upstream_refused",
    )


def refused_row(
    line: Line, *, status: int, reason: str, error: str, key_name: str | None, started: float
) -> LedgerRow:
    """The ledger row of a line that ends with no answer (past its key's budget, never
    answered by the upstream): nothing billed, the line still counted."""
    return LedgerRow(
        request_id=line.id,
        ts=started,
        endpoint=ENDPOINT_NAMES.get(line.url, line.url),
        requested_model=_model(line),
        route="none",
        reason=reason,
        status=status,
        latency_ms=(time.time() - started) * 1000.0,
        key_name=key_name,
        service_tier=TIER,
        deferred_tier=TIER,
        error=error,
    )


def api_result(result: UpstreamResult) -> LineResult:
    return LineResult(
        status_code=result.status_code, request_id=result.request_id, body=result.body
    )


def failed(code: str, message: str) -> LineResult:
    """A line that ends without a response: in the batch's error file with ``code``."""
    return LineResult(error={"code": code, "message": message})


def over_budget(key_name: str) -> LineResult:
    """A line past its key's budget: OpenAI's 429 ``insufficient_quota``, as the interactive path
    answers it (the key's name, never its secret)."""
    message = f"The monthly budget of key {key_name!r} would be passed by this request."
    return LineResult(
        status_code=429,
        body={
            "error": {
                "message": message,
                "type": "insufficient_quota",
                "param": None,
                "code": "insufficient_quota",
            }
        },
    )


class Purse(Protocol):
    """Reserves a line's worst case before it is sent upstream, settles it after."""

    def reserve(self, line: Line, key_name: str) -> Reservation | None | bool:
        """A reservation; ``True`` when the key has no budget (nothing to hold); ``None``
        when the line would pass the key's budget."""
        ...

    def settle(self, held: Reservation, line: Line, result: UpstreamResult | None) -> None: ...

    def renew(self) -> None:
        """Keep the reservations held alive (an upstream batch can run for hours)."""
        ...


class LedgerPurse:
    """:class:`Purse` on the ledger's budgets: ``budget_of(key_name)`` is the key's monthly
    budget in pico-dollars (None: unlimited); the worst case is the line's prompt, counted as
    its bytes (never fewer tokens than that), and its ``max_tokens`` (or
    :data:`DEFAULT_COMPLETION_TOKENS`), at its model's rate for the tier ``tier_of(url, body)``
    says its call may be billed at (the batch rate by default); settled at the tier it was."""

    def __init__(
        self,
        budgets: Budgets,
        prices: PriceBook,
        budget_of: Callable[[str], int | None],
        *,
        ttl_s: float,
        tier_of: Callable[[str, dict[str, Any]], str | None] = lambda url, body: TIER,
    ) -> None:
        self.budgets = budgets
        self.prices = prices
        self.budget_of = budget_of
        self.ttl_s = ttl_s
        self.tier_of = tier_of  # the tier a line's call is billed at at worst (its url, body)

    def worst_case(self, line: Line) -> int:
        price = self.prices.price(_model(line) or "", self.tier_of(line.url, line.body))
        if price is None:
            return 0
        prompt = len(json.dumps(line.body, ensure_ascii=False).encode("utf-8"))
        completion = DEFAULT_COMPLETION_TOKENS
        for name in ("max_completion_tokens", "max_tokens", "max_output_tokens"):
            value = line.body.get(name)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                completion = value
                break
        return prompt * price.input + completion * price.output

    def reserve(self, line: Line, key_name: str) -> Reservation | None | bool:
        budget = self.budget_of(key_name)
        if budget is None:
            return True
        return self.budgets.reserve(key_name, budget, self.worst_case(line), ttl_s=self.ttl_s)

    def settle(self, held: Reservation, line: Line, result: UpstreamResult | None) -> None:
        cost = 0
        usage = None if result is None else result.usage
        price = None if result is None else self.prices.price(_model(line) or "", result.tier)
        if usage is not None and price is not None:
            prompt = _tokens(usage, "prompt_tokens", "input_tokens") or 0
            completion = _tokens(usage, "completion_tokens", "output_tokens") or 0
            cost = prompt * price.input + completion * price.output
        self.budgets.settle(held, cost)

    def renew(self) -> None:
        self.budgets.renew(self.ttl_s)
