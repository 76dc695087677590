"""The ``/metrics`` gauges of deferred work: the batch lines that wait (``pending``), that a
worker runs (``claimed``) or that wait for the upstream's own batch (``deferred``), and the
batches by status, read from the ledger database every replica shares
(:func:`proxy.ledger.batches.tally.census`).

A scrape never waits on the database, and never reaches it more often than every
``max_age_s``: :meth:`BatchGauges.fresh`, awaited by the scrape before it renders, reads the
counts in a worker thread only when the last reading is older than that, and scrapes that
arrive meanwhile share the one reading. The collector (:mod:`proxy.serving.metrics`) then
reports the last reading, which is at most ``max_age_s`` old (plus the read itself). A reading
that fails (the database busy or gone) keeps the last one, logged once per failure; before any
reading the gauges are absent rather than zero, so that a dashboard never shows an empty queue
it did not see.

The figures are the whole database's, every replica's batches together, as the store keeps
them; each replica reports the same figures, so sum none of them across replicas.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator

import structlog
from prometheus_client.core import GaugeMetricFamily, Metric

from proxy.ledger.batches.tally import Census, census
from proxy.ledger.db.connections import Pool, Unavailable

log = structlog.get_logger("frugal.batch_gauges")

MAX_AGE_S = 5.0


class BatchGauges:
    """The last counts of batch lines and batches, read again when older than ``max_age_s``
    (``clock``: monotonic seconds, for the tests)."""

    def __init__(
        self,
        pool: Pool,
        *,
        max_age_s: float = MAX_AGE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.pool = pool
        self.max_age_s = max_age_s
        self.clock = clock
        self.last: Census | None = None
        self.reads = 0  # readings of the database tried, for the tests
        self._read_at: float | None = None
        self._lock = asyncio.Lock()

    async def fresh(self) -> None:
        """Read the counts again if the last reading is older than ``max_age_s``."""
        if not self._stale():
            return
        async with self._lock:
            if not self._stale():  # another scrape read them while this one waited
                return
            try:
                self.last = await asyncio.to_thread(census, self.pool)
            except Unavailable as exc:
                log.warning("batch_gauges_unavailable", error=str(exc))
            self.reads += 1
            self._read_at = self.clock()

    def _stale(self) -> bool:
        return self._read_at is None or self.clock() - self._read_at >= self.max_age_s

    def collect(self) -> Iterator[Metric]:
        if self.last is None:
            return
        lines = GaugeMetricFamily(
            "frugal_batch_lines",
            "Batch lines not yet answered, by state: pending (queued), claimed (a worker runs "
            "them), deferred (sent to the upstream's batch). Every replica's, read every few "
            "seconds.",
            labels=["state"],
        )
        for state, n in sorted(self.last.lines.items()):
            lines.add_metric([state], float(n))
        yield lines
        batches = GaugeMetricFamily(
            "frugal_batches",
            "Batches in the ledger database, by status. Every replica's, read every few seconds.",
            labels=["status"],
        )
        for status, n in sorted(self.last.batches.items()):
            batches.add_metric([status], float(n))
        yield batches
