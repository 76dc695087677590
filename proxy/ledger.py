"""The ledger: one SQLite row per request, written off the request path by a single writer.

Requests hand their row to :meth:`Ledger.record`, which only appends to an in-memory queue. One
writer task drains the queue in batches (one transaction per batch, WAL mode), so a burst of
requests costs a few fsyncs, not one each. :meth:`Ledger.close` drains what is left; the server
calls it on SIGTERM, after the last response went out.

Migrations are the numbered ``migrations/NNNN_name.sql`` files, applied in order at start-up and
recorded in the ``_migrations`` table; a landed file is never edited, a change is a new file.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.resources
import sqlite3
import time
from pathlib import Path
from typing import Any

import aiosqlite
import structlog

from proxy.errors import ConfigError

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
)
INSERT = f"INSERT INTO requests ({', '.join(COLUMNS)}) VALUES ({', '.join('?' for _ in COLUMNS)})"


def migration_files() -> list[tuple[str, str]]:
    """(name, sql) of every migration, in order."""
    root = importlib.resources.files("proxy.migrations")
    files = sorted(
        (entry.name, entry.read_text(encoding="utf-8"))
        for entry in root.iterdir()
        if entry.name.endswith(".sql")
    )
    return files


def migrate(conn: sqlite3.Connection) -> list[str]:
    """Apply the migrations this database has not seen yet; returns their names."""
    conn.execute(
        "CREATE TABLE IF NOT EXISTS _migrations (name TEXT PRIMARY KEY, applied_at REAL NOT NULL)"
    )
    done = {row[0] for row in conn.execute("SELECT name FROM _migrations")}
    applied = []
    for name, sql in migration_files():
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


def _statements(sql: str) -> list[str]:
    """Split a migration into statements (our migrations hold no semicolons in strings)."""
    lines = [line.split("--", 1)[0] for line in sql.splitlines()]
    return [s.strip() for s in "\n".join(lines).split(";") if s.strip()]


def open_database(path: str) -> None:
    """Create or upgrade the database file; a clear ConfigError when it cannot be used."""
    target = Path(path)
    if target.parent and not target.parent.exists():
        raise ConfigError(f"[ledger] path = {path!r}: the folder {target.parent} does not exist")
    try:
        conn = sqlite3.connect(path, timeout=5, isolation_level=None)
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            migrate(conn)
        finally:
            conn.close()
    except sqlite3.DatabaseError as exc:
        raise ConfigError(
            f"[ledger] path = {path!r}: cannot use this database ({exc}); "
            "move it aside or point [ledger] path elsewhere"
        ) from exc


class Ledger:
    """Batched, single-writer ledger. ``record`` never blocks and never raises."""

    def __init__(self, path: str, *, flush_interval_s: float = 0.2, batch_size: int = 256):
        self.path = path
        self.flush_interval_s = flush_interval_s
        self.batch_size = batch_size
        self.written = 0
        self.write_failures = 0
        self._queue: asyncio.Queue[tuple[Any, ...] | None] = asyncio.Queue()
        self._db: aiosqlite.Connection | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await asyncio.to_thread(open_database, self.path)
        self._db = await aiosqlite.connect(self.path, timeout=5, isolation_level=None)
        await self._db.execute("PRAGMA journal_mode=WAL")
        await self._db.execute("PRAGMA synchronous=NORMAL")
        self._task = asyncio.create_task(self._writer(), name="ledger-writer")

    def record(self, row: dict[str, Any]) -> None:
        values = tuple(row.get(column) for column in COLUMNS)
        self._queue.put_nowait(values)

    @property
    def pending(self) -> int:
        return self._queue.qsize()

    async def _writer(self) -> None:
        stop = False
        while not stop:
            first = await self._queue.get()
            if first is None:
                break
            batch = [first]
            deadline = time.monotonic() + self.flush_interval_s
            while len(batch) < self.batch_size:
                try:
                    timeout = max(0.0, deadline - time.monotonic())
                    item = await asyncio.wait_for(self._queue.get(), timeout)
                except TimeoutError:
                    break
                if item is None:
                    stop = True
                    break
                batch.append(item)
            await self._write(batch)

    async def _write(self, batch: list[tuple[Any, ...]]) -> None:
        assert self._db is not None
        for attempt in range(1, 4):
            try:
                await self._db.execute("BEGIN IMMEDIATE")
                await self._db.executemany(INSERT, batch)
                await self._db.execute("COMMIT")
                self.written += len(batch)
                return
            except sqlite3.Error as exc:
                with contextlib.suppress(sqlite3.Error):
                    await self._db.execute("ROLLBACK")
                log.warning("ledger_write_failed", attempt=attempt, rows=len(batch), error=str(exc))
                await asyncio.sleep(0.1 * attempt)
        self.write_failures += len(batch)
        log.error("ledger_rows_dropped", rows=len(batch))

    async def close(self) -> None:
        """Write every row still queued, then close the database."""
        if self._task is not None:
            self._queue.put_nowait(None)
            await self._task
            # Rows recorded after the stop marker (late finishers) still go in.
            rest: list[tuple[Any, ...]] = []
            while not self._queue.empty():
                item = self._queue.get_nowait()
                if item is not None:
                    rest.append(item)
            if rest:
                await self._write(rest)
            self._task = None
        if self._db is not None:
            await self._db.close()
            self._db = None
