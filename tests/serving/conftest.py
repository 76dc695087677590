"""The serving room's tests share the ledger's backends: a SQLite file, or a database of its own
on a real PostgreSQL server (tests/ledger/conftest.py)."""

from tests.ledger.conftest import database, pg_server, pool

__all__ = ["database", "pg_server", "pool"]
