"""The ledger's backends for the tests: a SQLite file, or a database of its own on a real
PostgreSQL server started once per session (``tests/pg.py``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from proxy.ledger.db.connections import Pool
from proxy.ledger.db.location import Database, parse
from proxy.ledger.db.migrate import open_database
from tests import pg


@pytest.fixture(scope="session")
def pg_server() -> Iterator[pg.Server]:
    with pg.running() as server:
        if server is None:
            pytest.skip("PostgreSQL is not installed: apt-get install postgresql (./dev test does)")
        yield server


@pytest.fixture(params=["sqlite", "postgresql"])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Database:
    """An empty ledger database (no schema yet), on each backend."""
    if request.param == "sqlite":
        return parse(str(tmp_path / "ledger.db"))
    server: pg.Server = request.getfixturevalue("pg_server")
    return parse(server.database(), spill_base=str(tmp_path / "ledger"))


@pytest.fixture
def pool(database: Database) -> Iterator[Pool]:
    """A pool on ``database`` with the schema in place, roomy enough for the tests' threads."""
    open_database(database)
    shared = Pool(database, size=8, timeout_s=10.0)
    yield shared
    shared.close()
