"""The ``/metrics`` gauges of deferred work: the batch lines that wait (``pending``), that a
worker runs (``claimed``) or that wait for the upstream's own batch (``deferred``), and the
batches by status, read from the ledger database every replica shares
(:func:`proxy.ledger.batches.tally.census`).

A scrape never reaches the database more often than every ``max_age_s``, and never waits on it
longer than ``wait_s``: :meth:`BatchGauges.fresh`, awaited by the scrape before it renders,
starts one reading in a worker thread when the last is older than ``max_age_s`` (scrapes that
arrive meanwhile share it), and waits for it at most ``wait_s``. A reading that takes longer (a
ledger held locked) goes on, and the scrape reports the last reading; a later scrape finds the
new one. A reading that fails (the database busy or gone) keeps the last one, and is logged;
before any reading the gauges are absent rather than zero, so that a dashboard never shows an
empty queue it did not see.

The figures are the whole database's, every replica's batches together, as the store keeps
them; each replica reports the same figures, so sum none of them across replicas.

**This replica's runner.** Beside them, ``runner`` (the batch runner's
:meth:`~proxy.serving.batch_runner.BatchRunner.gauges`) is read at each scrape, from memory:
``frugal_batch_runner_lines{state}`` counts the lines this replica holds (``running``: in a
local attempt; ``held``: rejects waiting to go up with the rest of their batch; ``upstream``:
sent to the upstream's Batch API, not answered yet), and
``frugal_batch_runner_lines_finished_total{route}`` the lines it finished since it started
(``local``, ``api``). These are each replica's own: sum them across replicas.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import KW_ONLY, dataclass, field

import structlog
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from proxy.ledger.batches.tally import Census, census
from proxy.ledger.db.connections import Pool, Unavailable
from proxy.serving.batch_runner import RunnerGauges

log = structlog.get_logger("frugal.batch_gauges")

MAX_AGE_S = 5.0
WAIT_S = 1.0


@dataclass(eq=False)  # told apart by identity
class BatchGauges:
    """The last counts of batch lines and batches, read again when older than ``max_age_s``,
    a scrape waiting for a reading ``wait_s`` at most (``clock``: monotonic seconds, for the
    tests); ``runner``: this replica's runner's gauges, read at each scrape (None: no runner)."""

    pool: Pool
    _: KW_ONLY
    runner: Callable[[], RunnerGauges] | None = None
    max_age_s: float = MAX_AGE_S
    wait_s: float = WAIT_S
    clock: Callable[[], float] = time.monotonic
    last: Census | None = field(default=None, init=False)
    reads: int = field(default=0, init=False)  # readings ended (read or failed), for the tests
    reading: asyncio.Task[None] | None = field(default=None, init=False)  # the one under way
    _read_at: float | None = field(default=None, init=False)

    async def fresh(self) -> None:
        """Start a reading if the last is older than ``max_age_s`` (unless one is under way),
        and wait for it ``wait_s`` at most."""
        if not self._stale():
            return
        if self.reading is None:
            self.reading = asyncio.create_task(self._read())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self.reading), self.wait_s)

    async def _read(self) -> None:
        try:
            self.last = await asyncio.to_thread(census, self.pool)
        except Unavailable as exc:
            log.warning("batch_gauges_unavailable", error=str(exc))
        finally:
            self.reads += 1
            self._read_at = self.clock()
            self.reading = None

    def _stale(self) -> bool:
        return self._read_at is None or self.clock() - self._read_at >= self.max_age_s

    def collect(self) -> Iterator[Metric]:
        if self.runner is not None:
            yield from _runner_metrics(self.runner())
        if self.last is None:
            return
        yield _gauge(
            "frugal_batch_lines",
            "Batch lines not yet answered, by state: pending (queued), claimed (a worker runs "
            "them), deferred (sent to the upstream's batch). Every replica's, read every few "
            "seconds.",
            "state",
            sorted(self.last.lines.items()),
        )
        yield _gauge(
            "frugal_batches",
            "Batches in the ledger database, by status. Every replica's, read every few seconds.",
            "status",
            sorted(self.last.batches.items()),
        )


def _gauge(name: str, doc: str, label: str, counts: Iterable[tuple[str, int]]) -> Metric:
    """A gauge with one ``label``, a sample for each of ``counts`` (the label's value, the
    count)."""
    family = GaugeMetricFamily(name, doc, labels=[label])
    for value, n in counts:
        family.add_metric([value], float(n))
    return family


def _runner_metrics(gauges: RunnerGauges) -> Iterator[Metric]:
    yield _gauge(
        "frugal_batch_runner_lines",
        "Batch lines this replica's runner holds, by state: running (a local attempt), held "
        "(rejects waiting to go up with the rest of their batch), upstream (sent to the "
        "upstream's Batch API, not answered yet).",
        "state",
        (("running", gauges.running), ("held", gauges.held), ("upstream", gauges.upstream)),
    )
    finished = CounterMetricFamily(
        "frugal_batch_runner_lines_finished",
        "Batch lines this replica's runner finished since it started, by who answered them.",
        labels=["route"],
    )
    finished.add_metric(["local"], float(gauges.local_done))
    finished.add_metric(["api"], float(gauges.api_done))
    yield finished
