"""The ledger's backends for the tests: a SQLite file, or a database of its own on a real
PostgreSQL server started once per session (``tests/pg.py``); and the app with its ledger on
one of them (:func:`ledger_settings`, the ``open_app`` fixture)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from proxy.ledger.db.location import Database, parse
from tests import pg
from tests.conftest import settings_for
from tests.fake_api import FakeAPI


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


def ledger_settings(tmp_path: Path, api: FakeAPI, db: Database, **sections: Any) -> Any:
    """``settings_for`` with the ledger on ``db`` (its PostgreSQL URL, or ``tmp_path``'s SQLite
    file), flushed every 20 ms; ``sections`` as in ``settings_for``."""
    ledger: dict[str, Any] = {"path": str(tmp_path / "ledger.db"), "flush_interval_s": 0.02}
    if db.is_postgres:
        ledger["url"] = db.url
    return settings_for(tmp_path, api, ledger=ledger, **sections)


@pytest.fixture
def open_app(
    tmp_path: Path, fake_api: FakeAPI, make_client: Any, database: Database
) -> Callable[..., Any]:
    """``async with open_app(**sections) as client``: the app on the fake API, its ledger on
    ``database`` (each backend)."""

    def open_(**sections: Any) -> Any:
        return make_client(ledger_settings(tmp_path, fake_api, database, **sections))

    return open_
