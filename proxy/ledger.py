"""The ledger: one SQLite row per request, written off the request path by a single writer.

Requests hand their row to :meth:`Ledger.record`, which only appends to a thread-safe queue (and,
for a local answer, queues its counterfactual token count on the :class:`TokenCounter` thread).
One writer thread, with its own connection, drains the queue in batches: at most
``flush_interval_s`` after a row arrives, or as soon as ``batch_size`` rows wait, one
``BEGIN IMMEDIATE`` transaction writes them (WAL mode, ``synchronous=NORMAL``). Costs are
computed there, from the row's facts and the :class:`PriceBook`. The writer is a thread rather
than a task on the event loop so that a loop busy with requests cannot delay a commit.
:meth:`Ledger.close` writes what is left; the server calls it on SIGTERM, after the last
response went out.

Durability: a row is committed about ``flush_interval_s`` plus one write after its response
was handed to the server, so after a ``kill -9`` every request that completed more than a
second earlier is in the database (``bench/ledger_kill9.py`` measures the window; see
``bench/README.md``). WAL with ``synchronous=NORMAL`` survives a killed process; after a power
cut the last commits may be lost.

Counts that are not ready when their row is written (litellm still importing at start-up, or a
tokenizer being fetched) do not hold the row back: it is written with the local model's own
counts (``token_source = 'local'``) and updated when the count arrives.

Write failures never reach a request and never drop a row silently. A failed transaction is
rolled back and its rows are kept and tried again with backoff (``write_failures`` counts the
failed attempts, ``retrying`` the rows held). A row the database refuses on its own (a bad value)
is set aside alone and counted in ``dropped``, as are rows beyond ``max_retained`` while the
database stays unwritable. All of it is in ``/healthz`` and in the log.

Migrations are the numbered ``migrations/NNNN_name.sql`` files, applied in order at start-up and
recorded in the ``_migrations`` table; a landed file is never edited, a change is a new file.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import importlib.resources
import queue
import sqlite3
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from proxy.errors import ConfigError
from proxy.pricing import CountJob, PriceBook, TokenCounter, apply_costs, load_price_map

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
)
COUNT_UPDATE = (
    "UPDATE requests SET counterfactual_prompt_tokens = ?, counterfactual_completion_tokens = ?, "
    "token_source = ?, counterfactual_cost_pusd = ? WHERE id = ?"
)
BACKOFF_S = (0.1, 0.2, 0.5, 1.0, 2.0)
# Columns with a default in the schema: a row that leaves them out gets the default, not NULL.
_DEFAULTS: dict[str, Any] = {
    "endpoint": "chat.completions",
    "stream": 0,
    "local_ms": 0.0,
    "api_ms": 0.0,
    "cached_tokens": 0,
}


def migration_files() -> list[tuple[str, str]]:
    """(name, sql) of every migration, in order."""
    root = importlib.resources.files("proxy.migrations")
    files = sorted(
        (entry.name, entry.read_text(encoding="utf-8"))
        for entry in root.iterdir()
        if entry.name.endswith(".sql")
    )
    return files


def migrate(conn: sqlite3.Connection, upto: str | None = None) -> list[str]:
    """Apply the migrations this database has not seen yet (up to and including ``upto``, if
    given); returns their names."""
    conn.execute(
        "CREATE TABLE IF NOT EXISTS _migrations (name TEXT PRIMARY KEY, applied_at REAL NOT NULL)"
    )
    done = applied_migrations(conn)
    applied = []
    for name, sql in migration_files():
        if upto is not None and name > upto:
            break
        if name in done:
            continue
        conn.execute("BEGIN IMMEDIATE")
        try:
            for statement in _statements(sql):
                conn.execute(statement)
            conn.execute("INSERT INTO _migrations VALUES (?, ?)", (name, time.time()))
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        applied.append(name)
    return applied


def applied_migrations(conn: sqlite3.Connection) -> set[str]:
    return {row[0] for row in conn.execute("SELECT name FROM _migrations")}


def _statements(sql: str) -> list[str]:
    """Split a migration into statements, a trigger's ``BEGIN … END`` staying whole. Comments
    are ``--`` to the end of a line (our migrations hold no ``--`` inside strings)."""
    statements, current = [], ""
    for line in sql.splitlines():
        current += line.split("--", 1)[0] + "\n"
        if sqlite3.complete_statement(current):
            statements.append(current.strip())
            current = ""
    if current.strip():
        statements.append(current.strip())
    return statements


def open_database(path: str, *, busy_timeout_s: float = 5.0) -> None:
    """Create or upgrade the database file and check that it can be written.

    Raises a :class:`ConfigError` that says what is wrong: a missing folder, a file that is not
    a SQLite database (or is damaged), or a database another process keeps locked.
    """
    target = Path(path)
    if target.parent and not target.parent.exists():
        raise ConfigError(f"[ledger] path = {path!r}: the folder {target.parent} does not exist")
    if target.is_dir():
        raise ConfigError(f"[ledger] path = {path!r}: is a folder, expected a database file")
    try:
        conn = sqlite3.connect(path, timeout=busy_timeout_s, isolation_level=None)
        try:
            conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
            conn.execute("PRAGMA journal_mode=WAL")
            migrate(conn)
            # Take the write lock once, so that a database held by another writer fails here.
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("ROLLBACK")
        finally:
            conn.close()
    except sqlite3.OperationalError as exc:
        if "locked" in str(exc) or "busy" in str(exc):
            raise ConfigError(
                f"[ledger] path = {path!r}: the database is locked by another process (is "
                f"another `frugal serve` using it?); waited {busy_timeout_s:g} s"
            ) from exc
        raise ConfigError(f"[ledger] path = {path!r}: cannot open the database ({exc})") from exc
    except sqlite3.DatabaseError as exc:
        raise ConfigError(
            f"[ledger] path = {path!r}: not a usable SQLite database ({exc}); "
            "move the file aside or point [ledger] path elsewhere"
        ) from exc


def table_columns(conn: sqlite3.Connection, table: str = "requests") -> list[str]:
    return [row[1] for row in conn.execute(f"PRAGMA table_info({table})")]


@dataclass(slots=True, eq=False)
class _Entry:
    row: dict[str, Any]
    count: Future[tuple[int, int]] | None
    rowid: int | None = None


@dataclass(slots=True, eq=False)
class _Update:
    """The count of a row that was written with an estimate, to apply now that it is known."""

    entry: _Entry


_STOP = object()


class Ledger:
    """Batched, single-writer ledger. ``record`` never blocks and never raises.

    The writer is a thread of its own with its own connection: its batching does not wait on
    the event loop, so a busy loop cannot hold rows back. Counters are plain ints written by
    that thread and read by ``/healthz``.
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
        max_retained: int = 100_000,
        count_wait_s: float = 5.0,
    ):
        self.path = path
        self.prices = prices if prices is not None else PriceBook(load_price_map())
        self.counter = counter if counter is not None else TokenCounter()
        self.flush_interval_s = flush_interval_s
        self.batch_size = batch_size
        self.busy_timeout_s = busy_timeout_s
        self.max_retained = max_retained
        self.count_wait_s = count_wait_s
        self.written = 0
        self.write_failures = 0
        self.dropped = 0
        self.estimated = 0
        self._items: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._retained: list[_Entry] = []
        self._retained_updates: list[_Update] = []
        self._awaiting: set[_Entry] = set()
        self._count_warned: set[tuple[str, str]] = set()
        self._failing_since: float | None = None
        self._thread: threading.Thread | None = None
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

    async def close(self) -> None:
        """Write every row still queued (and the counts still running, for up to
        ``count_wait_s``), then close the database."""
        thread, self._thread = self._thread, None
        if thread is not None:
            self._items.put(_STOP)
            await asyncio.to_thread(thread.join)
        self.counter.close()

    # -- the request side ------------------------------------------------------------------------

    def record(self, row: dict[str, Any], *, count: CountJob | None = None) -> None:
        """Queue one row. ``count`` asks for the counterfactual tokens of a local answer."""
        future = self.counter.submit(count) if count is not None else None
        self._items.put(_Entry(row, future))

    @property
    def pending(self) -> int:
        """Rows recorded but not written yet (queued, or held after a failed write)."""
        return self._items.qsize() + len(self._retained)

    def health(self) -> dict[str, Any]:
        return {
            "written": self.written,
            "pending": self.pending,
            "retrying": len(self._retained),
            "write_failures": self.write_failures,
            "dropped": self.dropped,
            "failing_since": self._failing_since,
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
            while True:
                wait = BACKOFF_S[min(failures, len(BACKOFF_S)) - 1] if failures else None
                items, stop = self._collect(wait)
                if stop:
                    break
                if items or self._retained or self._retained_updates:
                    ok = self._flush(conn, items)
                    failures = 0 if ok else failures + 1
            self._wind_up(conn, items)
        finally:
            conn.close()

    def _collect(self, wait: float | None) -> tuple[list[Any], bool]:
        """The next batch: what arrives within ``flush_interval_s`` of the first row, or
        ``batch_size`` rows. ``wait`` (after a failed write) bounds the wait for a first row."""
        items: list[Any] = []
        if wait is None:
            first = self._items.get()
            if first is _STOP:
                return items, True
            items.append(first)
            wait = self.flush_interval_s
        deadline = time.monotonic() + wait
        while len(items) < self.batch_size:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                item = self._items.get(timeout=remaining)
            except queue.Empty:
                break
            if item is _STOP:
                return items, True
            items.append(item)
        return items, False

    def _drain(self) -> list[Any]:
        items: list[Any] = []
        while True:
            try:
                item = self._items.get_nowait()
            except queue.Empty:
                return items
            if item is not _STOP:
                items.append(item)

    def _wind_up(self, conn: sqlite3.Connection, items: list[Any]) -> None:
        """After the stop marker: wait for the counts still running, then write the late rows
        and the updates, retrying a few times; what still fails is counted as dropped."""
        items = items + self._drain()
        queued = [i.count for i in items + self._retained if isinstance(i, _Entry) and i.count]
        waiting = queued + [e.count for e in self._awaiting if e.count is not None]
        if waiting:
            concurrent.futures.wait(waiting, timeout=self.count_wait_s)
        conn.execute(f"PRAGMA busy_timeout = {min(1000, int(self.busy_timeout_s * 1000))}")
        for attempt in range(len(BACKOFF_S) + 1):
            items += self._drain()
            if not (items or self._retained or self._retained_updates):
                break
            if attempt:
                time.sleep(BACKOFF_S[attempt - 1])
            self._flush(conn, items)
            items = []
        lost = len(self._retained)
        if lost:
            self.dropped += lost
            log.error("ledger_rows_lost", rows=lost, detail="the database stayed unwritable")
            self._retained = []

    def _flush(self, conn: sqlite3.Connection, items: list[Any]) -> bool:
        """Write retained rows, new rows and count updates in one transaction; True on success."""
        entries = self._retained + [i for i in items if isinstance(i, _Entry)]
        updates = self._retained_updates + [i for i in items if isinstance(i, _Update)]
        self._retained, self._retained_updates = [], []
        try:
            self._transaction(conn, entries, updates)
        except sqlite3.OperationalError as exc:
            self._failed(entries, updates, exc)
            return False
        except sqlite3.Error as exc:
            # The database refused a value, not the write: find the rows it refuses, keep the rest.
            log.warning("ledger_batch_refused", rows=len(entries), error=str(exc))
            return self._one_by_one(conn, entries, updates)
        except Exception as exc:  # noqa: BLE001 - the writer must outlive any surprise
            log.error("ledger_write_error", error=type(exc).__name__, detail=str(exc))
            self._failed(entries, updates, exc)
            return False
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
        self.written += len(entries)
        if self._failing_since is not None:
            failing_for = round(time.time() - self._failing_since, 1)
            log.info("ledger_write_recovered", failing_for_s=failing_for)
            self._failing_since = None
        for entry in entries:
            if entry.rowid is not None and entry.count is not None:
                self.estimated += 1
                self._awaiting.add(entry)
                entry.count.add_done_callback(self._count_arrived(_Update(entry)))

    def _count_arrived(self, update: _Update) -> Callable[[Future[tuple[int, int]]], None]:
        def arrived(_: Future[tuple[int, int]]) -> None:
            self._items.put(update)  # the writer applies it with its next batch

        return arrived

    def _failed(self, entries: list[_Entry], updates: list[_Update], exc: BaseException) -> None:
        self.write_failures += 1
        if self._failing_since is None:
            self._failing_since = time.time()
        overflow = len(entries) - self.max_retained
        if overflow > 0:
            self.dropped += overflow
            del entries[:overflow]
            log.error("ledger_rows_dropped", rows=overflow, detail="too many rows held for retry")
        self._retained = entries
        self._retained_updates = updates
        log.warning(
            "ledger_write_failed",
            error=str(exc),
            rows_held=len(self._retained),
            attempts=self.write_failures,
        )

    def _one_by_one(
        self, conn: sqlite3.Connection, entries: list[_Entry], updates: list[_Update]
    ) -> bool:
        good: list[_Entry] = []
        for n, entry in enumerate(entries):
            try:
                self._transaction(conn, [entry], [])
            except sqlite3.OperationalError as exc:
                self._succeeded(good)
                self._failed(entries[n:], updates, exc)
                return False
            except sqlite3.Error as exc:
                self.dropped += 1
                log.error(
                    "ledger_row_refused", request_id=entry.row.get("request_id"), error=str(exc)
                )
                continue
            good.append(entry)
        self._succeeded(good)
        if updates:
            return self._flush(conn, list(updates))
        return True

    # -- one row ---------------------------------------------------------------------------------

    def _values(self, entry: _Entry) -> tuple[tuple[Any, ...], bool]:
        """The row's values in column order, and whether they are final (False: the
        counterfactual count is still running and the local model's count stands in)."""
        row = {**_DEFAULTS, **entry.row}
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
