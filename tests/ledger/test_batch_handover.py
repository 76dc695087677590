"""Deferred batch lines handed over (proxy/ledger/batches/handover.py), on SQLite and on a real
PostgreSQL, between two pools (two replicas): a worker takes over only the lines whose worker is
gone (no lease, a lease that has passed, a holder said gone), never a live worker's, nor its
own; a worker's renewal keeps its deferred lines; a line without a lease is left to a start."""

from __future__ import annotations

import time

from proxy.ledger.batches.handover import take_deferred
from proxy.ledger.batches.objects import Line
from proxy.ledger.batches.store import BatchStore
from proxy.ledger.db.connections import Pool
from proxy.ledger.db.location import Database
from tests.ledger.test_batch_store import PRICES, batch_of

LEASE_S = 300.0


def _ids(handed: dict[str, list[Line]]) -> dict[str, list[str]]:
    return {upstream: [line.id for line in lines] for upstream, lines in handed.items()}


def test_deferred_lines_are_taken_over_only_from_a_worker_that_is_gone(
    database: Database, pool: Pool
) -> None:
    batch_id = batch_of(pool, 4)
    leased = BatchStore(pool, prices=PRICES, lease_s=LEASE_S)
    unleased = BatchStore(pool, prices=PRICES)  # a store without leases (before them)
    first = [line.id for line in leased.claim("h:1:a", 2, lease_s=LEASE_S, batch_id=batch_id)]
    second = [line.id for line in leased.claim("h:2:b", 2, lease_s=LEASE_S, batch_id=batch_id)]
    assert leased.defer_to_api(first, "frugal-up-1") == 2  # h:1:a's upload under way
    assert unleased.defer_to_api(second[:1], "batch_up_2") == 1  # no lease
    assert leased.defer_to_api(second[1:], "batch_up_3") == 1  # h:2:b's, then h:2:b dies

    other = Pool(database, size=1, timeout_s=10.0)
    try:

        def take(
            worker: str, *, dead: str = "", only: bool = True, at: float | None = None
        ) -> dict[str, list[str]]:
            return _ids(
                take_deferred(
                    other,
                    worker,
                    lease_s=LEASE_S,
                    gone=lambda name: name == dead,
                    leased_only=only,
                    now=at,
                )
            )

        alive = take("h:9:z")  # every holder alive, in time; the unleased one is a start's
        own = take("h:1:a", dead="h:1:a", only=False)  # never a worker's own lines
        dead_holder = take("h:9:z", dead="h:2:b")
        at_start = take("h:9:z", only=False)
        renewed = leased.renew("h:1:a", first, lease_s=2 * LEASE_S + 100)
        later = take("h:8:y", at=time.time() + LEASE_S + 50)  # h:9:z stopped renewing
    finally:
        other.close()
    assert alive == {}
    assert own == {"batch_up_2": second[:1]}  # the unleased line, not its own
    assert dead_holder == {"batch_up_3": second[1:]}
    assert at_start == {}  # taken already: by h:1:a above, h:9:z now holds the other
    assert renewed == sorted(first)
    assert later == {"batch_up_2": second[:1], "batch_up_3": second[1:]}
