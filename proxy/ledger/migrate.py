"""The ledger's schema: numbered migrations applied in order, recorded, never edited.

Migrations are the files ``migrations/NNNN_name.sql`` (installed as the package
``proxy.migrations``). :func:`migrate` applies the ones a database has not seen yet, each in its
own transaction, and records its name in the ``_migrations`` table; a landed file is never
edited, a change is a new file. :func:`open_database` creates or upgrades a database at start-up
and turns every way it can be unusable into a :class:`ConfigError` that says what to do.
"""

from __future__ import annotations

import importlib.resources
import sqlite3
import time
from pathlib import Path

from proxy.errors import ConfigError

__all__ = ["applied_migrations", "migrate", "migration_files", "open_database", "table_columns"]


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
