"""What an operator reads of the batches, beside the store's own methods: the money a batch's
lines cost (``frugal batches show``), the key names its owners stand for (``frugal batches
list``), and the lines and batches of the whole database counted by state and status (the
``/metrics`` gauges of deferred work).

**A batch's money.** Each finished line has one ledger row, written with the line's id as its
request id and priced at the tier it was billed at (the batch rate, or half the standard rate
where the price map has none: :mod:`proxy.ledger.pricing`), in the transaction that finished
it (:meth:`~proxy.ledger.batches.store.BatchStore.finish`). :func:`batch_money` adds those
rows' API cost and counterfactual up, as exact pico-dollars. The ``requests`` table has no
index on the request id, so the rows are looked for from an hour before the batch was made
(``ts`` is indexed; the hour covers clocks that differ between replicas): a line's row is
written once the line ran, never before its batch was made.

**Owners.** A batch belongs to a key's identity (``id:N`` for a stored key, ``env:…`` for a
key of the environment, ``''`` for the keyless proxy), never its name, which a revoked key
hands on. :func:`identities_of` gives the identities a stored name was ever given, and
:func:`owner_names` the name of each stored identity.

Blocking functions, on a :class:`~proxy.ledger.db.connections.Pool`, as the store's are.
"""

from __future__ import annotations

from dataclasses import dataclass

from proxy.ledger.batches.objects import MOVES
from proxy.ledger.db.connections import Pool

SKEW_S = 3600  # how far before its batch a line's row is looked for (clocks between replicas)


@dataclass(frozen=True, slots=True)
class Money:
    """A batch's ledger rows added up: how many, what the API charged, and what it would have
    charged had every line gone to it (both pico-dollars, at the tier each row was billed at)."""

    rows: int
    api_cost_pusd: int
    counterfactual_pusd: int

    @property
    def saved_pusd(self) -> int:
        return self.counterfactual_pusd - self.api_cost_pusd


def batch_money(pool: Pool, batch_id: str, created_at: int) -> Money:
    """The ledger rows of the batch's lines (request id = line id), added up."""
    with pool.transaction() as tx:
        found = tx.rows(
            "SELECT count(*), sum(api_cost_pusd), sum(counterfactual_cost_pusd) FROM requests "
            "WHERE ts >= ? AND request_id IN (SELECT id FROM batch_lines WHERE batch_id = ?)",
            (created_at - SKEW_S, batch_id),
        )
    rows, cost, counterfactual = found[0]
    return Money(int(rows), int(cost or 0), int(counterfactual or 0))


def identities_of(pool: Pool, name: str) -> list[str]:
    """Every identity the stored key name ``name`` was given (a revoked key's name may be
    given again); empty when no stored key ever had it."""
    with pool.transaction() as tx:
        rows = tx.rows("SELECT id FROM api_keys WHERE name = ? ORDER BY id", (name,))
    return [f"id:{key_id}" for (key_id,) in rows]


def owner_names(pool: Pool) -> dict[str, str]:
    """The name of each stored key, by its identity."""
    with pool.transaction() as tx:
        rows = tx.rows("SELECT id, name FROM api_keys")
    return {f"id:{key_id}": str(name) for key_id, name in rows}


@dataclass(frozen=True, slots=True)
class Census:
    """The whole database's open batch lines by state, and its batches by status."""

    lines: dict[str, int]
    batches: dict[str, int]


def census(pool: Pool) -> Census:
    """The lines still to answer by state (pending, claimed by a worker, deferred to the
    upstream's batch) and the batches by status, each present (0 when none). Lines done or
    cancelled are not counted: they only grow, and the partial indexes on the open and the
    deferred lines keep these counts to the work that waits."""
    with pool.transaction() as tx:
        open_lines = tx.rows(
            "SELECT state, count(*) FROM batch_lines WHERE state IN ('pending', 'claimed') "
            "GROUP BY state"
        )
        deferred = tx.rows("SELECT count(*) FROM batch_lines WHERE state = 'deferred'")
        statuses = tx.rows("SELECT status, count(*) FROM batches GROUP BY status")
    lines = dict.fromkeys(("pending", "claimed", "deferred"), 0)
    lines.update({str(state): int(n) for state, n in open_lines})
    lines["deferred"] = int(deferred[0][0])
    batches = dict.fromkeys(MOVES, 0)
    batches.update({str(status): int(n) for status, n in statuses})
    return Census(lines, batches)
