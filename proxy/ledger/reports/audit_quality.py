"""The quality section of ``frugal report``: what a period's audits say, as JSON-ready values.

:func:`quality_section` takes the ``audits`` rows the ledger read (:mod:`proxy.ledger.audits.table`;
plain dicts) and returns the report's keys:

    audits                      audits in the period, failed ones included
    audits_failed               audits without a verdict (a judge that gave none, no reference)
    audited_precision           weighted precision of accepted local answers (None: no audit)
    audited_precision_ci        its 95% Wilson interval [low, high] over the weighted counts
    acceptance_rate             weighted share of audited attempts the gate accepted
    rejected_but_correct_share  weighted share of rejected answers that were right
    target_precision            ``[quality] target_precision`` (None: not set)
    threshold_in_force          the threshold a target precision picks from these audits, or
                                the configured one; ``threshold_source`` and ``threshold_why``
                                say which and why (``accept_nothing``: no threshold reaches
                                the target, no local answer is accepted)
    quality_groups              the same shares per task kind or per requested model, with
                                ``by="kind"`` or ``by="model"``

``audit_cost_usd`` is the report's own (money, summed by the ledger). Pure: no I/O.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from proxy.ledger.audits.audit_record import AuditRecord
from proxy.ledger.audits.estimate import Estimate, Share, estimates
from proxy.ledger.audits.threshold import choose_threshold

_FIELDS = frozenset(AuditRecord.__dataclass_fields__)


def records_of(rows: Iterable[Mapping[str, Any]]) -> list[AuditRecord]:
    """The ledger's ``audits`` rows as :class:`AuditRecord` values."""
    out = []
    for row in rows:
        raw = {k: v for k, v in row.items() if k in _FIELDS}
        raw["accepted"] = bool(raw.get("accepted"))
        verdict = raw.get("verdict")
        raw["verdict"] = None if verdict is None else bool(verdict)
        features = raw.get("features")
        raw["features"] = json.loads(features) if isinstance(features, str) and features else {}
        for name in ("request_id", "requested_model", "local_model"):
            raw[name] = raw.get(name) or ""
        raw["task_kind"] = raw.get("task_kind") or "other"
        raw["weight"] = float(raw.get("weight") or 1.0)
        raw["cost_pusd"] = int(raw.get("cost_pusd") or 0)
        out.append(AuditRecord(**raw))
    return out


def _share(share: Share) -> float | None:
    return None if share.value is None else round(share.value, 4)


def _shares(estimate: Estimate) -> dict[str, Any]:
    precision = estimate.precision
    return {
        "audits": estimate.audits,
        "audits_failed": estimate.failed,
        "audited_precision": _share(precision),
        "audited_precision_ci": [round(precision.low, 4), round(precision.high, 4)],
        "acceptance_rate": _share(estimate.acceptance),
        "rejected_but_correct_share": _share(estimate.rejected_but_correct),
    }


def quality_section(
    rows: Iterable[Mapping[str, Any]],
    *,
    by: str | None = None,
    target_precision: float | None = None,
    threshold: float = 0.6,
) -> dict[str, Any]:
    """The report's quality keys over the period's ``rows``; see the module docstring."""
    records = records_of(rows)
    found = estimates(records)
    choice = choose_threshold(
        ((r.score, r.verdict, r.weight) for r in records if r.score is not None),
        target_precision=target_precision or None,
        configured=threshold,
    )
    out = _shares(found.overall)
    out["threshold_in_force"] = choice.threshold
    out["threshold_source"] = choice.source
    out["threshold_why"] = choice.why
    out["target_precision"] = target_precision or None
    if by in ("kind", "model"):
        groups = found.by_kind if by == "kind" else found.by_model
        out["quality_groups"] = [{by: name, **_shares(e)} for name, e in groups.items()]
    return out
