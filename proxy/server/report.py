"""``GET /v1/frugal/report``: ``frugal report --format json`` over HTTP, for the dashboard.

    GET /v1/frugal/report?month=YYYY-MM[&by=day|model|key|reason|kind]

The answer is the object that ``frugal report --config FILE --month M [--by B] --format json``
prints: the same :func:`proxy.ledger.reports.build.build` over the same ledger (``[ledger]``), with
the same fixed cost (``[costs]``) and quality settings, written by the same
:func:`proxy.ledger.reports.build.render`, so money leaves as exact six-decimal numbers here too
(``docs/report.md``). Without ``month`` it is this month so far, as in the CLI.

The build reads the ledger on a thread, at most :data:`REPORTS_AT_ONCE` at a time, so that the
event loop goes on serving while a report reads a large ledger. A month with no request is a
200 with the zero report (the CLI's exit code 4 is for scripts); a bad ``month`` or ``by`` is a
400 naming it; a ledger that cannot be read is a 503.

What it counts depends on who asks (:func:`proxy.serving.clients.own_key`): an admin key, and
anyone in keyless mode, reads the whole ledger; a client key reads its own requests only
(:class:`proxy.ledger.reports.build.KeyScope`), so no other key's name or figure is in what it is
sent.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from proxy.config import Settings
from proxy.errors import BadRequest, StatusError
from proxy.ledger.db.location import from_settings
from proxy.ledger.reports import build as report_mod
from proxy.models.gate_status import for_settings as gate_for_settings
from proxy.protocol.shapes import Schema, obj
from proxy.serving.clients import own_key
from quality.combiner import file_sha256

REPORTS_AT_ONCE = 2
BY = report_mod.GROUPINGS  # model, day, key, reason, and kind (the quality keys by task kind)

# -- its OpenAPI description (proxy/server/routes.py serves it; docs/report.md has every key) --

_MONEY: Schema = {"type": "number", "description": "USD, exact to the micro-dollar"}
_SHARE: Schema = {"type": "number", "minimum": 0, "maximum": 1}
_COUNT: Schema = {"type": "integer", "minimum": 0}
_TOTALS: Schema = {
    "requests": _COUNT,
    "local_requests": _COUNT,
    "api_requests": _COUNT,
    "failed_requests": _COUNT,
    "unpriced_requests": _COUNT,
    "local_share": _SHARE,
    "api_cost_usd": _MONEY,
    "counterfactual_cost_usd": _MONEY,
    "saved_usd": _MONEY,
    "fixed_cost_usd": _MONEY,
    "net_saved_usd": _MONEY,
    "latency_tax_s": {"type": "number", "minimum": 0},
    "latency_tax_requests": _COUNT,
    "latency_tax_share": _SHARE,
}
_GROUP: Schema = obj(
    ["requests", "api_cost_usd", "counterfactual_cost_usd", "saved_usd"],
    {**_TOTALS, **{name: {"type": ["string", "null"]} for name in BY}},
)
REPORT: Schema = obj(
    [
        "month",
        "from",
        "to",
        *_TOTALS,
        "latency_tax_p95_s",
        "reasons",
        "warnings",
        "audit_cost_usd",
        "audits",
        "audited_precision",
        "audited_precision_ci",
        "threshold_in_force",
    ],
    {
        "month": {"type": "string"},
        "from": {"type": "string", "format": "date"},
        "to": {"type": "string", "format": "date"},
        **_TOTALS,
        "latency_tax_p95_s": {"type": "number", "minimum": 0},
        "reasons": {"type": "object", "additionalProperties": _COUNT},
        "warnings": {"type": "array", "items": {"type": "string"}},
        "audit_cost_usd": _MONEY,
        "audits": _COUNT,
        "audited_precision": {"type": ["number", "null"]},
        "audited_precision_ci": {
            "type": ["array", "null"],
            "items": {"type": "number"},
            "minItems": 2,
            "maxItems": 2,
        },
        "threshold_in_force": {"type": "number"},
        "by": {"enum": list(BY)},
        "groups": {"type": "array", "items": _GROUP},
        "quality_groups": {"type": "array", "items": {"type": "object"}},
    },
)
PARAMETERS: list[Schema] = [
    {
        "name": "month",
        "in": "query",
        "required": False,
        "description": "The UTC month, YYYY-MM; this month so far when left out.",
        "schema": {"type": "string", "pattern": "^[0-9]{4}-(0[1-9]|1[0-2])$"},
    },
    {
        "name": "by",
        "in": "query",
        "required": False,
        "description": "Add `groups`, one per model, day, client key (its name) or routing "
        "reason; `kind` adds `quality_groups` (the audits by task kind).",
        "schema": {"enum": list(BY)},
    },
]


class ReportEndpoint:
    """``GET /v1/frugal/report`` for one app's settings (:meth:`get` is the route's handler)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._slots = asyncio.Semaphore(REPORTS_AT_ONCE)
        self._sha256: tuple[str, str] | None = None  # (model path, its SHA-256)

    async def get(self, request: Request) -> Response:
        query = request.query_params
        now = datetime.now(UTC)
        month = query.get("month")
        try:
            period = report_mod.Period.month(month, now)
        except report_mod.ReportError:
            raise BadRequest(
                f"Invalid 'month': {month!r}. Expected YYYY-MM with a month from 01 to 12, "
                "e.g. 2026-11.",
                param="month",
            ) from None
        by = query.get("by")
        if by is not None and by not in BY:
            raise BadRequest(
                f"Invalid 'by': {by!r}. Expected one of {', '.join(BY)}, or no 'by'.",
                param="by",
            )
        key = own_key(request.scope)
        only = None if key is None else report_mod.KeyScope(key.name, key.created_at)
        async with self._slots:
            data = await asyncio.to_thread(self._build, period, by, now, only)
        return Response(
            report_mod.render(data, "json"),
            media_type="application/json",
            headers={"cache-control": "no-store"},
        )

    def _build(
        self,
        period: report_mod.Period,
        by: str | None,
        now: datetime,
        only: report_mod.KeyScope | None = None,
    ) -> dict[str, Any]:
        """What ``frugal report --config FILE`` builds (see ``proxy.cli``), on this thread."""
        settings = self.settings
        try:
            data = report_mod.build(
                from_settings(settings.ledger),
                period,
                settings.costs.monthly_fixed_usd,
                by=by,
                now=now,
                target_precision=settings.quality.target_precision or None,
                threshold=settings.quality.threshold,
                only=only,
            )
        except report_mod.ReportError as exc:
            raise StatusError(503, f"The ledger cannot be read now: {exc}") from exc
        gate = gate_for_settings(settings, self._model_sha256) if only is None else None
        if gate is not None and not gate.bundled:  # as frugal report prints it
            data["gate"] = gate.as_dict()
        return data

    def _model_sha256(self, path: str) -> str:
        """The served model file's SHA-256, hashed once (the file does not change under it)."""
        if self._sha256 is None or self._sha256[0] != path:
            self._sha256 = (path, file_sha256(path))
        return self._sha256[1]
