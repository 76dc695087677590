"""The exchange's part in shadow audits (``docs/audit.md``): a local attempt offered to the
audits, and a drawn audit started when the exchange ends.

    offer(...)            a chat answer the cascade could have sent to the API, accepted or
                          rejected alike, offered to the sampler; a drawn one is kept on the
                          exchange (``ex.drew_audit``)
    start(ex, services)   the drawn audit started in the background, never awaited: a shadow
                          call for an accepted answer sent locally, the API's own answer as the
                          reference for a rejected one; the ticket given back when there is
                          nothing to grade
    offer_line(...)       a batch line's local answer (deferred work), offered and, when
                          drawn, its shadow call started at once, accepted or rejected

:class:`proxy.serving.cascade.Cascade` offers, :func:`proxy.serving.record.finish` starts; the
batch line's attempt (:class:`proxy.serving.batch_attempt.BatchAttempt`) offers its own. The
audits themselves run in :mod:`proxy.audit.runner`, off the request path.

Imports :mod:`proxy.audit.runner`, the router's types, the exchange and the batch line's asker.
"""

from __future__ import annotations

from typing import Any

from proxy.audit.runner import AuditRunner, Case
from proxy.routing.router import LocalAttempt, Plan, Router
from proxy.serving.batch_lines import Asker
from proxy.serving.exchange import Exchange
from proxy.serving.services import Services

# The endpoints whose local answers are audited: chat, and /v1/responses (its chat request).
AUDITED = frozenset({"chat.completions", "responses"})


def offer(
    services: Services,
    body: dict[str, Any],
    attempt: LocalAttempt,
    plan: Plan,
    threshold: float,
    ex: Exchange,
    *,
    accepted: bool,
) -> None:
    """Offer this local attempt to the shadow audits; a drawn one runs when the exchange ends
    (:func:`start`), in the background."""
    runner = services.audit
    completion = attempt.completion
    if (
        runner is None
        or ex.endpoint not in AUDITED
        or completion is None
        or attempt.quality is None
        or plan.local_only
        or not services.router.fallback_enabled
    ):
        return
    ticket = runner.offer(accepted=accepted)
    if ticket is None:
        return
    case = Case(
        request_id=ex.request_id,
        body=body,
        completion=completion,
        accepted=accepted,
        score=attempt.quality,
        threshold=threshold,
        key_name=ex.key_name,
    )
    ex.drew_audit(ticket, case)


def start(ex: Exchange, services: Services) -> None:
    """The exchange's drawn audit, started in the background (never awaited here)."""
    runner = services.audit
    assert ex.audit is not None and runner is not None
    drawn = ex.audit_started()
    ticket, case = drawn.ticket, drawn.case
    if case.accepted:
        if ex.route == "local":
            runner.shadow(ticket, case)
        else:
            runner.give_back(ticket)
        return
    if ex.status == 499:  # the client left: no answer of the API's to grade against
        runner.give_back(ticket)
        return
    reference = drawn.reference
    if reference is None and drawn.text and ex.status < 400 and ex.error is None:
        text = "".join(drawn.text)
        reference = {"choices": [{"message": {"role": "assistant", "content": text}}]}
    if ex.route != "api" or ex.status >= 400:
        reference = None
    runner.reference(ticket, case, reference)


def offer_line(
    runner: AuditRunner | None,
    body: dict[str, Any],
    attempt: LocalAttempt,
    plan: Plan,
    threshold: float,
    asker: Asker,
    *,
    router: Router,
) -> bool:
    """Offer a batch line's local attempt (its chat request ``body``) to the shadow audits, as
    :func:`offer` offers an interactive one, accepted or rejected alike, so that the gate's
    audit sees deferred work too and its sample stays unbiased. A drawn one gets its shadow call
    at once, whichever way the gate went (paid from the audits' budget and the line's key, as an
    interactive audit's is): a rejected line's own API answer comes from the upstream's batch,
    hours later, which an audit does not wait for. Whether an audit was drawn."""
    if (
        runner is None
        or attempt.completion is None
        or attempt.quality is None
        or plan.local_only
        or not router.fallback_enabled
    ):
        return False
    ticket = runner.offer(accepted=attempt.accepted)
    if ticket is None:
        return False
    case = Case(
        request_id=asker.line_id,
        body=body,
        completion=attempt.completion,
        accepted=attempt.accepted,
        score=attempt.quality,
        threshold=threshold,
        key_name=asker.key_name,
    )
    runner.shadow(ticket, case)
    return True
