"""``[local] parallel`` through the real worker process: several jobs in flight at once.

One ``LocalEngine`` with ``parallel = 4`` (and prompt-lookup speculation, whose drafts are rows
of the same steps) runs four greedy requests together; their answers are the ones the single
path gives in-process. One of four is cancelled (its client went away) or hits its deadline: it
leaves the batch, the others finish, and the worker is neither killed nor restarted. Tools (not
batchable) still run, alone, between batches. A worker crash fails every sequence of the batch
(each once), and the engine comes back; through the app, each of those requests is answered by
the API instead, with exactly one ledger row. ``/healthz`` and ``/metrics`` show the batch.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from proxy.config import LocalSettings
from proxy.engine.generate import LocalModel
from proxy.engine.local_engine import LocalEngine
from proxy.engine.model_files import bundled_model_path
from proxy.errors import EngineCrashed
from tests.conftest import settings_for
from tests.fake_api import FakeAPI
from tests.in_process import in_process
from tests.load_factor import settle
from tests.tool_turns import weather_tool

PROMPTS = [
    "Write two sentences about the sea.",
    "Name three colours.",
    "Write a long story about a lighthouse keeper.",
    "What is bread made of?",
]


def _request(prompt: str, max_tokens: int = 24) -> dict[str, Any]:
    return {
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
    }


@pytest.fixture(scope="module")
def alone() -> Iterator[LocalModel]:
    model = LocalModel.load(bundled_model_path(), n_ctx=1024, n_threads=1, calibrate=False)
    yield model
    model.close()


@pytest.fixture
async def engine() -> AsyncIterator[LocalEngine]:
    settings = LocalSettings(
        n_threads=1, n_ctx=1024, parallel=4, timeout_s=60.0, speculative="prompt-lookup"
    )
    started = LocalEngine(settings, relevance=False)
    await started.start()
    yield started
    await started.stop()


def _answer(model: LocalModel, request: dict[str, Any]) -> str:
    model.forget()
    return str(model.chat(request)["choices"][0]["message"]["content"])


async def test_four_requests_are_decoded_together_with_the_answers_run_alone(
    engine: LocalEngine, alone: LocalModel
) -> None:
    deadline = time.monotonic() + 300
    requests = [_request(p) for p in PROMPTS]
    results = await asyncio.gather(*(engine.chat(r, deadline=deadline) for r in requests))
    for request, result in zip(requests, results, strict=True):
        assert result["choices"][0]["message"]["content"] == _answer(alone, request)
        assert result["frugal"]["quality"] is not None
    health = engine.health()
    assert health["parallel"] == 4 and health["active_sequences"] == 0
    assert health["batch"]["max_rows_per_step"] >= 2  # they did share decode steps
    assert health["batch"]["sequence_tok_s"] > 0


async def test_a_cancelled_request_leaves_the_batch_and_the_others_finish(
    engine: LocalEngine, alone: LocalModel
) -> None:
    pid = engine.health()["pid"]
    deadline = time.monotonic() + 300
    requests = [_request(p, 40) for p in PROMPTS]
    long = {**_request(PROMPTS[2], 900)}
    tasks = [asyncio.create_task(engine.chat(r, deadline=deadline)) for r in requests[:3]]
    doomed = asyncio.create_task(engine.chat(long, deadline=deadline))
    await settle(lambda: engine.active == 4, "four sequences in the batch")
    await asyncio.sleep(0.5)
    doomed.cancel()
    results = await asyncio.gather(*tasks)
    with pytest.raises(asyncio.CancelledError):
        await doomed
    for request, result in zip(requests, results, strict=False):
        assert result["choices"][0]["message"]["content"] == _answer(alone, request)
    assert engine.state == "ready" and engine.health()["pid"] == pid
    assert engine.stats.crashes == 0


async def test_a_deadline_ends_one_sequence_and_tools_run_alone(engine: LocalEngine) -> None:
    pid = engine.health()["pid"]
    now = time.monotonic()
    short = engine.chat(_request(PROMPTS[2], 900), deadline=now + 1.5)
    normal = engine.chat(_request(PROMPTS[0]), deadline=now + 300)
    tool_request = {**_request("What is the weather in Paris?"), "tools": [weather_tool()]}
    tool = engine.chat(tool_request, deadline=now + 300)
    cut, done, called = await asyncio.gather(short, normal, tool)
    assert cut["frugal"]["stop_cause"] == "deadline"
    assert done["frugal"]["stop_cause"] in ("eos", "max_tokens")
    assert called["choices"][0]["message"] is not None
    assert engine.health()["pid"] == pid and engine.stats.crashes == 0


async def test_a_worker_crash_fails_every_sequence_of_the_batch(engine: LocalEngine) -> None:
    deadline = time.monotonic() + 300
    tasks = [asyncio.create_task(engine.chat(_request(p, 900), deadline=deadline)) for p in PROMPTS]
    await settle(lambda: engine.active == 4, "four sequences in the batch")
    await asyncio.sleep(0.5)
    engine.worker.proc.kill()  # what an out-of-memory kill would do
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert all(isinstance(r, EngineCrashed) for r in results), results
    assert engine.stats.crashes == 1 and engine.active == 0
    await settle(lambda: engine.state not in ("starting", "restarting"), "the restart's end")
    again = await engine.chat(_request(PROMPTS[1], 4), deadline=time.monotonic() + 120)
    assert again["usage"]["completion_tokens"] >= 1


async def _wait_all_running(engine: LocalEngine, jobs: int) -> None:
    await settle(
        lambda: engine.active == jobs and bool((engine.stats.batch or {}).get("decode_steps")),
        f"{jobs} jobs running together",
    )


async def test_a_worker_crash_sends_each_batched_request_to_the_api_with_one_row(
    engine: LocalEngine, tmp_path: Path, fake_api: FakeAPI
) -> None:
    settings = settings_for(
        tmp_path, fake_api, router={"predictive": False}, local={"timeout_s": 120.0}
    )
    ids = [f"batch-crash-{i}" for i in range(4)]
    async with in_process(settings, engine, timeout_s=300) as client:

        def post(request_id: str, prompt: str) -> Any:
            return client.post(
                "/v1/chat/completions",
                json={
                    "model": "gpt-4o-mini",
                    "messages": [{"role": "user", "content": prompt}],
                    "max_tokens": 900,
                },
                headers={"x-request-id": request_id},
            )

        tasks = [asyncio.create_task(post(i, p)) for i, p in zip(ids, PROMPTS, strict=True)]
        await _wait_all_running(engine, 4)
        engine.worker.proc.kill()  # what an out-of-memory kill would do
        responses = await asyncio.gather(*tasks)
    for response in responses:
        assert response.status_code == 200, response.text
        assert response.headers["x-frugal-route"] == "api"
        assert response.headers["x-frugal-reason"] == "local_error"
    assert fake_api.count == 4
    conn = sqlite3.connect(tmp_path / "ledger.db")
    try:
        rows = conn.execute("SELECT request_id, route, reason FROM requests").fetchall()
    finally:
        conn.close()
    assert sorted(rows) == [(i, "api", "local_error") for i in ids]
    assert engine.stats.crashes == 1


async def test_healthz_and_metrics_show_the_batch_and_its_drafts(
    engine: LocalEngine, tmp_path: Path, fake_api: FakeAPI
) -> None:
    memo = (
        "From: Dana Reyes. To: all staff. The Leeds office moves to 14 Canal Street on 28 "
        "March. Movers arrive at 8 am; please pack your desks by 5 pm on 27 March."
    )
    copy = [f"Copy this memo word for word ({i}):\n\n{memo}" for i in range(3)]
    settings = settings_for(tmp_path, fake_api, quality={"threshold": 0.0})
    async with in_process(settings, engine, timeout_s=300) as client:
        body = {"model": "gpt-4o-mini", "max_tokens": 48, "temperature": 0}
        answers = await asyncio.gather(
            *(
                client.post(
                    "/v1/chat/completions",
                    json={**body, "messages": [{"role": "user", "content": p}]},
                    headers={"x-frugal-route": "local"},
                )
                for p in copy
            )
        )
        assert all(a.status_code == 200 for a in answers)
        health = (await client.get("/healthz")).json()["engine"]
        metrics = (await client.get("/metrics")).text
    assert health["parallel"] == 4 and health["active_sequences"] == 0
    batch = health["batch"]
    assert batch["max_rows_per_step"] >= 2 and batch["mean_rows_per_step"] > 1
    assert batch["aggregate_tok_s"] > 0 and batch["sequence_tok_s"] > 0
    assert batch["step_ms_by_rows"]["1"]["steps"] >= 1
    assert health["speculative"]["drafted"] > 0
    assert 0 < health["speculative"]["acceptance_rate"] <= 1
    values = {
        line.split()[0]: float(line.split()[1])
        for line in metrics.splitlines()
        if line.startswith("frugal_engine_")
    }
    assert values["frugal_engine_active_sequences"] == 0
    assert values["frugal_engine_batch_rows_per_step"] > 1
    assert values["frugal_engine_batch_tokens_per_second"] > 0
    assert values["frugal_engine_sequence_tokens_per_second"] > 0
    assert 0 < values["frugal_engine_draft_acceptance_ratio"] <= 1
