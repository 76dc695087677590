"""The ledger's writer thread: its loop, which gathers batches, and its wind-up at shutdown.

One thread owns the :class:`~proxy.ledger.writing.storage.Store` (one connection). It drains the
queue that :meth:`Ledger.record` fills: at most ``flush_interval_s`` after a row arrives, or as soon
as ``batch_size`` rows wait, or up to a flush request, it writes the batch in one transaction
(:mod:`proxy.ledger.writing.flush`). After a failed write it tries again with backoff (0.1 s up to 2
s), for as long as it takes; a lost PostgreSQL connection is opened again at each attempt.

After the stop marker it waits for the counts still running, writes what is left until the
deadline, and spills the rest. :class:`WriterThread` is the half of :class:`Ledger` that runs
on this thread; the counters it moves are read by ``/healthz``.
"""

from __future__ import annotations

import concurrent.futures
import queue
import time
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import structlog

from proxy.ledger.writing.flush import Entry, Flusher, Update
from proxy.ledger.writing.storage import Store, open_store

log = structlog.get_logger("proxy.ledger.writing.writer")

BACKOFF_S = (0.1, 0.2, 0.5, 1.0, 2.0)


@dataclass(slots=True, eq=False)
class FlushMarker:
    """Asks the writer to write everything queued before it now; ``done`` is set once no row
    is queued ahead of it or held for retry."""

    done: Future[None]
    deadline: float  # time.monotonic(): no wait for a lock goes past it


@dataclass(slots=True, eq=False)
class StopMarker:
    deadline: float  # time.monotonic() by which the last rows are written or spilled


class WriterThread(Flusher):
    """What runs on the writer thread. :class:`~proxy.ledger.writing.writer.Ledger` sets the
    fields."""

    batch_size: int
    flush_interval_s: float
    count_wait_s: float
    _flushes: list[FlushMarker]

    def _run(self, opened: Future[None]) -> None:
        try:
            store = open_store(self.database, busy_timeout_s=self.busy_timeout_s)
        except BaseException as exc:  # noqa: BLE001 - handed to start()
            opened.set_exception(exc)
            return
        self._store = store
        opened.set_result(None)
        try:
            failures = 0
            stop: StopMarker | None = None
            items: list[Any] = []
            while stop is None:
                wait = BACKOFF_S[min(failures, len(BACKOFF_S)) - 1] if failures else None
                items, stop = self._collect(wait)
                if stop is not None:
                    break
                if items or self._retained or self._retained_updates or self._retained_audits:
                    ok = self._flush(store, items)
                    failures = 0 if ok else failures + 1
                self._settle_flushes()
            self._wind_up(store, items, stop.deadline)
        finally:
            self._settle_flushes(force=True)
            store.close()

    def _collect(self, wait: float | None) -> tuple[list[Any], StopMarker | None]:
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
            if isinstance(item, StopMarker):
                return items, item
            if isinstance(item, FlushMarker):
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
            if isinstance(item, FlushMarker):
                self._add_flush(item)
            elif not isinstance(item, StopMarker):
                items.append(item)

    def _add_flush(self, marker: FlushMarker) -> None:
        self._flushes.append(marker)
        self._deadline = min(self._deadline or marker.deadline, marker.deadline)

    def _settle_flushes(self, *, force: bool = False) -> None:
        if self._flushes and (force or not self._retained):
            for marker in self._flushes:
                if not marker.done.done():
                    marker.done.set_result(None)
            self._flushes = []
            self._deadline = None

    def _wind_up(self, store: Store, items: list[Any], deadline: float) -> None:
        """After the stop marker: wait for the counts still running (up to half the time
        left), then write the late rows and the updates, retrying until ``deadline``; what the
        database still refuses then is spilled."""
        self._deadline = deadline
        items = items + self._drain()
        queued = [i.count for i in items + self._retained if isinstance(i, Entry) and i.count]
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
            if not self._flush(store, items):
                pause = BACKOFF_S[min(attempt, len(BACKOFF_S) - 1)]
                time.sleep(max(0.0, min(pause, deadline - time.monotonic())))
            items = []
            attempt += 1
        if self._retained_audits:
            self.audits_lost += len(self._retained_audits)
            log.error("ledger_audits_unwritten", rows=len(self._retained_audits))
            self._retained_audits = []
        unwritten = self._retained + [i for i in items if isinstance(i, Entry)]
        updates = len(self._retained_updates) + sum(isinstance(i, Update) for i in items)
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
