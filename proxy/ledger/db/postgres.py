"""PostgreSQL through psycopg 3: connections, the one translation of its errors, and SQL text.

psycopg is imported only when a PostgreSQL ledger is used (its import costs about 0.3 s).
Every psycopg error that reaches a user passes through :func:`config_error` (start-up,
``frugal migrate``, ``frugal keys``, ``frugal report``), which says what to check and scrubs the
password out of the message; the writer asks :func:`transient` whether a failure is the
database's (unreachable, shutting down, out of space, a deadlock: held and retried) or the
row's (rejected).

The ledger's statements are written once, with ``?`` placeholders as sqlite3 takes them;
:func:`sql` turns them into psycopg's ``%s``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from proxy.errors import ConfigError
from proxy.ledger.db.location import Database

if TYPE_CHECKING:
    import psycopg

# pg_advisory_lock key held while migrations run, so replicas starting together apply each once.
MIGRATION_LOCK = 0x66727567616C  # "frugal"


def connect(db: Database, *, autocommit: bool = True) -> psycopg.Connection[Any]:
    """A connection (raises psycopg's own error; see :func:`config_error`)."""
    import psycopg

    return psycopg.connect(**db.connect_kwargs(), autocommit=autocommit)


async def connect_async(db: Database) -> psycopg.AsyncConnection[Any]:
    import psycopg

    return await psycopg.AsyncConnection.connect(**db.connect_kwargs(), autocommit=True)


def is_error(exc: BaseException) -> bool:
    """Whether ``exc`` is psycopg's (without importing psycopg when it was never used)."""
    module = type(exc).__module__
    return module.startswith("psycopg")


def transient(exc: BaseException) -> bool:
    """The database failed, not the row: connection lost or refused, server shutting down, out
    of disk or memory, a deadlock or serialization failure. Retried, never rejected."""
    if not is_error(exc):
        return False
    import psycopg

    return isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError)


def reason(db: Database, exc: BaseException) -> str:
    """A short, password-free account of a failure, for ``/healthz`` and the log."""
    sqlstate = getattr(exc, "sqlstate", None)
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    text = f"{type(exc).__name__}{f' {sqlstate}' if sqlstate else ''}: {first}"
    return db.scrub(text)[:300]


def config_error(db: Database, exc: BaseException, doing: str) -> ConfigError:
    """What went wrong reaching the database, as an error that says what to check."""
    hint = (
        "is PostgreSQL running and reachable there, do the user and database exist, and is "
        f"the password in ${db.password_env or '[ledger] password_env'} right?"
    )
    if not transient(exc):
        hint = "check the database user's rights (it needs CREATE on the schema to migrate)"
    return ConfigError(f"[ledger] url = {db.label!r}: {doing} failed ({reason(db, exc)}); {hint}")


def sql(statement: str) -> str:
    """``?`` placeholders as psycopg's ``%s`` (our statements hold no ``?`` or ``%`` in text)."""
    return statement.replace("%", "%%").replace("?", "%s")


def table_columns(conn: psycopg.Connection[Any], table: str = "requests") -> list[str]:
    rows = conn.execute(
        "SELECT column_name FROM information_schema.columns "
        "WHERE table_schema = current_schema() AND table_name = %s ORDER BY ordinal_position",
        (table,),
    ).fetchall()
    return [row[0] for row in rows]
