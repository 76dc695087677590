"""The ledger: one SQLite row per request, written off the request path by a single writer.

Requests hand their row to :meth:`Ledger.record`, which only appends to a thread-safe queue (and,
for a local answer, queues its counterfactual token count on the :class:`TokenCounter` thread).
One writer thread, with its own connection, drains the queue in batches: at most
``flush_interval_s`` after a row arrives, or as soon as ``batch_size`` rows wait, one
``BEGIN IMMEDIATE`` transaction writes them (WAL mode, ``synchronous=NORMAL``). Costs are
computed there, from the row's facts and the :class:`PriceBook`. The writer is a thread rather
than a task on the event loop so that a loop busy with requests cannot delay a commit.

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

- The database, not a row (``sqlite3.OperationalError``: locked, busy, ``database or disk is
  full``, I/O): the transaction is rolled back, its rows are held and tried again with backoff
  (0.1 s up to 2 s; ``write_retries``), as long as the database stays that way.
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

Shutdown (see ``proxy/http/app.py``'s lifespan and ``deploy/frugal-proxy.service``): after uvicorn
has drained the requests in flight (``[server] drain_s``), :meth:`Ledger.flush` writes every
row of a finished request before the engine is stopped, then :meth:`Ledger.close` writes the
rows that came during the engine's stop. Together they take at most ``[ledger]
shutdown_timeout_s`` (and one second more when the flush already used it all). While the
database stays locked they retry until that deadline; then every row still unwritten goes to
``<path>.rejected.jsonl`` (``"why": "unwritten"``) and the log says how many, so a stop loses no
row unless that file cannot be written either (``rows_lost``, logged as an error). A row
recorded after :meth:`close` goes straight to that file.

Each line of ``<path>.rejected.jsonl`` is ``{"why", "error", "at", "row"}``: ``row`` holds the
row's ledger columns as the writer got them (no prompt or completion text: the row has none),
so it can be inserted again once its problem is fixed.


The schema and its migrations are :mod:`proxy.ledger.migrate`'s.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import json
import math
import os
import queue
import sqlite3
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import structlog

from proxy.ledger.migrate import open_database, table_columns
from proxy.ledger.pricing import (
    CountJob,
    PriceBook,
    TokenCounter,
    apply_costs,
    check_money,
    check_usage,
    distrust_costs,
    load_price_map,
)

log = structlog.get_logger(__name__)

COLUMNS = (
    "request_id",
    "ts",
    "endpoint",
    "requested_model",
    "route",
    "reason",
    "status",
    "stream",
    "quality",
    "quality_reasons",
    "prompt_tokens",
    "completion_tokens",
    "local_prompt_tokens",
    "local_completion_tokens",
    "latency_ms",
    "local_ms",
    "api_ms",
    "api_cost_pusd",
    "counterfactual_cost_pusd",
    "error",
    # 0002_costs
    "api_model",
    "cached_tokens",
    "counterfactual_prompt_tokens",
    "counterfactual_completion_tokens",
    "token_source",
    "latency_tax_ms",
)
# Written when the table has them (added by later migrations of other features).
OPTIONAL_COLUMNS = (
    "key_name",
    # 0004_prediction
    "predicted_local_ms",
    "actual_local_ms",
    "backend",
    "predicted_completion_tokens",
    # 0006_attempts
    "upstream_attempts",
    "usage_invalid",
)
COUNT_UPDATE = (
    "UPDATE requests SET counterfactual_prompt_tokens = ?, counterfactual_completion_tokens = ?, "
    "token_source = ?, counterfactual_cost_pusd = ? WHERE id = ?"
)
BACKOFF_S = (0.1, 0.2, 0.5, 1.0, 2.0)
SPILL_SUFFIX = ".rejected.jsonl"
DEAD_LETTERS_KEPT = 100  # rejected rows remembered in memory (their request id and error class)
DEGRADED_FOR_S = 300.0  # /healthz says "degraded" this long after a row was dropped or rejected
# Columns with a default in the schema: a row that leaves them out gets the default, not NULL.
_DEFAULTS: dict[str, Any] = {
    "endpoint": "chat.completions",
    "stream": 0,
    "local_ms": 0.0,
    "api_ms": 0.0,
    "cached_tokens": 0,
}


@dataclass(slots=True, eq=False)
class _Entry:
    row: dict[str, Any]
    count: Future[tuple[int, int]] | None
    rowid: int | None = None
    checked: bool = False  # its usage was validated (and counted, if invalid)


@dataclass(slots=True, eq=False)
class _Update:
    """The count of a row that was written with an estimate, to apply now that it is known."""

    entry: _Entry


@dataclass(slots=True, eq=False)
class _Flush:
    """Asks the writer to write everything queued before it now; ``done`` is set once no row
    is queued ahead of it or held for retry."""

    done: Future[None]
    deadline: float  # time.monotonic(): no wait for a lock goes past it


@dataclass(slots=True, eq=False)
class _Stop:
    deadline: float  # time.monotonic() by which the last rows are written or spilled


def _transient(exc: BaseException) -> bool:
    """The database failed, not the row: locked, busy, full, I/O. Retried, never rejected."""
    return isinstance(exc, sqlite3.OperationalError)


class Ledger:
    """Batched, single-writer ledger. ``record`` never blocks and never raises.

    The writer is a thread of its own with its own connection: its batching does not wait on
    the event loop, so a busy loop cannot hold rows back. Counters are plain ints, each written
    by one thread (the writer, or the event loop for ``record``'s drops) and read by
    ``/healthz``.
    """

    def __init__(
        self,
        path: str,
        *,
        prices: PriceBook | None = None,
        counter: TokenCounter | None = None,
        flush_interval_s: float = 0.2,
        batch_size: int = 256,
        busy_timeout_s: float = 5.0,
        max_queue: int = 100_000,
        shutdown_timeout_s: float = 5.0,
        count_wait_s: float = 5.0,
    ):
        self.path = path
        self.spill_path = path + SPILL_SUFFIX
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
        self.dead_letters: collections.deque[dict[str, Any]] = collections.deque(
            maxlen=DEAD_LETTERS_KEPT
        )
        self._last_error: str | None = None
        self._last_incident: float | None = None  # monotonic time of the last drop or reject
        self._dropping = 0  # rows dropped in the current burst
        self._items: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._retained: list[_Entry] = []
        # Rows recorded (counted by record, on the event loop) and rows done with (written,
        # rejected or spilled, counted by the writer): each counter has one writer, so their
        # difference, the rows pending, is exact without a lock.
        self._accepted = 0
        self._done = 0
        self._retrying = 0  # ... of them, held after the database failed
        self._retained_updates: list[_Update] = []
        self._flushes: list[_Flush] = []
        self._awaiting: set[_Entry] = set()
        self._count_warned: set[tuple[str, str]] = set()
        self._failing_since: float | None = None
        self._deadline: float | None = None  # of a flush or the stop: bounds each lock wait
        self._busy_ms = -1
        self._thread: threading.Thread | None = None
        self._closed = False
        self._insert = ""
        self._columns: tuple[str, ...] = COLUMNS

    # -- life cycle ------------------------------------------------------------------------------

    async def start(self) -> None:
        await asyncio.to_thread(open_database, self.path, busy_timeout_s=self.busy_timeout_s)
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
        marker = _Flush(Future(), time.monotonic() + timeout_s)
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
            self._items.put(_Stop(time.monotonic() + timeout_s))
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
            late = [i for i in self._drain() if isinstance(i, _Entry)]
            self._done += len(late)
            if late:
                self._spill(late, "unwritten", None)
        self._closed = True
        self.counter.close()

    # -- the request side ------------------------------------------------------------------------

    def record(self, row: dict[str, Any], *, count: CountJob | None = None) -> None:
        """Queue one row. ``count`` asks for the counterfactual tokens of a local answer."""
        try:
            if self._closed:
                self._spill([_Entry(row, None)], "unwritten", None)
                return
            if self._accepted - self._done >= self.max_queue:
                self._drop()
                return
            if self._dropping:
                log.warning("ledger_queue_recovered", rows_dropped=self._dropping)
                self._dropping = 0
            future = self.counter.submit(count) if count is not None else None
            self._accepted += 1
            self._items.put(_Entry(row, future))
        except Exception as exc:  # noqa: BLE001 - a request never fails on its ledger row
            self.dropped += 1
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
            "failing_since": self._failing_since,
            "spill_path": self.spill_path,
            "token_counter": self._counter_state(),
        }

    def _counter_state(self) -> str:
        ready = self.counter.ready
        if not ready.done():
            return "loading"
        return "ready" if not ready.cancelled() and ready.exception() is None else "failed"

    # -- the writer thread -----------------------------------------------------------------------

    def _run(self, opened: Future[None]) -> None:
        try:
            conn = sqlite3.connect(self.path, timeout=self.busy_timeout_s, isolation_level=None)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            present = set(table_columns(conn))
            self._columns = COLUMNS + tuple(c for c in OPTIONAL_COLUMNS if c in present)
            self._insert = (
                f"INSERT INTO requests ({', '.join(self._columns)}) "
                f"VALUES ({', '.join('?' for _ in self._columns)})"
            )
        except BaseException as exc:  # noqa: BLE001 - handed to start()
            opened.set_exception(exc)
            return
        opened.set_result(None)
        try:
            failures = 0
            stop: _Stop | None = None
            items: list[Any] = []
            while stop is None:
                wait = BACKOFF_S[min(failures, len(BACKOFF_S)) - 1] if failures else None
                items, stop = self._collect(wait)
                if stop is not None:
                    break
                if items or self._retained or self._retained_updates:
                    ok = self._flush(conn, items)
                    failures = 0 if ok else failures + 1
                self._settle_flushes()
            self._wind_up(conn, items, stop.deadline)
        finally:
            self._settle_flushes(force=True)
            conn.close()

    def _collect(self, wait: float | None) -> tuple[list[Any], _Stop | None]:
        """The next batch: what arrives within ``flush_interval_s`` of the first row, or
        ``batch_size`` rows, or up to a flush request. ``wait`` (after a failed write) bounds
        the wait for a first row."""
        items: list[Any] = []
        deadline = None if wait is None else time.monotonic() + wait
        while len(items) < self.batch_size:
            if deadline is None:
                item = self._items.get()
            else:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                try:
                    item = self._items.get(timeout=remaining)
                except queue.Empty:
                    break
            if isinstance(item, _Stop):
                return items, item
            if isinstance(item, _Flush):
                self._add_flush(item)
                break
            items.append(item)
            if deadline is None:
                deadline = time.monotonic() + self.flush_interval_s
        return items, None

    def _drain(self) -> list[Any]:
        items: list[Any] = []
        while True:
            try:
                item = self._items.get_nowait()
            except queue.Empty:
                return items
            if isinstance(item, _Flush):
                self._add_flush(item)
            elif not isinstance(item, _Stop):
                items.append(item)

    def _add_flush(self, marker: _Flush) -> None:
        self._flushes.append(marker)
        self._deadline = min(self._deadline or marker.deadline, marker.deadline)

    def _settle_flushes(self, *, force: bool = False) -> None:
        if self._flushes and (force or not self._retained):
            for marker in self._flushes:
                if not marker.done.done():
                    marker.done.set_result(None)
            self._flushes = []
            self._deadline = None

    def _bound_lock_wait(self, conn: sqlite3.Connection) -> None:
        """While a flush or the stop has a deadline, no wait for a lock goes past it (at
        least 10 ms per attempt); otherwise a write waits ``busy_timeout_s``."""
        wait_s = self.busy_timeout_s
        if self._deadline is not None:
            wait_s = min(wait_s, self._deadline - time.monotonic())
        busy_ms = max(10, int(wait_s * 1000))
        if busy_ms != self._busy_ms:
            conn.execute(f"PRAGMA busy_timeout = {busy_ms}")
            self._busy_ms = busy_ms

    def _wind_up(self, conn: sqlite3.Connection, items: list[Any], deadline: float) -> None:
        """After the stop marker: wait for the counts still running (up to half the time
        left), then write the late rows and the updates, retrying until ``deadline``; what the
        database still refuses then is spilled."""
        self._deadline = deadline
        items = items + self._drain()
        queued = [i.count for i in items + self._retained if isinstance(i, _Entry) and i.count]
        waiting = queued + [e.count for e in self._awaiting if e.count is not None]
        if waiting:
            left = max(0.0, deadline - time.monotonic())
            concurrent.futures.wait(waiting, timeout=min(self.count_wait_s, left / 2))
        attempt = 0
        while True:
            items += self._drain()
            if not (items or self._retained or self._retained_updates):
                break
            if deadline - time.monotonic() <= 0:
                break
            if not self._flush(conn, items):
                pause = BACKOFF_S[min(attempt, len(BACKOFF_S) - 1)]
                time.sleep(max(0.0, min(pause, deadline - time.monotonic())))
            items = []
            attempt += 1
        unwritten = self._retained + [i for i in items if isinstance(i, _Entry)]
        updates = len(self._retained_updates) + sum(isinstance(i, _Update) for i in items)
        self._retained, self._retained_updates = [], []
        self._done += len(unwritten)
        self._retrying = 0
        if unwritten:
            self._spill(unwritten, "unwritten", None)
        if updates:
            log.warning(
                "ledger_counts_unapplied",
                rows=updates,
                detail="the database stayed unwritable; these rows keep the local model's count",
            )

    def _flush(self, conn: sqlite3.Connection, items: list[Any]) -> bool:
        """Write retained rows, new rows and count updates in one transaction; True on success.

        A failure of the database holds every row for a retry; any other failure is a row's,
        and the rows are tried one by one."""
        entries = self._retained + [i for i in items if isinstance(i, _Entry)]
        updates = self._retained_updates + [i for i in items if isinstance(i, _Update)]
        self._retained, self._retained_updates = [], []
        try:
            self._transaction(conn, entries, updates)
        except Exception as exc:  # noqa: BLE001 - the writer must outlive any surprise
            self.write_failures += 1
            self._last_error = type(exc).__name__
            if _transient(exc):
                self._hold(entries, updates, exc)
                return False
            log.warning("ledger_batch_refused", rows=len(entries), error=type(exc).__name__)
            return self._one_by_one(conn, entries, updates)
        self._succeeded(entries)
        return True

    def _transaction(
        self, conn: sqlite3.Connection, entries: list[_Entry], updates: list[_Update]
    ) -> None:
        ready: list[tuple[Any, ...]] = []
        estimated: list[tuple[_Entry, tuple[Any, ...]]] = []
        for entry in entries:
            values, final = self._values(entry)
            if final:
                ready.append(values)
            else:
                estimated.append((entry, values))
        changes = [change for change in map(self._count_update, updates) if change is not None]
        if conn.in_transaction:  # left open by a failure the rollback could not undo
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
        self._bound_lock_wait(conn)
        conn.execute("BEGIN IMMEDIATE")
        try:
            if ready:
                conn.executemany(self._insert, ready)
            for entry, values in estimated:
                entry.rowid = conn.execute(self._insert, values).lastrowid
            if changes:
                conn.executemany(COUNT_UPDATE, changes)
            conn.execute("COMMIT")
        except BaseException:
            for entry, _ in estimated:
                entry.rowid = None
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            raise

    def _succeeded(self, entries: list[_Entry]) -> None:
        self._done += len(entries)
        self._retrying = 0
        if entries and self._failing_since is not None:
            failing_for = round(time.time() - self._failing_since, 1)
            log.info("ledger_write_recovered", failing_for_s=failing_for)
            self._failing_since = None
        self.written += len(entries)  # after the rest: a reader that sees it sees them done
        for entry in entries:
            if entry.rowid is not None and entry.count is not None:
                self.estimated += 1
                self._awaiting.add(entry)
                entry.count.add_done_callback(self._count_arrived(_Update(entry)))

    def _count_arrived(self, update: _Update) -> Callable[[Future[tuple[int, int]]], None]:
        def arrived(_: Future[tuple[int, int]]) -> None:
            self._items.put(update)  # the writer applies it with its next batch

        return arrived

    def _hold(self, entries: list[_Entry], updates: list[_Update], exc: BaseException) -> None:
        """The database failed: keep the rows (``record`` bounds how many) for the next try."""
        if self._failing_since is None:
            self._failing_since = time.time()
        self._retained = entries
        self._retained_updates = updates
        self._retrying = len(entries)
        self.write_retries += 1  # last: a reader that sees it sees the rows held
        if self.write_retries == 1 or self.write_retries % 20 == 0:
            log.warning(
                "ledger_write_failed",
                error=type(exc).__name__,
                detail=str(exc),  # SQLite's own message: "database is locked", never a value
                rows_held=len(entries),
                attempts=self.write_retries,
            )

    def _one_by_one(
        self, conn: sqlite3.Connection, entries: list[_Entry], updates: list[_Update]
    ) -> bool:
        """Each row in a transaction of its own: the rows that fail alone are rejected, the
        others written; a failure of the database holds the rest for a retry."""
        good: list[_Entry] = []
        for n, entry in enumerate(entries):
            try:
                self._transaction(conn, [entry], [])
            except Exception as exc:  # noqa: BLE001 - one row's failure is that row's
                if _transient(exc):
                    self._succeeded(good)
                    self._hold(entries[n:], updates, exc)
                    return False
                self._reject(entry, exc)
                continue
            good.append(entry)
        self._succeeded(good)
        return self._apply_updates(conn, updates)

    def _apply_updates(self, conn: sqlite3.Connection, updates: list[_Update]) -> bool:
        """Count updates after a row-by-row pass: together, else one by one (an update that
        fails alone is given up: its row keeps the local model's count)."""
        if not updates:
            return True
        for batch in [updates] + ([[u] for u in updates] if len(updates) > 1 else []):
            try:
                self._transaction(conn, [], batch)
            except Exception as exc:  # noqa: BLE001 - one update's failure is that update's
                if _transient(exc):
                    self._hold([], updates, exc)
                    return False
                if len(batch) == 1:
                    log.error(
                        "ledger_count_refused",
                        request_id=batch[0].entry.row.get("request_id"),
                        error=type(exc).__name__,
                    )
                continue
            if batch is updates:
                return True
        return True

    def _reject(self, entry: _Entry, exc: BaseException) -> None:
        """Put one row aside: counted, remembered, spilled, logged (no value, only its class)."""
        self._done += 1
        self._last_error = type(exc).__name__
        self._last_incident = time.monotonic()
        request_id = entry.row.get("request_id")
        self.dead_letters.append(
            {"request_id": request_id, "error": type(exc).__name__, "at": time.time()}
        )
        self.rejected += 1
        log.error("ledger_row_rejected", request_id=request_id, error=type(exc).__name__)
        self._spill([entry], "rejected", exc)

    def _spill(self, entries: list[_Entry], why: str, exc: BaseException | None) -> bool:
        """Append the rows to ``<path>.rejected.jsonl`` (one JSON line each, synced)."""
        at = time.time()
        error = type(exc).__name__ if exc is not None else None
        lines = "".join(
            json.dumps({"why": why, "error": error, "at": at, "row": _spill_row(e.row)}) + "\n"
            for e in entries
        )
        try:
            fd = os.open(self.spill_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                os.write(fd, lines.encode("utf-8"))
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as failure:
            self.lost += len(entries)
            log.error(
                "ledger_rows_lost",
                rows=len(entries),
                why=why,
                error=type(failure).__name__,
                path=self.spill_path,
                detail="neither the database nor the spill file took these rows",
            )
            return False
        if why == "unwritten":
            self.spilled += len(entries)
            log.error(
                "ledger_rows_spilled",
                rows=len(entries),
                path=self.spill_path,
                detail="the database stayed unwritable past the deadline; the rows are in "
                "this file, one JSON line each, to insert again",
            )
        return True

    # -- one row ---------------------------------------------------------------------------------

    def _values(self, entry: _Entry) -> tuple[tuple[Any, ...], bool]:
        """The row's values in column order, and whether they are final (False: the
        counterfactual count is still running and the local model's count stands in)."""
        row = {**_DEFAULTS, **entry.row}
        invalid = check_usage(row)
        final = True
        route = row.get("route")
        if route == "api":
            row["latency_tax_ms"] = round(float(row.get("local_ms") or 0.0), 2)
            if row.get("prompt_tokens") is not None:
                row["counterfactual_prompt_tokens"] = row["prompt_tokens"]
                row["counterfactual_completion_tokens"] = row.get("completion_tokens") or 0
                row["token_source"] = "usage"
        else:
            row["latency_tax_ms"] = 0.0
            counted = _result(entry.count)
            if counted is not None:
                row["counterfactual_prompt_tokens"], row["counterfactual_completion_tokens"] = (
                    counted
                )
                row["token_source"] = "tokenizer"
            elif row.get("prompt_tokens") is not None:
                row["counterfactual_prompt_tokens"] = row["prompt_tokens"]
                row["counterfactual_completion_tokens"] = row.get("completion_tokens") or 0
                row["token_source"] = "local"
                final = entry.count is None or entry.count.done()
                if entry.count is not None and entry.count.done():
                    self._count_failed(entry.count, row.get("requested_model"))
        apply_costs(row, self.prices)
        distrust_costs(row, invalid)
        invalid += check_money(row)
        if invalid:
            row["usage_invalid"] = ",".join(invalid)
            if not entry.checked:
                self.usage_invalid += 1
                if self.usage_invalid == 1 or self.usage_invalid % 100 == 0:
                    log.warning(
                        "ledger_usage_invalid",
                        request_id=row.get("request_id"),
                        fields=row["usage_invalid"],
                        rows_so_far=self.usage_invalid,
                        detail="stored as NULL; the row's costs are unknown",
                    )
        entry.checked = True
        return tuple(row.get(column) for column in self._columns), final

    def _count_update(self, update: _Update) -> tuple[Any, ...] | None:
        entry = update.entry
        self._awaiting.discard(entry)
        counted = _result(entry.count)
        if counted is None or entry.rowid is None:
            if entry.count is not None:
                self._count_failed(entry.count, entry.row.get("requested_model"))
            return None
        row = dict(entry.row)
        row["counterfactual_prompt_tokens"], row["counterfactual_completion_tokens"] = counted
        apply_costs(row, self.prices)
        return (*counted, "tokenizer", row["counterfactual_cost_pusd"], entry.rowid)

    def _count_failed(self, future: Future[tuple[int, int]], model: Any) -> None:
        """Log a failed count once per model and error kind."""
        exc = None if future.cancelled() else future.exception()
        kind = (str(model), type(exc).__name__)
        if exc is not None and kind not in self._count_warned:
            self._count_warned.add(kind)
            log.warning(
                "token_count_failed",
                model=model,
                error=type(exc).__name__,
                detail=str(exc)[:200] + "; the local model's own count stands in "
                "(token_source = 'local')",
            )


def _result(future: Future[tuple[int, int]] | None) -> tuple[int, int] | None:
    if future is None or not future.done() or future.cancelled() or future.exception():
        return None
    return future.result()


def _spill_row(row: dict[str, Any]) -> dict[str, Any]:
    """The row's ledger columns, as JSON can hold them; other keys (none carry content today)
    and values of other types (shown by their type's name) are left out."""
    out: dict[str, Any] = {}
    for column in COLUMNS + OPTIONAL_COLUMNS:
        if column not in row:
            continue
        value = row[column]
        if value is None or isinstance(value, str | int | bool):
            out[column] = value
        elif isinstance(value, float):
            out[column] = value if math.isfinite(value) else repr(value)
        else:
            out[column] = f"<{type(value).__name__}>"
    return out
