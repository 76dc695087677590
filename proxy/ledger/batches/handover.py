"""Lines waiting for an upstream batch, handed over from a worker that is gone to one that goes
on with them.

A runner marks the lines it sends to the upstream's Batch API ``deferred``
(:meth:`~proxy.ledger.batches.store.BatchStore.defer_to_api`): first under a handle of its own,
then under the upstream batch's id. They keep their worker's name, and, when the store has a
``lease_s``, a lease that the worker renews with its claims
(:meth:`~proxy.ledger.batches.store.BatchStore.renew`). :func:`take_deferred` gives another
worker only the deferred lines whose worker is gone: no lease (lines deferred before leases, or
by a store without one), a lease that has passed, or a holder the caller's ``gone`` says is no
more (a process of its host that is not there: a restart after ``kill -9``). So a replica that
starts beside another on one PostgreSQL resumes only what a dead worker left, never the lines
a live replica is uploading or polling: those it would have released and sent up a second
time, or polled twice.

Each line is taken in one conditional write (its lease still ends by the time judged, its
worker unchanged), so two replicas taking over at once, or a renewal that commits first, never
let a line be taken twice. Blocking: run it in a thread.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from proxy.ledger.batches.objects import Line
from proxy.ledger.batches.records import lines_by_upstream, marks
from proxy.ledger.db.connections import Pool


def take_deferred(
    pool: Pool,
    worker: str,
    *,
    lease_s: float,
    gone: Callable[[str | None], bool],
    leased_only: bool = False,
    now: float | None = None,
) -> dict[str, list[Line]]:
    """The deferred lines whose worker is gone (see the module's docstring), now ``worker``'s
    under a lease of ``lease_s``, by the upstream batch id (or handle) they wait for. Never a
    line of ``worker`` itself. ``leased_only``: only lines that hold a lease (a periodic look,
    not at start: a line without one is a start's to take)."""
    at = time.time() if now is None else now
    leased = " AND lease_until IS NOT NULL" if leased_only else ""
    with pool.transaction() as tx:
        found = tx.rows(
            "SELECT id, worker, lease_until FROM batch_lines WHERE state = 'deferred' "
            f"AND (worker IS NULL OR worker <> ?){leased} ORDER BY seq",
            (worker,),
        )
        taken: list[str] = []
        for line_id, holder, until in found:
            if until is None or float(until) <= at:
                by = at
            elif gone(holder):
                by = float(until)
            else:
                continue
            same = "worker IS NULL" if holder is None else "worker = ?"
            taken += [
                row[0]
                for row in tx.rows(
                    "UPDATE batch_lines SET worker = ?, lease_until = ? WHERE id = ? "
                    "AND state = 'deferred' AND (lease_until IS NULL OR lease_until <= ?) "
                    f"AND {same} RETURNING id",
                    (worker, at + lease_s, line_id, by, *(() if holder is None else (holder,))),
                )
            ]
        if not taken:
            return {}
        return lines_by_upstream(tx, f"l.id IN ({marks(taken)})", taken)
