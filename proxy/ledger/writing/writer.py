"""The ledger: one row per request, written off the request path by a single writer.

Requests hand their row to :meth:`Ledger.record`, which only appends to a thread-safe queue (and,
for a local answer, queues its counterfactual token count on the :class:`TokenCounter` thread).
One writer thread, with its own connection, drains the queue in batches: at most
``flush_interval_s`` after a row arrives, or as soon as ``batch_size`` rows wait, one
transaction writes them (:mod:`proxy.ledger.writing.batching` gathers,
:mod:`proxy.ledger.writing.flush` writes; the database is SQLite or PostgreSQL,
:mod:`proxy.ledger.writing.storage`). Costs are computed there, from the row's facts and the
:class:`PriceBook`. The writer is a thread rather than a task on the event loop so that a loop busy
with requests cannot delay a commit. Several replicas may share one PostgreSQL ledger: each keeps
its own writer and batching, and row ids come from the database's identity column.

Durability: a row is committed about ``flush_interval_s`` plus one write after its response
was handed to the server, so after a ``kill -9`` every request that completed more than a
second earlier is in the database (``bench/ledger_kill9.py`` measures the window; see
``bench/README.md``). WAL with ``synchronous=NORMAL`` survives a killed process; after a power
cut the last commits may be lost.

Counts that are not ready when their row is written (litellm still importing at start-up, or a
tokenizer being fetched) do not hold the row back: it is written with the local model's own
counts (``token_source = 'local'``) and updated when the count arrives.

Failures never reach a request, never stall the writer and never lose a row silently. Every
counter below is in ``/healthz`` (the ``ledger`` block) and ``/metrics``:

- The database, not a row (SQLite locked, busy, ``database or disk is full``, I/O;
  PostgreSQL unreachable, restarting, out of space): the transaction is rolled back, its rows
  are held and tried again with backoff (0.1 s up to 2 s; ``write_retries``), as long as the
  database stays that way; ``/healthz`` says ``degraded`` with the ``reason`` (the database's
  own words, never a row's value).
- One row (anything else: a value SQLite cannot bind, such as an integer beyond int64, a
  constraint, a bug): the batch is tried again row by row, and each row that still fails is
  *rejected*: counted in ``rows_rejected``, kept (request id and error class) in a short list in
  memory, and appended as one JSON line to ``<path>.rejected.jsonl`` beside the database. The
  other rows are written.
- Impossible usage (a token count that is not an integer in [0, 2**31), say 2**70 from an
  upstream): the row is written all the same, with those counts NULL and their names in
  ``usage_invalid``, and its costs unknown; ``usage_invalid`` counts such rows.
- The queue holds at most ``max_queue`` rows (queued or held for retry). Beyond it ``record``
  drops the row and counts it in ``rows_dropped``, logging once when a burst of drops starts and
  once when it ends. ``record`` never blocks and never raises.

Shutdown (see ``proxy/server/lifespan.py`` and ``deploy/frugal-proxy.service``): after uvicorn
has drained the requests in flight (``[server] drain_s``), :meth:`Ledger.flush` writes every
row of a finished request before the engine is stopped, then :meth:`Ledger.close` writes the
rows that came during the engine's stop. Together they take at most ``[ledger]
shutdown_timeout_s`` (and one second more when the flush already used it all). While the
database stays locked they retry until that deadline; then every row still unwritten goes to
``<path>.rejected.jsonl`` (``"why": "unwritten"``) and the log says how many, so a stop loses no
row unless that file cannot be written either (``rows_lost``, logged as an error). A row
recorded after :meth:`close` goes straight to that file.

The spill file's lines are :mod:`proxy.ledger.writing.spill`'s; with PostgreSQL it sits beside
``[ledger] path``. The schema and its migrations are :mod:`proxy.ledger.db.migrate`'s.
"""

from __future__ import annotations

import asyncio
import collections
import queue
import threading
import time
from concurrent.futures import Future
from typing import Any

import structlog

from proxy.ledger.db.location import Database, as_database
from proxy.ledger.db.migrate import open_database
from proxy.ledger.pricing import PriceBook, load_price_map
from proxy.ledger.writing.batching import FlushMarker, StopMarker, WriterThread
from proxy.ledger.writing.flush import AuditEntry, Entry
from proxy.ledger.writing.ledger_row import COLUMNS, LedgerRow
from proxy.ledger.writing.rows import COUNT_UPDATE
from proxy.ledger.writing.spill import SPILL_SUFFIX
from proxy.ledger.writing.storage import Store
from proxy.ledger.writing.tokens import CountJob, TokenCounter

__all__ = ["COLUMNS", "COUNT_UPDATE", "SPILL_SUFFIX", "Ledger", "LedgerRow"]

log = structlog.get_logger(__name__)

DEAD_LETTERS_KEPT = 100  # rejected rows remembered in memory (their request id and error class)
DEGRADED_FOR_S = 300.0  # /healthz says "degraded" this long after a row was dropped or rejected


class Ledger(WriterThread):
    """Batched, single-writer ledger. ``record`` never blocks and never raises.

    ``database`` is a :class:`Database`, or a SQLite path or a ``sqlite:///`` /
    ``postgresql://`` URL (see :mod:`proxy.ledger.db.location`). The writer is a thread of its
    own with its own connection: its batching does not wait on the event loop, so a busy loop
    cannot hold rows back. Counters are plain ints, each written by one thread (the writer, or
    the event loop for ``record``'s drops) and read by ``/healthz``.
    """

    def __init__(
        self,
        database: str | Database,
        *,
        prices: PriceBook | None = None,
        counter: TokenCounter | None = None,
        flush_interval_s: float = 0.2,
        batch_size: int = 256,
        busy_timeout_s: float = 5.0,
        max_queue: int = 100_000,
        shutdown_timeout_s: float = 5.0,
        count_wait_s: float = 5.0,
        password_env: str = "",
    ):
        self.database = as_database(database, password_env=password_env)
        self.path = self.database.label
        self.spill_path = self.database.spill_base + SPILL_SUFFIX
        self.prices = prices if prices is not None else PriceBook(load_price_map())
        self.counter = counter if counter is not None else TokenCounter()
        self.flush_interval_s = flush_interval_s
        self.batch_size = batch_size
        self.busy_timeout_s = busy_timeout_s
        self.max_queue = max_queue
        self.shutdown_timeout_s = shutdown_timeout_s
        self.count_wait_s = count_wait_s
        self.written = 0
        self.write_failures = 0  # failed transactions, of either kind
        self.write_retries = 0  # ... that failed on the database and were retried
        self.rejected = 0
        self.dropped = 0  # by record(), on the event loop
        self.spilled = 0
        self.lost = 0
        self.usage_invalid = 0
        self.estimated = 0
        self.dead_letters = collections.deque(maxlen=DEAD_LETTERS_KEPT)
        self._last_error = None
        self._last_reason = None  # why writes fail now, while they do
        self._last_incident = None  # monotonic time of the last drop or reject
        self._dropping = 0  # rows dropped in the current burst
        self._items = queue.SimpleQueue()
        self._retained = []
        # Rows recorded (counted by record, on the event loop) and rows done with (written,
        # rejected or spilled, counted by the writer): each counter has one writer, so their
        # difference, the rows pending, is exact without a lock.
        self._accepted = 0
        self._done = 0
        self._retrying = 0  # ... of them, held after the database failed
        self._retained_updates = []
        self._retained_audits = []  # audit rows held after the database failed
        self.audits_written = 0
        self.audits_rejected = 0
        self.audits_lost = 0
        self._flushes = []
        self._awaiting = set()
        self._count_warned = set()
        self._failing_since = None
        self._deadline = None  # of a flush or the stop: bounds each lock wait
        self._thread: threading.Thread | None = None
        self._store: Store | None = None
        self._closed = False

    # -- life cycle ------------------------------------------------------------------------------

    async def start(self) -> None:
        """Create or upgrade the schema and start the writer; a database that cannot be used
        is a :class:`~proxy.errors.ConfigError` (``frugal serve`` exits 2)."""
        await asyncio.to_thread(open_database, self.database, busy_timeout_s=self.busy_timeout_s)
        opened: Future[None] = Future()
        self._thread = threading.Thread(
            target=self._run, args=(opened,), name="ledger-writer", daemon=True
        )
        self._thread.start()
        await asyncio.wrap_future(opened)
        self.counter.start()

    async def counter_ready(self, timeout_s: float = 60.0) -> bool:
        """Wait (at most ``timeout_s``) for the token counter's litellm import, started by
        :meth:`start`; False if it failed or is still going (rows are then written with the
        local model's counts and updated when the counter catches up)."""
        try:
            await asyncio.wait_for(
                asyncio.shield(asyncio.wrap_future(self.counter.ready)), timeout_s
            )
        except TimeoutError:
            log.warning("token_counter_slow", waited_s=timeout_s)
            return False
        except Exception as exc:  # noqa: BLE001 - counting degrades, serving goes on
            log.error(
                "token_counter_failed",
                error=type(exc).__name__,
                detail=f"{exc}; local answers are counted with the local model's tokenizer",
            )
            return False
        return True

    async def flush(self, timeout_s: float | None = None) -> bool:
        """Write every row recorded so far, now (without waiting for ``flush_interval_s``);
        True once they are in, False if ``timeout_s`` (default ``shutdown_timeout_s``) passed
        first (the rows stay queued and retried; :meth:`close` writes or spills them)."""
        if self._thread is None:
            return not self.pending
        timeout_s = self.shutdown_timeout_s if timeout_s is None else timeout_s
        marker = FlushMarker(Future(), time.monotonic() + timeout_s)
        self._items.put(marker)
        try:
            await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(marker.done)), timeout_s)
        except TimeoutError:
            log.warning(
                "ledger_flush_timeout",
                waited_s=timeout_s,
                rows_pending=self.pending,
                error=self._last_error,
            )
            return False
        return True

    async def close(self, timeout_s: float | None = None) -> None:
        """Write every row still queued (and the counts still running, for up to
        ``count_wait_s``) within ``timeout_s`` (default ``shutdown_timeout_s``); spill what the
        database would not take by then to ``<path>.rejected.jsonl``; close the database."""
        timeout_s = self.shutdown_timeout_s if timeout_s is None else timeout_s
        thread, self._thread = self._thread, None
        if thread is not None:
            self._items.put(StopMarker(time.monotonic() + timeout_s))
            # The writer keeps to the deadline; the margin covers its last spill.
            await asyncio.to_thread(thread.join, timeout_s + 5.0)
            if thread.is_alive():
                log.error(
                    "ledger_writer_stuck",
                    waited_s=timeout_s + 5.0,
                    rows_held=self.pending,
                    detail="the writer did not finish; the rows it holds may be lost",
                )
            # Rows recorded while the writer wound up, after its last look at the queue.
            late = [i for i in self._drain() if isinstance(i, Entry)]
            self._done += len(late)
            if late:
                self._spill(late, "unwritten", None)
        self._closed = True
        self.counter.close()

    # -- the request side ------------------------------------------------------------------------

    def record(self, row: LedgerRow, *, count: CountJob | None = None) -> None:
        """Queue one row. ``count`` asks for the counterfactual tokens of a local answer."""
        try:
            if self._closed:
                self._spill([Entry(row, None)], "unwritten", None)
                return
            if self._accepted - self._done >= self.max_queue:
                self._drop()
                return
            if self._dropping:
                log.warning("ledger_queue_recovered", rows_dropped=self._dropping)
                self._dropping = 0
            future = self.counter.submit(count) if count is not None else None
            self._accepted += 1
            self._items.put(Entry(row, future))
        except Exception as exc:  # noqa: BLE001 - a request never fails on its ledger row
            self.dropped += 1
            log.error("ledger_record_failed", error=type(exc).__name__)

    def record_audit(self, row: dict[str, Any]) -> None:
        """Queue one row of the ``audits`` table (:mod:`proxy.ledger.audits.table`); written by the
        writer thread with the next batch, in a transaction of its own. Never blocks or raises;
        audits are sampled and bounded upstream, so they do not count against ``max_queue``."""
        try:
            if self._closed:
                self.audits_lost += 1
                log.warning("ledger_audit_lost", request_id=row.get("request_id"))
                return
            self._items.put(AuditEntry(row))
        except Exception as exc:  # noqa: BLE001 - an audit never fails anything
            self.audits_lost += 1
            log.error("ledger_record_failed", error=type(exc).__name__)

    def _drop(self) -> None:
        self.dropped += 1
        self._last_incident = time.monotonic()
        if not self._dropping:
            log.error(
                "ledger_queue_full",
                max_queue=self.max_queue,
                error=self._last_error,
                detail="rows are dropped (and counted in rows_dropped) until the writer catches up",
            )
        self._dropping += 1

    @property
    def pending(self) -> int:
        """Rows recorded but not written yet (queued, or held after a failed write)."""
        return max(0, self._accepted - self._done)

    @property
    def state(self) -> str:
        """``degraded`` while writes fail or the queue is full, and for a while after a row
        was dropped or rejected; ``ok`` otherwise."""
        recent = self._last_incident is not None and (
            time.monotonic() - self._last_incident < DEGRADED_FOR_S
        )
        failing = self._failing_since is not None or self.pending >= self.max_queue
        return "degraded" if failing or recent or self.lost else "ok"

    def health(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "pending": self.pending,
            "max_queue": self.max_queue,
            "retrying": self._retrying,
            "rows_written": self.written,
            "rows_rejected": self.rejected,
            "rows_dropped": self.dropped,
            "rows_spilled": self.spilled,
            "rows_lost": self.lost,
            "usage_invalid": self.usage_invalid,
            "write_failures": self.write_failures,
            "write_retries": self.write_retries,
            "last_error": self._last_error,
            "reason": self._reason(),
            "failing_since": self._failing_since,
            "spill_path": self.spill_path,
            "token_counter": self._counter_state(),
            "audits_written": self.audits_written,
            "audits_rejected": self.audits_rejected,
            "audits_lost": self.audits_lost,
        }

    def _reason(self) -> str | None:
        """Why ``state`` is ``degraded``, in a few words (None while it is ``ok``)."""
        if self._failing_since is not None:
            return f"cannot write to the database ({self._last_reason or self._last_error})"
        if self.pending >= self.max_queue:
            return "the queue is full: new rows are dropped"
        if self.lost:
            return "rows were lost: neither the database nor the spill file took them"
        recent = self._last_incident is not None and (
            time.monotonic() - self._last_incident < DEGRADED_FOR_S
        )
        if recent:
            return f"rows were dropped or rejected in the last {DEGRADED_FOR_S:.0f} s"
        return None

    def _counter_state(self) -> str:
        ready = self.counter.ready
        if not ready.done():
            return "loading"
        return "ready" if not ready.cancelled() and ready.exception() is None else "failed"
