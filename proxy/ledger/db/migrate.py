"""The ledger's schema: numbered migrations applied in order, recorded, never edited.

Migrations are the files ``migrations/NNNN_name.sql`` for SQLite and
``migrations/postgres/NNNN_name.sql`` for PostgreSQL, one per SQLite file with the same name
(installed as the package ``proxy.migrations``). :func:`migrate` (SQLite) and
:func:`migrate_postgres` apply the ones a database has not seen yet, each in its own
transaction, and record its name in the ``_migrations`` table; a landed file is never edited, a
change is a new file in both folders. On PostgreSQL they run under an advisory lock, so two
replicas starting together apply each migration once.

:func:`open_database` creates or upgrades a database at start-up (``frugal serve``, ``frugal
migrate``) and turns every way it can be unusable into a :class:`ConfigError` that says what to
do; :func:`schema_state` tells ``frugal check`` which migrations a database lacks.
"""

from __future__ import annotations

import importlib.resources
import sqlite3
import time
from pathlib import Path
from typing import Any

from proxy.errors import ConfigError
from proxy.ledger.db import postgres
from proxy.ledger.db.access import connect, connect_postgres
from proxy.ledger.db.location import Database, as_database

__all__ = [
    "applied_migrations",
    "migrate",
    "migrate_postgres",
    "migration_files",
    "open_database",
    "schema_state",
]


def migration_files(dialect: str = "sqlite") -> list[tuple[str, str]]:
    """(name, sql) of every migration of ``dialect`` ("sqlite" or "postgresql"), in order."""
    root = importlib.resources.files("proxy.migrations")
    if dialect == "postgresql":
        root = root / "postgres"
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


def applied_migrations(conn: Any) -> set[str]:
    return {row[0] for row in conn.execute("SELECT name FROM _migrations")}


def migrate_postgres(conn: Any, upto: str | None = None) -> list[str]:
    """:func:`migrate` for PostgreSQL, on an autocommit psycopg connection, under an advisory
    lock held for the whole run."""
    conn.execute("SELECT pg_advisory_lock(%s)", (postgres.MIGRATION_LOCK,))
    try:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS _migrations "
            "(name TEXT PRIMARY KEY, applied_at DOUBLE PRECISION NOT NULL)"
        )
        done = applied_migrations(conn)
        applied = []
        for name, sql in migration_files("postgresql"):
            if upto is not None and name > upto:
                break
            if name in done:
                continue
            with conn.transaction():
                conn.execute(sql)  # the whole file: no parameters, so several statements
                conn.execute("INSERT INTO _migrations VALUES (%s, %s)", (name, time.time()))
            applied.append(name)
        return applied
    finally:
        conn.execute("SELECT pg_advisory_unlock(%s)", (postgres.MIGRATION_LOCK,))


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


def open_database(target: str | Database, *, busy_timeout_s: float = 5.0) -> list[str]:
    """Create or upgrade the database and check that it can be written; returns the
    migrations applied.

    Raises a :class:`ConfigError` that says what is wrong: a missing folder, a file that is not
    a SQLite database (or is damaged), a database another process keeps locked; for
    PostgreSQL, a server that cannot be reached or a user without the rights to migrate.
    """
    db = as_database(target)
    if db.is_postgres:
        return _open_postgres(db)
    return _open_sqlite(db.path, busy_timeout_s)


def _open_postgres(db: Database) -> list[str]:
    conn = connect_postgres(db)
    try:
        return migrate_postgres(conn)
    except Exception as exc:
        if not postgres.is_error(exc):
            raise
        raise postgres.config_error(db, exc, "migrating the schema") from None
    finally:
        conn.close()


def schema_state(target: str | Database) -> tuple[list[str], list[str]]:
    """(applied, missing) migration names of an existing database, without changing it."""
    db = as_database(target)
    expected = [name for name, _ in migration_files(db.dialect)]
    with connect(db, readonly=True) as conn:
        if db.is_postgres:
            exists = conn.raw.execute("SELECT to_regclass('_migrations') IS NOT NULL").fetchone()
            done = applied_migrations(conn.raw) if exists and exists[0] else set()
        else:
            tables = {r[0] for r in conn.raw.execute("SELECT name FROM sqlite_master")}
            done = applied_migrations(conn.raw) if "_migrations" in tables else set()
    return sorted(done), [name for name in expected if name not in done]


def _open_sqlite(path: str, busy_timeout_s: float) -> list[str]:
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
            applied = migrate(conn)
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
    return applied
