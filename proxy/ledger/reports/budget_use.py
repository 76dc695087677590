"""Each client key's monthly budget and its use, for ``frugal report --by key``.

The budget is the key's as stored now (``api_keys.monthly_budget_pusd``, set by ``frugal keys
create --monthly-budget-usd``); its use is what :mod:`proxy.ledger.tenants.budgets` counted against
it in one UTC month (``key_spend``): the real API spend plus the audit spend of that month, across
every replica that shares the ledger. Reservations of requests still in flight are not spend
and are left out. Keys without a budget, and ledgers from before budgets (migration 0008),
have no entry.
"""

from __future__ import annotations

from decimal import ROUND_HALF_EVEN, Decimal
from typing import Any

from proxy.ledger.db import access
from proxy.ledger.pricing import PICO


def budget_use(conn: access.Connection, month: str) -> dict[str, dict[str, Any]]:
    """Key name → its budget fields for the report's groups, in ``month`` (``YYYY-MM``)."""
    if "monthly_budget_pusd" not in conn.columns("api_keys"):
        return {}
    budgets = conn.query(
        "SELECT name, monthly_budget_pusd FROM api_keys WHERE monthly_budget_pusd IS NOT NULL"
    )
    if not budgets:
        return {}
    spent = dict(conn.query("SELECT key_name, spent_pusd FROM key_spend WHERE month = ?", (month,)))
    out: dict[str, dict[str, Any]] = {}
    for name, budget in budgets:
        used = int(spent.get(name) or 0)
        budget = int(budget)
        out[str(name)] = {
            "budget_month": month,
            "monthly_budget_usd": _money(budget),
            "budget_spent_usd": _money(used),
            "budget_left_usd": _money(max(budget - used, 0)),
            "budget_used_share": round(used / budget, 4) if budget else None,
        }
    return out


def _money(pico: int) -> Decimal:
    """Pico-dollars as USD, rounded half-even to the micro-dollar, as the report writes money."""
    return (Decimal(pico) / PICO).quantize(Decimal("0.000001"), rounding=ROUND_HALF_EVEN)
