"""The numbers of ``frugal report``: totals summed by the database, read in pico-dollars.

Every grouping, and the totals, are read from the daily rollup ``requests_daily`` (per UTC day,
model, client key, reason, route and outcome; triggers keep it equal to the sum of the rows); the
p95 of the latency tax is a sorted query on the partial index of the taxed rows. Money stays an
integer (pico-dollars) here and becomes a Decimal only in :func:`money`.
:mod:`proxy.ledger.reports.build` puts them together for a period.

Each query takes an optional key name (``key``): given one, it reads only that client key's
requests, which is how a client key's report is limited to its own figures.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from decimal import ROUND_HALF_EVEN, Decimal
from typing import Any

from proxy.ledger.db import access
from proxy.ledger.pricing import PICO
from proxy.ledger.reports.formats import plural

_MICRO = Decimal("0.000001")


@dataclass
class Totals:
    """The counts and money (pico-dollars) of one group of requests, or of the whole period."""

    requests: int = 0
    local: int = 0
    api: int = 0
    failed: int = 0
    paid: int = 0  # pico-dollars
    counterfactual: int = 0
    uncosted: int = 0
    tax_ms: float = 0.0
    taxed: int = 0
    fixed: int | None = None  # pico-dollars, where the fixed cost can be attributed
    reasons: dict[str, int] = field(default_factory=dict)

    def add(self, other: Totals) -> None:
        self.requests += other.requests
        self.local += other.local
        self.api += other.api
        self.failed += other.failed
        self.paid += other.paid
        self.counterfactual += other.counterfactual
        self.uncosted += other.uncosted
        self.tax_ms += other.tax_ms
        self.taxed += other.taxed
        for reason, n in other.reasons.items():
            self.reasons[reason] = self.reasons.get(reason, 0) + n

    @property
    def saved(self) -> int:
        return self.counterfactual - self.paid

    @property
    def answered(self) -> int:
        return self.local + self.api

    @property
    def local_share(self) -> float:
        return round(self.local / self.answered, 4) if self.answered else 0.0

    @property
    def tax_share(self) -> float:
        return round(self.taxed / self.answered, 4) if self.answered else 0.0

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "requests": self.requests,
            "local_requests": self.local,
            "api_requests": self.api,
            "failed_requests": self.failed,
            "unpriced_requests": self.uncosted,
            "local_share": self.local_share,
            "api_cost_usd": money(self.paid),
            "counterfactual_cost_usd": money(self.counterfactual),
            "saved_usd": money(self.saved),
        }
        if self.fixed is not None:
            out["fixed_cost_usd"] = money(self.fixed)
            out["net_saved_usd"] = money(self.saved - self.fixed)
        out["latency_tax_s"] = round(self.tax_ms / 1000, 3)
        out["latency_tax_requests"] = self.taxed
        out["latency_tax_share"] = self.tax_share
        return out


MAX_UNPRICED_MODELS = 100
"""Model names no request of which could be priced that a report names one by one; past them,
one ``other`` group. A client chooses the model name, so it could otherwise make a report of any
size (6,000 names made the plain report 3.6 MB)."""
OTHER_MODELS = "other"


def fold_unpriced(
    groups: dict[Any, Totals], limit: int = MAX_UNPRICED_MODELS
) -> tuple[dict[Any, Totals], int]:
    """The model groups with the unpriced names past the ``limit`` busiest (by requests, then
    name) summed into one group named :data:`OTHER_MODELS`; and how many names were folded.

    Unpriced: no request for the name has a counterfactual cost (it has no known price, or every
    request for it failed). Priced names are never folded: their savings are the report's point.
    A model really named ``other`` is summed into the group."""
    unpriced = [name for name, t in groups.items() if name is not None and t.counterfactual == 0]
    if len(unpriced) <= limit:
        return groups, 0
    unpriced.sort(key=lambda name: (-groups[name].requests, str(name)))
    folded = set(unpriced[limit:])
    out = {name: t for name, t in groups.items() if name not in folded}
    other = Totals()
    for name in (*folded, *((OTHER_MODELS,) if OTHER_MODELS in out else ())):
        other.add(groups[name])
    out[OTHER_MODELS] = other
    return out, len(folded)


def money(pico: int) -> Decimal:
    """Pico-dollars as exact decimal USD, rounded half-even to the micro-dollar."""
    return (Decimal(pico) / PICO).quantize(_MICRO, rounding=ROUND_HALF_EVEN)


# Every grouping reads the daily rollup (migrations 0002 and 0005: per UTC day, model, client
# key, reason, route and outcome), kept equal to the sum of the rows by triggers: a few thousand
# rows a month, however many requests there were.
ROLLUP_GROUP = {
    None: "NULL",
    "kind": "NULL",  # a quality grouping: requests have no task kind
    "model": "model",
    "day": "day",
    "key": "key_name",
    "reason": "reason",
}
ROLLUP = """
SELECT {group} AS grp, reason,
       SUM(requests),
       SUM(CASE WHEN route = 'local' THEN requests ELSE 0 END),
       SUM(CASE WHEN route = 'api' THEN requests ELSE 0 END),
       SUM(CASE WHEN failed = 1 THEN requests ELSE 0 END),
       SUM(api_cost_pusd),
       SUM(counterfactual_cost_pusd),
       SUM(uncosted),
       SUM(latency_tax_ms),
       SUM(taxed)
FROM requests_daily
WHERE day >= ? AND day < ?{key}
GROUP BY grp, reason
"""
KEY_CLAUSE = " AND key_name = ?"


def rollup_query(by: str | None, key: str | None = None) -> str:
    """The rollup read grouped ``by`` (a key of :data:`ROLLUP_GROUP`), of one key's rows when
    ``key`` is given (pass it after the days)."""
    return ROLLUP.format(group=ROLLUP_GROUP[by], key=_clause(key))


def _clause(key: str | None) -> str:
    return KEY_CLAUSE if key is not None else ""


def _params(bounds: tuple[Any, Any], key: str | None) -> tuple[Any, ...]:
    return (*bounds, key) if key is not None else tuple(bounds)


def _totals(sums: list[Any]) -> Totals:
    """One group's sums as read (requests, local, api, failed, paid, counterfactual, uncosted,
    tax_ms, taxed). int(): PostgreSQL sums BIGINTs as NUMERIC, which psycopg reads as Decimals."""
    n, local, api, failed, paid, cf, uncosted, tax_ms, taxed = sums
    return Totals(
        requests=int(n),
        local=int(local or 0),
        api=int(api or 0),
        failed=int(failed or 0),
        paid=int(paid or 0),
        counterfactual=int(cf or 0),
        uncosted=int(uncosted or 0),
        tax_ms=float(tax_ms or 0.0),
        taxed=int(taxed or 0),
    )


def aggregate(
    conn: access.Connection, query: str, days: tuple[int, int], key: str | None = None
) -> dict[Any, Totals]:
    groups: dict[Any, Totals] = {}
    for row in conn.query(query, _params(days, key)):
        key, reason, *sums = row
        part = _totals(sums)
        part.reasons = {reason: part.requests}
        groups.setdefault(key if key != "" else None, Totals()).add(part)
    return groups


def latency_p95(
    conn: access.Connection, bounds: tuple[float, float], taxed: int, key: str | None = None
) -> float:
    if not taxed:
        return 0.0
    rank = math.ceil(0.95 * taxed)
    clause = _clause(key)
    rows = conn.query(
        "SELECT latency_tax_ms FROM requests WHERE ts >= ? AND ts < ? AND latency_tax_ms > 0"
        f"{clause} ORDER BY latency_tax_ms LIMIT 1 OFFSET ?",
        (*_params(bounds, key), rank - 1),
    )
    return round(rows[0][0] / 1000, 3) if rows else 0.0


def prediction_error(
    conn: access.Connection, bounds: tuple[float, float], key: str | None = None
) -> tuple[float, int] | None:
    """Median absolute percentage error of the predicted local times (issue 6), over the local
    answers that ran to their end where predicted; None when there are none."""
    errors = sorted(
        abs(predicted - actual) / actual
        for predicted, actual in conn.query(
            "SELECT predicted_local_ms, actual_local_ms FROM requests WHERE ts >= ? AND ts < ? "
            "AND predicted_local_ms IS NOT NULL AND actual_local_ms IS NOT NULL "
            "AND actual_local_ms > 0" + _clause(key),
            _params(bounds, key),
        )
    )
    if not errors:
        return None
    mid = len(errors) // 2
    median = errors[mid] if len(errors) % 2 else (errors[mid - 1] + errors[mid]) / 2
    return round(median, 4), len(errors)


DEFERRED = """
SELECT deferred_tier, COUNT(*),
       SUM(CASE WHEN route = 'local' THEN 1 ELSE 0 END),
       SUM(CASE WHEN route = 'api' THEN 1 ELSE 0 END),
       SUM(CASE WHEN status >= 400 THEN 1 ELSE 0 END),
       SUM(api_cost_pusd),
       SUM(counterfactual_cost_pusd),
       SUM(CASE WHEN status < 400 AND counterfactual_cost_pusd IS NULL THEN 1 ELSE 0 END),
       SUM(latency_tax_ms),
       SUM(CASE WHEN latency_tax_ms > 0 THEN 1 ELSE 0 END)
FROM requests
WHERE ts >= ? AND ts < ? AND deferred_tier IS NOT NULL{key}
GROUP BY deferred_tier
"""


def deferred_work(
    conn: access.Connection, bounds: tuple[float, float], key: str | None = None
) -> dict[str, Any]:
    """Deferred work apart (issue 41): the period's rows marked with a ``deferred_tier``,
    summed as a group of the report is (its requests, local share, cost and saving), and
    their count by tier. They are a part of the totals, never added to them again.

    Read from the rows themselves (the rollup has no such column), through the partial index
    ``requests_deferred``: only the deferred rows of the period are read."""
    total = Totals()
    tiers: dict[str, int] = {}
    for row in conn.query(DEFERRED.format(key=_clause(key)), _params(bounds, key)):
        tier, *sums = row
        part = _totals(sums)
        total.add(part)
        tiers[str(tier)] = part.requests
    return {**total.as_dict(), "tiers": dict(sorted(tiers.items()))}


def cost_warnings(
    conn: access.Connection, days: tuple[int, int], key: str | None = None
) -> list[str]:
    out: list[str] = []
    clause = _clause(key)
    rows = conn.query(
        "SELECT model, SUM(uncosted) - SUM(uncounted), SUM(uncounted) FROM requests_daily "
        f"WHERE day >= ? AND day < ?{clause} GROUP BY model HAVING SUM(uncosted) > 0 "
        "ORDER BY 2 DESC, model",
        _params(days, key),
    )
    no_usage = 0
    more_models = more_requests = 0
    for model, unpriced_n, uncounted_n in rows:
        unpriced, uncounted = int(unpriced_n), int(uncounted_n)
        no_usage += uncounted
        if unpriced and len(out) >= MAX_UNPRICED_MODELS:  # the busiest are named, then a count
            more_models += 1
            more_requests += unpriced
        elif unpriced:
            out.append(
                f"{plural(unpriced, 'request')} for '{model}' not costed: no known price. "
                f'Add [pricing."{model}"] to the config to price new requests.'
            )
    if more_models:
        out.append(
            f"{plural(more_requests, 'request')} for {plural(more_models, 'other model')} not "
            "costed: no known price (the models are not named past the first "
            f"{MAX_UNPRICED_MODELS})."
        )
    if no_usage:
        out.append(
            f"{plural(no_usage, 'request')} not costed: the API reported no token usage "
            "(e.g. a stream cut mid-way)."
        )
    return out
