"""Short-lived statements on the request path (budgets, rate limits, the cache): a small pool
of connections to the ledger database, SQLite or PostgreSQL, used from worker threads.

:meth:`Pool.transaction` lends a connection inside one transaction (``BEGIN IMMEDIATE`` on
SQLite, so writers queue on its lock; a psycopg transaction on PostgreSQL) and commits when the
block ends, or rolls back when it raises. A connection that failed is closed, not returned, so
a server that went away and came back is reached again at the next call. Every failure reaches
the caller as :class:`Unavailable`, whose message holds no password and no statement values.
"""

from __future__ import annotations

import contextlib
import queue
import sqlite3
from collections.abc import Iterator, Sequence
from typing import Any

from proxy.ledger.db import postgres
from proxy.ledger.db.location import Database


class Unavailable(Exception):
    """The database could not be reached or did not take a statement."""


class Tx:
    """One connection inside a transaction; statements are written with ``?`` placeholders."""

    def __init__(self, db: Database, raw: Any) -> None:
        self.db = db
        self.raw = raw

    def run(self, statement: str, params: Sequence[Any] = ()) -> Any:
        if self.db.is_postgres:
            return self.raw.execute(postgres.sql(statement), params)
        return self.raw.execute(statement, params)

    def rows(self, statement: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        return [tuple(row) for row in self.run(statement, params).fetchall()]

    def count(self, statement: str, params: Sequence[Any] = ()) -> int:
        """Run one statement; the rows it changed."""
        return int(self.run(statement, params).rowcount)


class Pool:
    """At most ``size`` open connections; more callers wait for one (``timeout_s``)."""

    def __init__(self, db: Database, *, size: int = 4, timeout_s: float = 5.0) -> None:
        self.db = db
        self.timeout_s = timeout_s
        self._idle: queue.LifoQueue[Any] = queue.LifoQueue()
        self._slots = queue.Queue[None]()
        for _ in range(size):
            self._slots.put(None)

    def _open(self) -> Any:
        if self.db.is_postgres:
            import psycopg

            kwargs = self.db.connect_kwargs()
            kwargs["connect_timeout"] = max(1, int(self.timeout_s))
            return psycopg.connect(**kwargs, autocommit=True)
        conn = sqlite3.connect(
            self.db.path, timeout=self.timeout_s, isolation_level=None, check_same_thread=False
        )
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        return conn

    @contextlib.contextmanager
    def transaction(self) -> Iterator[Tx]:
        try:
            self._slots.get(timeout=self.timeout_s)
        except queue.Empty:
            raise Unavailable("every connection to the ledger database is busy") from None
        raw: Any = None
        try:
            try:
                raw = self._idle.get_nowait()
            except queue.Empty:
                raw = self._open()
            tx = Tx(self.db, raw)
            if self.db.is_postgres:
                with raw.transaction():
                    yield tx
            else:
                raw.execute("BEGIN IMMEDIATE")
                try:
                    yield tx
                except BaseException:
                    raw.execute("ROLLBACK")
                    raise
                raw.execute("COMMIT")
            self._idle.put(raw)
            raw = None
        except (sqlite3.Error, Unavailable) as exc:
            raise Unavailable(_reason(self.db, exc)) from None
        except Exception as exc:
            if not postgres.is_error(exc):
                raise
            raise Unavailable(_reason(self.db, exc)) from None
        finally:
            if raw is not None:  # failed or interrupted: never reused
                with contextlib.suppress(Exception):
                    raw.close()
            self._slots.put(None)

    def close(self) -> None:
        while True:
            try:
                raw = self._idle.get_nowait()
            except queue.Empty:
                return
            with contextlib.suppress(Exception):
                raw.close()


def _reason(db: Database, exc: BaseException) -> str:
    if isinstance(exc, Unavailable):
        return str(exc)
    if db.is_postgres:
        return postgres.reason(db, exc)
    return f"{type(exc).__name__}: {str(exc)[:200]}"
