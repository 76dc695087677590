"""Where the writer thread's batches go: one transaction per batch, on SQLite or PostgreSQL.

A :class:`Store` belongs to the writer thread and holds its one connection. :meth:`Store.write`
writes a batch (rows whose values are final, rows written with an estimate whose ids are
needed for a later count update, and those updates) in one transaction, or raises and leaves
nothing written. :meth:`Store.transient` tells the writer whether a failure was the
database's (held and retried) or a row's (the batch is tried row by row).

- :class:`SqliteStore`: WAL, ``synchronous=NORMAL``, ``BEGIN IMMEDIATE``; while a flush or the
  stop has a deadline, no wait for a lock goes past it.
- :class:`PostgresStore`: psycopg 3, one ``COPY`` per batch (so the rollup's statement trigger
  runs once per batch; several times the rows/s of a multi-row ``INSERT``, bench/README.md),
  ids from the identity column, unique across replicas. A lost connection is dropped and
  opened again at the next attempt, so rows are held in memory while the server is away and
  written when it returns.
"""

from __future__ import annotations

import contextlib
import sqlite3
import time
from collections.abc import Iterator
from typing import Any

from proxy.ledger.audits.table import AUDIT_INSERT, audit_values
from proxy.ledger.db import postgres
from proxy.ledger.db.location import Database
from proxy.ledger.writing.ledger_row import COLUMNS
from proxy.ledger.writing.rows import COUNT_UPDATE

Batch = list[tuple[Any, ...]]  # rows (or count updates) as the values of their SQL statement


class Store:
    """One writer's connection to the ledger database."""

    columns: tuple[str, ...] = COLUMNS
    _deadline: float | None = None

    def open(self) -> None:
        raise NotImplementedError

    def write(self, ready: Batch, estimated: Batch, changes: Batch) -> list[int]:
        """Write in one transaction; returns the ids of the ``estimated`` rows."""
        raise NotImplementedError

    def transient(self, exc: BaseException) -> bool:
        raise NotImplementedError

    def reason(self, exc: BaseException) -> str:
        """What failed, without a value of any row: for ``/healthz`` and the log."""
        return f"{type(exc).__name__}: {exc}"[:300]

    def bound_wait(self, deadline: float | None) -> None:
        """No wait (for a lock, a connection) goes past ``deadline`` (``time.monotonic()``)."""
        self._deadline = deadline

    def write_audits(self, rows: list[dict[str, Any]]) -> None:
        """Insert rows of the ``audits`` table in one transaction, or raise."""
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


def open_store(db: Database, *, busy_timeout_s: float) -> Store:
    store: Store = PostgresStore(db) if db.is_postgres else SqliteStore(db.path, busy_timeout_s)
    store.open()
    return store


class SqliteStore(Store):
    def __init__(self, path: str, busy_timeout_s: float) -> None:
        self.path = path
        self.busy_timeout_s = busy_timeout_s
        self._busy_ms = -1
        self._conn: sqlite3.Connection | None = None
        self._insert = ""

    def open(self) -> None:
        conn = sqlite3.connect(self.path, timeout=self.busy_timeout_s, isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        self._insert = (
            f"INSERT INTO requests ({', '.join(self.columns)}) "
            f"VALUES ({', '.join('?' for _ in self.columns)})"
        )
        self._conn = conn

    def transient(self, exc: BaseException) -> bool:
        """Locked, busy, full, I/O: the database failed, not the row."""
        return isinstance(exc, sqlite3.OperationalError)

    def write(self, ready: Batch, estimated: Batch, changes: Batch) -> list[int]:
        with self._immediate() as conn:
            if ready:
                conn.executemany(self._insert, ready)
            ids = [int(conn.execute(self._insert, values).lastrowid or 0) for values in estimated]
            if changes:
                conn.executemany(COUNT_UPDATE, changes)
        return ids

    def write_audits(self, rows: list[dict[str, Any]]) -> None:
        with self._immediate() as conn:
            conn.executemany(AUDIT_INSERT, [audit_values(row) for row in rows])

    @contextlib.contextmanager
    def _immediate(self) -> Iterator[sqlite3.Connection]:
        """One ``BEGIN IMMEDIATE`` transaction: committed when the block ends, rolled back if
        anything in it (or the commit) fails."""
        conn = self._conn
        assert conn is not None
        if conn.in_transaction:  # left open by a failure the rollback could not undo
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
        self._bound_lock_wait(conn)
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield conn
            conn.execute("COMMIT")
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            raise

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

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


class PostgresStore(Store):
    def __init__(self, db: Database) -> None:
        self.db = db
        self._conn: Any = None
        self._inserts: dict[int, str] = {}

    def open(self) -> None:
        self._conn = self._connect()

    def _connect(self) -> Any:
        import psycopg

        kwargs = self.db.connect_kwargs()
        if self._deadline is not None:
            left = self._deadline - time.monotonic()
            kwargs["connect_timeout"] = max(1, min(int(kwargs["connect_timeout"]), int(left)))
        return psycopg.connect(**kwargs, autocommit=True)

    def transient(self, exc: BaseException) -> bool:
        return postgres.transient(exc)

    def reason(self, exc: BaseException) -> str:
        return postgres.reason(self.db, exc)

    def _insert(self, rows: int) -> str:
        if rows not in self._inserts:
            group = "(" + ", ".join("%s" for _ in self.columns) + ")"
            self._inserts[rows] = (
                f"INSERT INTO requests ({', '.join(self.columns)}) VALUES "
                + ", ".join(group for _ in range(rows))
            )
        return self._inserts[rows]

    def write(self, ready: Batch, estimated: Batch, changes: Batch) -> list[int]:
        with self._transaction() as conn:
            if ready:
                # COPY: no SQL to parse and no parameters to bind per row; one statement,
                # so the rollup's statement trigger still runs once per batch.
                with conn.cursor() as cursor:
                    columns = ", ".join(self.columns)
                    with cursor.copy(f"COPY requests ({columns}) FROM STDIN") as copy:
                        for values in ready:
                            copy.write_row([_pg_value(v) for v in values])
            ids = []
            for values in estimated:
                cursor = conn.execute(
                    self._insert(1) + " RETURNING id", [_pg_value(v) for v in values]
                )
                ids.append(int(cursor.fetchone()[0]))
            if changes:
                with conn.cursor() as cursor:
                    cursor.executemany(postgres.sql(COUNT_UPDATE), changes)
        return ids

    def write_audits(self, rows: list[dict[str, Any]]) -> None:
        with self._transaction() as conn, conn.cursor() as cursor:
            cursor.executemany(postgres.sql(AUDIT_INSERT), [audit_values(r) for r in rows])

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[Any]:
        """One transaction, on a connection opened again if it was lost; after a transient
        failure the connection is dropped, so the next write opens a new one."""
        if self._conn is None or self._conn.closed:
            self._conn = self._connect()
        conn = self._conn
        try:
            with conn.transaction():
                yield conn
        except BaseException as exc:
            if self.transient(exc):  # the connection may be gone: open a new one next time
                with contextlib.suppress(Exception):
                    conn.close()
                self._conn = None
            raise

    def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.close()
            self._conn = None


def _pg_value(value: Any) -> Any:
    """A bool as the 0/1 the INTEGER columns hold (SQLite takes either)."""
    return int(value) if isinstance(value, bool) else value
