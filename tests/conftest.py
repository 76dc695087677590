"""Shared fixtures: the fake API, the real local engine, and in-process apps built on them (on
each ledger backend with ``open_app``, whose ``database`` comes from ``tests/ledger/conftest.py``).

The engine (the real SmolLM2 in a real worker process) is started once per session and lent to
each in-process app, which does not own it; tests that crash or stop an engine start their own.

When the session starts, :func:`pytest_configure` measures how busy the machine is
(:mod:`tests.load_factor`) once, and the report header prints the figure that every wait and
scaled bound of the run then reads.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import structlog
from pytest_timeout import get_env_settings

from proxy import config
from proxy.engine.local_engine import LocalEngine
from proxy.ledger.db.location import Database
from tests import load_factor
from tests.fake_api import FakeAPI
from tests.in_process import in_process
from tests.ledger.conftest import database, pg_server  # noqa: F401 - for every folder

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

FAKE_KEY_ENV = "FRUGAL_TEST_UPSTREAM_KEY"
FAKE_KEY = "sk-test-upstream-0123456789"
MEASURED = pytest.StashKey[str]()


def pytest_configure(config: pytest.Config) -> None:
    """Measure the machine's load once, before any test, into ``$FRUGAL_TEST_LOAD_FACTOR`` (a
    value already there, set by hand, is kept)."""
    pinned = os.environ.get(load_factor.ENV)
    if pinned:
        config.stash[MEASURED] = f"load factor {load_factor.load_factor():.2f} (pinned)"
        return
    measured = load_factor.measure()
    os.environ[load_factor.ENV] = str(measured.factor)
    config.stash[MEASURED] = measured.describe()


def pytest_report_header(config: pytest.Config) -> str:
    return config.stash.get(MEASURED, "load factor not measured")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Scale each test's time limit (pytest-timeout: ``timeout`` in pyproject.toml, or the
    test's own ``timeout`` mark) by the load factor: a limit tuned on a quiet machine is one
    more fixed wait. A limit of 0 (none) stays none."""
    factor = load_factor.load_factor()
    if factor == 1:
        return
    default = get_env_settings(config).timeout
    for item in items:
        mark = item.get_closest_marker("timeout")
        limit = mark.kwargs.get("timeout", mark.args[0] if mark.args else None) if mark else None
        limit = default if limit is None else limit
        if limit:
            item.add_marker(pytest.mark.timeout(float(limit) * factor), append=False)


def fresh_python(code: str, payload: Any) -> str:
    """What ``code`` prints, run in a fresh Python interpreter with ``payload`` as JSON on its
    stdin: a process of its own, so that the memory it grows is its own to measure."""
    done = subprocess.run(
        [sys.executable, "-c", code],
        input=json.dumps(payload),
        capture_output=True,
        text=True,
        timeout=load_factor.scaled(120),
        check=True,
    )
    return done.stdout


def settings_for(
    tmp_path: Path, api: FakeAPI | None = None, **sections: dict[str, Any]
) -> config.Settings:
    """Settings for a test: a fresh ledger in tmp_path, the fake API as fallback (if given)."""
    raw: dict[str, Any] = {
        "ledger": {"path": str(tmp_path / "ledger.db"), "flush_interval_s": 0.02},
        # No client keys unless a test asks: a $FRUGAL_API_KEYS in the shell must not 401 them.
        "server": {"api_keys_env": ""},
        "local": {"timeout_s": 30.0, "n_threads": 1},
        # No shadow audits unless a test asks: a random 2% of extra upstream calls would make
        # the tests that count upstream requests flaky.
        "audit": {"rate": 0.0},
        "fallback": (
            {"api_base": api.url, "api_key_env": FAKE_KEY_ENV, "max_retries": 1, "timeout_s": 5.0}
            if api is not None
            else {"api_base": "", "api_key_env": ""}
        ),
    }
    for name, values in sections.items():
        raw.setdefault(name, {}).update(values)
    return config.from_dict(raw, source="<test>")


@pytest.fixture(scope="session")
def fake_api_server() -> Iterator[FakeAPI]:
    with FakeAPI() as api:
        yield api


@pytest.fixture
def fake_api(fake_api_server: FakeAPI, monkeypatch: pytest.MonkeyPatch) -> FakeAPI:
    fake_api_server.reset()
    monkeypatch.setenv(FAKE_KEY_ENV, FAKE_KEY)
    return fake_api_server


def module_api(**knobs: Any) -> Any:
    """An ``api`` fixture for one module: a FakeAPI of its own, started with ``knobs`` (what
    ``FakeAPI.set`` takes) and shared by the module's tests, for a server the module starts once.
    Use: ``api = module_api(reply="Paris.")``."""

    @pytest.fixture(scope="module", name="api")
    def module_fake_api() -> Iterator[FakeAPI]:
        with FakeAPI(**knobs) as fake:
            yield fake

    return module_fake_api


@pytest.fixture(scope="session")
async def engine() -> AsyncIterator[LocalEngine]:
    # One request at a time ([local] parallel = 1, not the default 4): the tests that share
    # this engine read the single path's queue, prefix cache and rates. The batch has its own
    # (tests/engine/test_engine_batch.py); `frugal serve` in tests/server/test_serve.py runs the
    # default.
    shared = LocalEngine(config.LocalSettings(n_threads=1, timeout_s=30.0, parallel=1))
    await shared.start()
    yield shared
    await shared.stop()


AppFactory = Callable[..., Any]


@pytest.fixture
def make_client(tmp_path: Path, engine: LocalEngine) -> Callable[..., Any]:
    """``async with make_client(settings) as client``: an httpx client on an in-process app."""

    @asynccontextmanager
    async def factory(
        settings: config.Settings, *, own_engine: bool = False
    ) -> AsyncIterator[httpx.AsyncClient]:
        async with in_process(settings, None if own_engine else engine) as client:
            yield client

    return factory


@pytest.fixture
def translate_sdk(tmp_path: Path, fake_api: FakeAPI, make_client: AppFactory) -> Callable[[], Any]:
    """``async with translate_sdk() as client``: the official SDK's ``AsyncOpenAI`` on an
    in-process app whose ``/v1/responses`` API route is sent to the fake API's Chat Completions
    (``[fallback] responses = "translate"``)."""

    @asynccontextmanager
    async def factory() -> AsyncIterator[openai.AsyncOpenAI]:
        translate = {"responses": "translate"}
        async with make_client(settings_for(tmp_path, fake_api, fallback=translate)) as http:
            yield openai.AsyncOpenAI(
                api_key="sk-unused", base_url="http://localhost/v1", http_client=http, max_retries=0
            )

    return factory


def ledger_settings(
    tmp_path: Path, api: FakeAPI, db: Database, **sections: dict[str, Any]
) -> config.Settings:
    """:func:`settings_for` with the ledger on ``db`` (its PostgreSQL URL, or ``tmp_path``'s
    SQLite file)."""
    ledger: dict[str, Any] = {"path": str(tmp_path / "ledger.db"), "flush_interval_s": 0.02}
    if db.is_postgres:
        ledger["url"] = db.url
    return settings_for(tmp_path, api, ledger=ledger, **sections)


@pytest.fixture
def open_app(
    tmp_path: Path,
    fake_api: FakeAPI,
    make_client: AppFactory,
    database: Database,  # noqa: F811
) -> AppFactory:
    """``async with open_app(**sections) as client``: an in-process app on the fake API, its
    ledger on ``database`` (each backend in turn)."""

    def open_(**sections: dict[str, Any]) -> Any:
        return make_client(ledger_settings(tmp_path, fake_api, database, **sections))

    return open_


@pytest.fixture(autouse=True)
def _fresh_logging() -> Iterator[None]:
    """A test that runs the CLI configures structlog onto its captured stdout; reset it after,
    so that later log lines (the shared engine's among them) never write to a closed file."""
    yield
    structlog.reset_defaults()
