"""The writer thread's writes: one batch in one transaction, and what it does when that fails.

:class:`Flusher` is the half of :class:`~proxy.ledger.writing.batching.WriterThread` that touches
the database. A batch (new rows, audit rows, count updates) is written in one transaction:

- the database fails (the store says transient): the rows are held for the next try
  (:meth:`Flusher._hold`), counted in ``write_retries``;
- anything else is a row's failure: the batch is tried row by row, and each row that still fails
  is rejected: counted, remembered in ``dead_letters``, and spilled to ``<path>.rejected.jsonl``;
- audit rows go in a transaction of their own, and are never spilled;
- a row written with the local model's count while its tokenizer count ran is updated with the
  next batch once the count arrives (:class:`Update`).
"""

from __future__ import annotations

import collections
import queue
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import structlog

from proxy.ledger.db.location import Database
from proxy.ledger.pricing import PriceBook
from proxy.ledger.writing import spill
from proxy.ledger.writing.ledger_row import LedgerRow
from proxy.ledger.writing.rows import count_update, result, row_values
from proxy.ledger.writing.storage import Store

log = structlog.get_logger("proxy.ledger.writing.writer")


@dataclass(slots=True, eq=False)
class Entry:
    row: LedgerRow
    count: Future[tuple[int, int]] | None
    rowid: int | None = None
    checked: bool = False  # its usage was validated (and counted, if invalid)


@dataclass(slots=True, eq=False)
class AuditEntry:
    """One row of the ``audits`` table (:mod:`proxy.ledger.audits.table`)."""

    row: dict[str, Any]


@dataclass(slots=True, eq=False)
class Update:
    """The count of a row that was written with an estimate, to apply now that it is known."""

    entry: Entry


class Flusher:
    """Writes batches on the writer thread; the loop that feeds it is
    :class:`~proxy.ledger.writing.batching.WriterThread`."""

    database: Database
    prices: PriceBook
    busy_timeout_s: float
    spill_path: str
    written: int
    write_failures: int
    write_retries: int
    rejected: int
    spilled: int
    lost: int
    usage_invalid: int
    estimated: int
    dead_letters: collections.deque[dict[str, Any]]
    _last_error: str | None
    _last_reason: str | None
    _last_incident: float | None
    _items: queue.SimpleQueue[Any]
    _retained: list[Entry]
    _retained_updates: list[Update]
    _retained_audits: list[AuditEntry]
    audits_written: int
    audits_rejected: int
    audits_lost: int
    _awaiting: set[Entry]
    _count_warned: set[tuple[str, str]]
    _failing_since: float | None
    _deadline: float | None
    _done: int
    _retrying: int
    _store: Store | None

    def _flush(self, store: Store, items: list[Any]) -> bool:
        """Write retained rows, new rows and count updates in one transaction; True on success.

        A failure of the database holds every row for a retry; any other failure is a row's,
        and the rows are tried one by one."""
        audits = self._retained_audits + [i for i in items if isinstance(i, AuditEntry)]
        self._retained_audits = []
        if audits:
            self._write_audits(store, audits)
        entries = self._retained + [i for i in items if isinstance(i, Entry)]
        updates = self._retained_updates + [i for i in items if isinstance(i, Update)]
        self._retained, self._retained_updates = [], []
        if not (entries or updates):
            return not self._retained_audits
        try:
            self._transaction(store, entries, updates)
        except Exception as exc:  # noqa: BLE001 - the writer must outlive any surprise
            self.write_failures += 1
            self._last_error = type(exc).__name__
            if store.transient(exc):
                self._hold(store, entries, updates, exc)
                return False
            log.warning("ledger_batch_refused", rows=len(entries), error=type(exc).__name__)
            return self._one_by_one(store, entries, updates)
        self._succeeded(entries)
        return True

    def _write_audits(self, store: Store, audits: list[AuditEntry]) -> None:
        """Audit rows in a transaction of their own: held for a retry when the database
        failed; one by one when a row did, each failing row counted and logged (its request id
        and error class only), never spilled (an audit is a sample, not money)."""
        store.bound_wait(self._deadline)
        try:
            store.write_audits([a.row for a in audits])
        except Exception as exc:  # noqa: BLE001 - the writer must outlive any surprise
            if store.transient(exc):
                self._retained_audits = audits
                return
            for audit in audits:
                try:
                    store.write_audits([audit.row])
                except Exception as one:  # noqa: BLE001 - this row's failure
                    if store.transient(one):
                        self._retained_audits.append(audit)
                        continue
                    self.audits_rejected += 1
                    log.error(
                        "ledger_audit_rejected",
                        request_id=audit.row.get("request_id"),
                        error=type(one).__name__,
                    )
                else:
                    self.audits_written += 1
            return
        self.audits_written += len(audits)

    def _transaction(self, store: Store, entries: list[Entry], updates: list[Update]) -> None:
        ready: list[tuple[Any, ...]] = []
        estimated: list[tuple[Entry, tuple[Any, ...]]] = []
        for entry in entries:
            values, final = self._values(store, entry)
            if final:
                ready.append(values)
            else:
                estimated.append((entry, values))
        changes = [change for change in map(self._count_update, updates) if change is not None]
        store.bound_wait(self._deadline)
        ids = store.write(ready, [values for _, values in estimated], changes)
        for (entry, _), rowid in zip(estimated, ids, strict=True):
            entry.rowid = rowid

    def _succeeded(self, entries: list[Entry]) -> None:
        self._done += len(entries)
        self._retrying = 0
        if entries and self._failing_since is not None:
            failing_for = round(time.time() - self._failing_since, 1)
            log.info("ledger_write_recovered", failing_for_s=failing_for)
            self._failing_since = None
            self._last_reason = None
        self.written += len(entries)  # after the rest: a reader that sees it sees them done
        for entry in entries:
            if entry.rowid is not None and entry.count is not None:
                self.estimated += 1
                self._awaiting.add(entry)
                entry.count.add_done_callback(self._count_arrived(Update(entry)))

    def _count_arrived(self, update: Update) -> Callable[[Future[tuple[int, int]]], None]:
        def arrived(_: Future[tuple[int, int]]) -> None:
            self._items.put(update)  # the writer applies it with its next batch

        return arrived

    def _hold(
        self, store: Store, entries: list[Entry], updates: list[Update], exc: BaseException
    ) -> None:
        """The database failed: keep the rows (``record`` bounds how many) for the next try."""
        if self._failing_since is None:
            self._failing_since = time.time()
        self._retained = entries
        self._retained_updates = updates
        self._retrying = len(entries)
        self._last_reason = store.reason(exc)
        self.write_retries += 1  # last: a reader that sees it sees the rows held
        if self.write_retries == 1 or self.write_retries % 20 == 0:
            log.warning(
                "ledger_write_failed",
                error=type(exc).__name__,
                detail=self._last_reason,  # the database's own words, never a row's value
                rows_held=len(entries),
                attempts=self.write_retries,
            )

    def _one_by_one(self, store: Store, entries: list[Entry], updates: list[Update]) -> bool:
        """Each row in a transaction of its own: the rows that fail alone are rejected, the
        others written; a failure of the database holds the rest for a retry."""
        good: list[Entry] = []
        for n, entry in enumerate(entries):
            try:
                self._transaction(store, [entry], [])
            except Exception as exc:  # noqa: BLE001 - one row's failure is that row's
                if store.transient(exc):
                    self._succeeded(good)
                    self._hold(store, entries[n:], updates, exc)
                    return False
                self._reject(entry, exc)
                continue
            good.append(entry)
        self._succeeded(good)
        return self._apply_updates(store, updates)

    def _apply_updates(self, store: Store, updates: list[Update]) -> bool:
        """Count updates after a row-by-row pass: together, else one by one (an update that
        fails alone is given up: its row keeps the local model's count)."""
        if not updates:
            return True
        for batch in [updates] + ([[u] for u in updates] if len(updates) > 1 else []):
            try:
                self._transaction(store, [], batch)
            except Exception as exc:  # noqa: BLE001 - one update's failure is that update's
                if store.transient(exc):
                    self._hold(store, [], updates, exc)
                    return False
                if len(batch) == 1:
                    log.error(
                        "ledger_count_refused",
                        request_id=batch[0].entry.row.request_id,
                        error=type(exc).__name__,
                    )
                continue
            if batch is updates:
                return True
        return True

    def _reject(self, entry: Entry, exc: BaseException) -> None:
        """Put one row aside: counted, remembered, spilled, logged (no value, only its class)."""
        self._done += 1
        self._last_error = type(exc).__name__
        self._last_incident = time.monotonic()
        request_id = entry.row.request_id
        self.dead_letters.append(
            {"request_id": request_id, "error": type(exc).__name__, "at": time.time()}
        )
        self.rejected += 1
        log.error("ledger_row_rejected", request_id=request_id, error=type(exc).__name__)
        self._spill([entry], "rejected", exc)

    def _spill(self, entries: list[Entry], why: str, exc: BaseException | None) -> bool:
        """Append the rows to ``<path>.rejected.jsonl`` (one JSON line each, synced)."""
        error = type(exc).__name__ if exc is not None else None
        try:
            spill.append(self.spill_path, [e.row.as_dict() for e in entries], why, error)
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

    def _values(self, store: Store, entry: Entry) -> tuple[tuple[Any, ...], bool]:
        values, final, invalid = row_values(entry.row, entry.count, self.prices, store.columns)
        count = entry.count
        if count is not None and count.done() and result(count) is None:
            if entry.row.route != "api":
                self._count_failed(count, entry.row.requested_model)
        if invalid and not entry.checked:
            self.usage_invalid += 1
            if self.usage_invalid == 1 or self.usage_invalid % 100 == 0:
                log.warning(
                    "ledger_usage_invalid",
                    request_id=entry.row.request_id,
                    fields=invalid,
                    rows_so_far=self.usage_invalid,
                    detail="stored as NULL; the row's costs are unknown",
                )
        entry.checked = True
        return values, final

    def _count_update(self, update: Update) -> tuple[Any, ...] | None:
        entry = update.entry
        self._awaiting.discard(entry)
        counted = result(entry.count)
        if counted is None or entry.rowid is None:
            if entry.count is not None:
                self._count_failed(entry.count, entry.row.requested_model)
            return None
        return count_update(entry.row, counted, entry.rowid, self.prices)

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
