"""Monthly budgets per client key: reserve the worst case before an API call, settle after.

A key's month is one row of ``key_spend`` (``migrations/0008_budgets_cache.sql``): what it has
spent and what requests in flight have reserved, in pico-dollars. Every replica shares it on
PostgreSQL, so the budget holds across all of them:

- :meth:`Budgets.reserve` adds the request's worst-case cost to ``reserved_pusd`` with one
  conditional ``UPDATE ... WHERE spent + reserved + amount <= budget``. PostgreSQL locks the row
  and re-checks the condition against the committed values of a concurrent reservation (SQLite
  takes its write lock), so two replicas can never both take the last dollar. The reservation
  is also a row of ``budget_reservations`` with an expiry, in the same transaction.
- :meth:`Budgets.settle` deletes that row and moves its amount from reserved to the real cost
  (0 on failure), once: a reservation the sweep already released adds its cost only.
- :meth:`Budgets.sweep` releases expired reservations, those of a replica that crashed or of a
  request that outlived its expiry, so a key is never blocked by money it did not spend.
- An audit's shadow and judge calls are reserved and settled the same way
  (:class:`proxy.http.quotas.AuditPurse`): they count against the same budget.

Each method is blocking (run it in a thread) and raises
:class:`~proxy.ledger.db.connections.Unavailable` when the database is not there; the request path
then fails closed (no API call).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime

from proxy.ledger.db.connections import Pool, Tx


def month_of(ts: float) -> str:
    """The UTC month of a unix time, ``YYYY-MM``: budgets start again on the 1st."""
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m")


@dataclass(frozen=True, slots=True)
class Reservation:
    id: str
    key_name: str
    month: str
    amount_pusd: int


@dataclass(frozen=True, slots=True)
class Usage:
    spent_pusd: int
    reserved_pusd: int


class Budgets:
    def __init__(self, pool: Pool) -> None:
        self.pool = pool

    def reserve(
        self,
        key_name: str,
        budget_pusd: int,
        amount_pusd: int,
        *,
        ttl_s: float,
        now: float | None = None,
    ) -> Reservation | None:
        """Reserve ``amount_pusd`` of the key's month; None when it would pass the budget
        (after releasing the key's expired reservations, which may make room)."""
        now = time.time() if now is None else now
        month = month_of(now)
        for attempt in range(2):
            with self.pool.transaction() as tx:
                _ensure_row(tx, key_name, month)
                taken = tx.count(
                    "UPDATE key_spend SET reserved_pusd = reserved_pusd + ? "
                    "WHERE key_name = ? AND month = ? AND spent_pusd + reserved_pusd + ? <= ?",
                    (amount_pusd, key_name, month, amount_pusd, budget_pusd),
                )
                if taken:
                    found = Reservation(uuid.uuid4().hex, key_name, month, amount_pusd)
                    tx.run(
                        "INSERT INTO budget_reservations "
                        "(id, key_name, month, amount_pusd, expires_at) VALUES (?, ?, ?, ?, ?)",
                        (found.id, key_name, month, amount_pusd, now + ttl_s),
                    )
                    return found
            if attempt == 0 and not self.sweep(now=now, key_name=key_name):
                return None
        return None

    def settle(self, reservation: Reservation, cost_pusd: int) -> None:
        """The request ended: its real cost (0 when no API call was paid) replaces what it
        reserved. Idempotent with the sweep: the amount is released once."""
        with self.pool.transaction() as tx:
            gone = tx.rows(
                "DELETE FROM budget_reservations WHERE id = ? RETURNING amount_pusd",
                (reservation.id,),
            )
            released = int(gone[0][0]) if gone else 0
            _ensure_row(tx, reservation.key_name, reservation.month)
            tx.run(
                "UPDATE key_spend SET reserved_pusd = reserved_pusd - ?, "
                "spent_pusd = spent_pusd + ? WHERE key_name = ? AND month = ?",
                (released, max(0, cost_pusd), reservation.key_name, reservation.month),
            )

    def sweep(self, *, now: float | None = None, key_name: str | None = None) -> int:
        """Release the reservations whose expiry has passed (of one key, or all); how many."""
        now = time.time() if now is None else now
        where, params = "expires_at < ?", [now]
        params_: list[object] = list(params)
        if key_name is not None:
            where, params_ = where + " AND key_name = ?", [now, key_name]
        with self.pool.transaction() as tx:
            gone = tx.rows(
                f"DELETE FROM budget_reservations WHERE {where} "  # noqa: S608 - fixed text
                "RETURNING key_name, month, amount_pusd",
                params_,
            )
            for (key, month), amount in sorted(_totals(gone).items()):  # one lock order
                tx.run(
                    "UPDATE key_spend SET reserved_pusd = reserved_pusd - ? "
                    "WHERE key_name = ? AND month = ?",
                    (amount, key, month),
                )
        return len(gone)

    def usage(self, month: str) -> dict[str, Usage]:
        """Each key's spend and reservations in ``month``."""
        with self.pool.transaction() as tx:
            rows = tx.rows(
                "SELECT key_name, spent_pusd, reserved_pusd FROM key_spend WHERE month = ?",
                (month,),
            )
        return {name: Usage(int(spent), int(reserved)) for name, spent, reserved in rows}


def _ensure_row(tx: Tx, key_name: str, month: str) -> None:
    tx.run(
        "INSERT INTO key_spend (key_name, month) VALUES (?, ?) ON CONFLICT DO NOTHING",
        (key_name, month),
    )


def _totals(rows: Iterable[tuple[object, ...]]) -> dict[tuple[str, str], int]:
    totals: dict[tuple[str, str], int] = {}
    for key, month, amount in rows:
        slot = (str(key), str(month))
        totals[slot] = totals.get(slot, 0) + int(str(amount))
    return totals
