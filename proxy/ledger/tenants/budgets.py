"""Monthly budgets per client key: reserve the worst case before an API call, settle after.

A key's month is one row of ``key_spend`` (``migrations/0008_budgets_cache.sql``): what it has
spent and what requests in flight have reserved, in pico-dollars. Every replica shares it on
PostgreSQL, so the budget holds across all of them:

- :meth:`Budgets.reserve` adds the request's worst-case cost to ``reserved_pusd`` with one
  conditional ``UPDATE ... WHERE spent + reserved + amount <= budget``. PostgreSQL locks the row
  and re-checks the condition against the committed values of a concurrent reservation (SQLite
  takes its write lock), so two replicas can never both take the last dollar. The reservation
  is also a row of ``budget_reservations`` with an expiry, in the same transaction.
- A reservation lives as long as its call, however long that runs (a reasoning model's stream
  can outlast any fixed expiry): its expiry is a short lease that :meth:`Budgets.renew` moves
  on, for every reservation this process still holds, with one ``UPDATE`` per tick (the caller's
  clock: :class:`proxy.serving.quotas.Quotas` renews every third of the lease). A reservation is
  held from :meth:`Budgets.reserve` until :meth:`Budgets.settle`, or until nothing refers to it
  any more (an exchange dropped unsettled by a bug), so no call is forgotten and none is kept.
- :meth:`Budgets.settle` deletes that row and moves its amount from reserved to the real cost
  (0 on failure), once: a reservation the sweep already released adds its cost only.
- :meth:`Budgets.sweep` releases expired reservations: those of a replica that crashed (it
  renews nothing any more, so they expire within one lease) or that could not be renewed for a
  whole lease (the database was unreachable), so a key is never blocked by money it did not
  spend.
- An audit's shadow and judge calls are reserved and settled the same way
  (:class:`proxy.serving.quotas.AuditPurse`): they count against the same budget.

Each method is blocking (run it in a thread) and raises
:class:`~proxy.ledger.db.connections.Unavailable` when the database is not there; the request path
then fails closed (no API call).
"""

from __future__ import annotations

import threading
import time
import uuid
import weakref
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime

from proxy.ledger.db.connections import Pool, Tx


def month_of(ts: float) -> str:
    """The UTC month of a unix time, ``YYYY-MM``: budgets start again on the 1st."""
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m")


RENEW_CHUNK = 500
"""Reservations renewed by one statement (a bound on its parameters; SQLite allows 32,766)."""


@dataclass(frozen=True, slots=True, weakref_slot=True)
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
        # The reservations this process holds, renewed until settled; weak, so that one whose
        # exchange is dropped unsettled stops being renewed and expires.
        self._held: weakref.WeakSet[Reservation] = weakref.WeakSet()
        self._lock = threading.Lock()  # reserve and settle run in worker threads

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
                    with self._lock:
                        self._held.add(found)
                    return found
            if attempt == 0 and not self.sweep(now=now, key_name=key_name):
                return None
        return None

    def settle(self, reservation: Reservation, cost_pusd: int) -> None:
        """The request ended: its real cost (0 when no API call was paid) replaces what it
        reserved. Idempotent with the sweep: the amount is released once. It is no longer
        renewed, whether or not the database could be reached."""
        with self._lock:
            self._held.discard(reservation)
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

    def renew(self, lease_s: float, *, now: float | None = None) -> tuple[int, int]:
        """Move the expiry of every reservation this process holds to ``now + lease_s``, in one
        statement (per :data:`RENEW_CHUNK` of them); (renewed, lost). A lost reservation was
        released by a sweep while its call still ran (the database was out of reach for a
        whole lease): its money is no longer reserved, and it is no longer renewed (its settle
        adds its cost)."""
        now = time.time() if now is None else now
        with self._lock:
            ids = {r.id for r in self._held}
        if not ids:
            return 0, 0
        renewed: set[str] = set()
        ordered = sorted(ids)
        with self.pool.transaction() as tx:
            for start in range(0, len(ordered), RENEW_CHUNK):
                chunk = ordered[start : start + RENEW_CHUNK]
                marks = ", ".join("?" * len(chunk))
                found = tx.rows(
                    "UPDATE budget_reservations SET expires_at = ? "  # noqa: S608 - marks only
                    f"WHERE id IN ({marks}) RETURNING id",
                    (now + lease_s, *chunk),
                )
                renewed.update(str(row[0]) for row in found)
        with self._lock:  # settled meanwhile: not lost, only gone
            lost = [r for r in self._held if r.id in ids and r.id not in renewed]
            for reservation in lost:
                self._held.discard(reservation)
        return len(renewed), len(lost)

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
