"""Routing by predicted finish time, through the in-process app and the real engine.

The queue in front of a request is made by handing jobs straight to the shared engine; the local
deadline of the app under test is then set from the engine's own predicted wait, so that the
decision does not depend on how fast this machine happens to be.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import time
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from proxy.config import ConfigError
from proxy.engine.local_engine import LocalEngine
from proxy.ledger.db.migrate import open_database
from proxy.ledger.reports.build import Period, build, render
from tests.conftest import settings_for
from tests.fake_api import FakeAPI
from tests.load_factor import settle

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
LONG = [{"role": "user", "content": "Write a very long story about the sea and its ships."}]
ACCEPT_ANY = {"x-frugal-min-quality": "0"}


def chat(max_tokens: int = 8, **extra: Any) -> dict[str, Any]:
    return {"model": "gpt-4o-mini", "messages": QUESTION, "max_tokens": max_tokens, **extra}


def ledger_rows(db: Path) -> list[sqlite3.Row]:
    conn = sqlite3.connect(db)
    conn.row_factory = sqlite3.Row
    try:
        return conn.execute("SELECT * FROM requests ORDER BY id").fetchall()
    finally:
        conn.close()


@contextlib.asynccontextmanager
async def queue_ahead(engine: LocalEngine, jobs: int = 3) -> AsyncIterator[float]:
    """Jobs running and waiting in the engine; yields the engine's predicted wait for them."""
    deadline = time.monotonic() + 120
    body = {"model": "local", "messages": LONG, "max_tokens": 200}
    tasks = [asyncio.create_task(engine.chat(body, deadline=deadline)) for _ in range(jobs)]
    try:
        await settle(
            lambda: engine.busy and engine.queue_depth == jobs - 1,
            f"one job running and {jobs - 1} waiting",
            every_s=0.01,
        )
        wait = engine.predicted_wait_s()
        assert wait is not None and wait > 0
        yield wait
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task


async def test_a_request_behind_a_long_queue_goes_to_the_api_without_waiting(
    tmp_path: Path, fake_api: FakeAPI, engine: LocalEngine, make_client: Callable[..., Any]
) -> None:
    async with queue_ahead(engine) as wait:
        timeout_s = max(0.2, wait / 2)
        settings = settings_for(tmp_path, fake_api, local={"timeout_s": timeout_s})
        async with make_client(settings) as client:
            queued = engine.queue_depth
            response = await client.post("/v1/chat/completions", json=chat())
            assert engine.queue_depth == queued  # it never joined the queue
        assert response.status_code == 200
        assert response.headers["x-frugal-route"] == "api"
        assert response.headers["x-frugal-reason"] == "predicted_slow"
        assert fake_api.count == 1
    (row,) = ledger_rows(tmp_path / "ledger.db")
    assert row["reason"] == "predicted_slow"
    assert row["local_ms"] == 0 and row["latency_tax_ms"] == 0
    assert row["predicted_local_ms"] > timeout_s * 1000
    assert row["actual_local_ms"] is None
    assert row["backend"] == "engine" and row["predicted_completion_tokens"] == 8


async def test_the_naive_cascade_waits_in_the_queue_but_records_the_prediction(
    tmp_path: Path, fake_api: FakeAPI, engine: LocalEngine, make_client: Callable[..., Any]
) -> None:
    async with queue_ahead(engine) as wait:
        timeout_s = min(max(0.2, wait / 2), 1.5)
        settings = settings_for(
            tmp_path, fake_api, local={"timeout_s": timeout_s}, router={"predictive": False}
        )
        async with make_client(settings) as client:
            response = await client.post("/v1/chat/completions", json=chat())
        assert response.headers["x-frugal-route"] == "api"
        assert response.headers["x-frugal-reason"] == "local_timeout"
    (row,) = ledger_rows(tmp_path / "ledger.db")
    assert row["local_ms"] >= timeout_s * 1000 * 0.9  # it sat in the queue until the deadline
    assert row["predicted_local_ms"] > timeout_s * 1000
    assert row["actual_local_ms"] is None  # cut by its deadline: not a finished answer's time


async def test_a_local_answer_records_its_prediction_and_the_report_shows_the_error(
    tmp_path: Path, fake_api: FakeAPI, make_client: Callable[..., Any]
) -> None:
    settings = settings_for(tmp_path, fake_api)
    async with make_client(settings) as client:
        for _ in range(2):
            response = await client.post("/v1/chat/completions", json=chat(), headers=ACCEPT_ANY)
            assert response.headers["x-frugal-route"] == "local"
        metrics = (await client.get("/metrics")).text
        routing = (await client.get("/healthz")).json()["routing"]
    assert "frugal_prediction_error_ratio " in metrics
    assert 'frugal_backend_up{backend="engine"} 1.0' in metrics
    assert routing["prediction_samples"] == 2 and routing["predictive"] is True
    assert [b["name"] for b in routing["backends"]] == ["engine"]
    rows = ledger_rows(tmp_path / "ledger.db")
    for row in rows:
        assert row["backend"] == "engine"
        assert row["predicted_local_ms"] > 0 and row["actual_local_ms"] > 0
        assert row["actual_local_ms"] <= row["local_ms"] + 1
    errors = sorted(abs(r["predicted_local_ms"] / r["actual_local_ms"] - 1) for r in rows)
    now = datetime.now(UTC)
    report = build(str(tmp_path / "ledger.db"), Period.month(None, now), 0, now=now)
    assert report["prediction_samples"] == 2
    assert report["prediction_mdape"] == pytest.approx(sum(errors) / 2, abs=1e-4)
    assert "Prediction error (MdAPE)" in render(report, "table")


async def test_latency_objective_prefers_the_api_when_it_answers_sooner(
    tmp_path: Path, fake_api: FakeAPI, make_client: Callable[..., Any]
) -> None:
    settings = settings_for(
        tmp_path, fake_api, router={"objective": "latency", "latency_margin_s": 0.0}
    )
    async with make_client(settings) as client:
        forced = await client.post(
            "/v1/chat/completions", json=chat(), headers={"x-frugal-route": "api"}
        )
        assert forced.headers["x-frugal-reason"] == "forced"  # the API's latency is now known
        response = await client.post("/v1/chat/completions", json=chat(max_tokens=64))
        assert (response.headers["x-frugal-route"], response.headers["x-frugal-reason"]) == (
            "api",
            "predicted_slow",
        )
        # The model "local" never falls back, so it is never sent to the API either.
        alias = await client.post("/v1/chat/completions", json={**chat(), "model": "local"})
        assert alias.headers["x-frugal-route"] == "local"


async def test_answer_lengths_are_learned_from_the_ledger_at_start(
    tmp_path: Path, fake_api: FakeAPI, make_client: Callable[..., Any]
) -> None:
    db = tmp_path / "ledger.db"
    open_database(str(db))
    conn = sqlite3.connect(db)
    with conn:
        for i, tokens in enumerate((30, 50)):
            conn.execute(
                "INSERT INTO requests (request_id, ts, endpoint, requested_model, route, reason, "
                "status, latency_ms, local_completion_tokens) VALUES (?, ?, 'chat.completions', "
                "'gpt-4o-mini', 'local', 'accepted', 200, 1.0, ?)",
                (f"old-{i}", 1000.0 + i, tokens),
            )
    conn.close()
    async with make_client(settings_for(tmp_path, fake_api)) as client:
        router = client.app.state.services.router
        await settle(
            lambda: router.predictor.lengths.seeded > 0, "the lengths seeded", every_s=0.01
        )
        assert router.predictor.lengths.expected("gpt-4o-mini", 512) == 40
        # Without max_tokens, the prediction expects what was learned, not the engine's cap.
        plan = router.plan({"model": "gpt-4o-mini", "messages": QUESTION}, None)
        assert plan.choice.prediction.completion_tokens == 40


def test_router_settings_are_checked() -> None:
    with pytest.raises(ConfigError, match=r"\[router\] objective = 'fast'"):
        settings_for(Path("/tmp"), router={"objective": "fast"})
    with pytest.raises(ConfigError, match=r"\[router\] latency_margin_s = -1"):
        settings_for(Path("/tmp"), router={"latency_margin_s": -1})
    with pytest.raises(ConfigError, match=r"\[router\] predictive = 'yes'"):
        settings_for(Path("/tmp"), router={"predictive": "yes"})


def _overflowing(engine: LocalEngine) -> list[dict[str, str]]:
    """A conversation whose bytes alone prove it cannot fit the engine's context."""
    per_token = max(engine.max_token_bytes, 1)
    return [{"role": "user", "content": "word " * (per_token * engine.n_ctx // 5 + 10)}]


async def test_a_prompt_that_cannot_fit_is_context_overflow_even_behind_a_long_queue(
    tmp_path: Path, fake_api: FakeAPI, engine: LocalEngine, make_client: Callable[..., Any]
) -> None:
    """The definite reason wins over the predicted one: the report must say why it went."""
    async with queue_ahead(engine) as wait:
        settings = settings_for(tmp_path, fake_api, local={"timeout_s": max(0.2, wait / 2)})
        async with make_client(settings) as client:
            body = {"model": "gpt-4o-mini", "messages": _overflowing(engine), "max_tokens": 8}
            response = await client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200
    assert response.headers["x-frugal-route"] == "api"
    assert response.headers["x-frugal-reason"] == "context_overflow"
    (row,) = ledger_rows(tmp_path / "ledger.db")
    assert row["reason"] == "context_overflow" and row["local_ms"] == 0


@pytest.mark.parametrize(
    ("headers", "extra", "reason"),
    [
        ({"x-frugal-route": "api"}, {}, "forced"),
        ({}, {"audio": {"voice": "alloy", "format": "wav"}}, "unsupported"),
        ({}, {}, "context_overflow"),
    ],
    ids=["forced", "unsupported", "context_overflow"],
)
async def test_definite_reasons_take_precedence_over_a_predicted_one(
    tmp_path: Path,
    fake_api: FakeAPI,
    engine: LocalEngine,
    make_client: Callable[..., Any],
    headers: dict[str, str],
    extra: dict[str, Any],
    reason: str,
) -> None:
    async with queue_ahead(engine) as wait:
        settings = settings_for(tmp_path, fake_api, local={"timeout_s": max(0.2, wait / 2)})
        body = {"model": "gpt-4o-mini", "messages": _overflowing(engine), "max_tokens": 8}
        async with make_client(settings) as client:
            response = await client.post(
                "/v1/chat/completions", json={**body, **extra}, headers=headers
            )
    assert response.headers["x-frugal-route"] == "api"
    assert response.headers["x-frugal-reason"] == reason
