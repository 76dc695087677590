"""Short connections for the ledger's readers and commands (``frugal keys``, ``frugal report``):
the same statements on SQLite and PostgreSQL.

:func:`connect` opens one (:func:`connect_postgres` a bare psycopg one);
:class:`Connection` runs statements written with ``?`` placeholders on either backend and
returns plain tuples. An integrity error (a unique name taken) is :class:`Duplicate` on both,
and anything else psycopg raises becomes a :class:`~proxy.errors.ConfigError` that says what to
check, without the password.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from proxy.ledger.db import postgres
from proxy.ledger.db.location import Database


class Duplicate(Exception):
    """A row breaks a unique constraint (e.g. a key name already in use)."""


class Connection:
    def __init__(self, db: Database, raw: Any) -> None:
        self.db = db
        self.raw = raw

    def query(self, statement: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        return [tuple(row) for row in self._run(statement, params).fetchall()]

    def execute(self, statement: str, params: Sequence[Any] = ()) -> int:
        """Run one statement (autocommit); returns the rows it changed."""
        return int(self._run(statement, params).rowcount)

    def columns(self, table: str) -> set[str]:
        if self.db.is_postgres:
            return set(postgres.table_columns(self.raw, table))
        return {row[1] for row in self.raw.execute(f"PRAGMA table_info({table})")}

    def _run(self, statement: str, params: Sequence[Any]) -> Any:
        if not self.db.is_postgres:
            try:
                return self.raw.execute(statement, params)
            except sqlite3.IntegrityError as exc:
                raise Duplicate(str(exc)) from exc
        import psycopg

        try:
            return self.raw.execute(postgres.sql(statement), params)
        except psycopg.IntegrityError as exc:
            raise Duplicate(type(exc).__name__) from None
        except psycopg.Error as exc:
            raise postgres.config_error(self.db, exc, "a query") from None


def connect_postgres(db: Database) -> Any:
    """An autocommit psycopg connection to ``db``; failing to connect is a ConfigError."""
    try:
        return postgres.connect(db)
    except Exception as exc:
        if not postgres.is_error(exc):
            raise
        raise postgres.config_error(db, exc, "connecting") from None


@contextmanager
def connect(db: Database, *, readonly: bool = False) -> Iterator[Connection]:
    """A connection that autocommits each statement; SQLite ``readonly`` opens ``mode=ro``
    (the file must exist)."""
    raw: Any
    if db.is_postgres:
        raw = connect_postgres(db)
    elif readonly:
        uri = f"file:{Path(db.path).resolve()}?mode=ro"
        raw = sqlite3.connect(uri, uri=True, timeout=5, isolation_level=None)
    else:
        raw = sqlite3.connect(db.path, timeout=5, isolation_level=None)
    try:
        yield Connection(db, raw)
    finally:
        raw.close()
