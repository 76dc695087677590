"""``[local] parallel`` through the real worker process: several jobs in flight at once.

One ``LocalEngine`` with ``parallel = 4`` runs four greedy requests together; their answers are
the ones the single path gives in-process. One of four is cancelled (its client went away) or
hits its deadline: it leaves the batch, the others finish, and the worker is neither killed nor
restarted. Tools (not batchable) still run, alone, between batches. A worker crash fails every
sequence of the batch (each once), and the engine comes back.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from proxy.config import LocalSettings
from proxy.engine.client import LocalEngine
from proxy.engine.generate import LocalModel, bundled_model_path
from proxy.errors import EngineCrashed

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
    settings = LocalSettings(n_threads=1, n_ctx=1024, parallel=4, timeout_s=60.0)
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
    for _ in range(400):
        if engine.active == 4:
            break
        await asyncio.sleep(0.02)
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
    tool_request = {
        **_request("What is the weather in Paris?"),
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "get_weather",
                    "parameters": {
                        "type": "object",
                        "properties": {"city": {"type": "string"}},
                        "required": ["city"],
                    },
                },
            }
        ],
    }
    tool = engine.chat(tool_request, deadline=now + 300)
    cut, done, called = await asyncio.gather(short, normal, tool)
    assert cut["frugal"]["stop_cause"] == "deadline"
    assert done["frugal"]["stop_cause"] in ("eos", "max_tokens")
    assert called["choices"][0]["message"] is not None
    assert engine.health()["pid"] == pid and engine.stats.crashes == 0


async def test_a_worker_crash_fails_every_sequence_of_the_batch(engine: LocalEngine) -> None:
    deadline = time.monotonic() + 300
    tasks = [asyncio.create_task(engine.chat(_request(p, 900), deadline=deadline)) for p in PROMPTS]
    for _ in range(400):
        if engine.active == 4:
            break
        await asyncio.sleep(0.02)
    await asyncio.sleep(0.5)
    engine._proc.kill()  # what an out-of-memory kill would do
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert all(isinstance(r, EngineCrashed) for r in results), results
    assert engine.stats.crashes == 1 and engine.active == 0
    for _ in range(600):
        if engine.state == "ready":
            break
        await asyncio.sleep(0.05)
    again = await engine.chat(_request(PROMPTS[1], 4), deadline=time.monotonic() + 120)
    assert again["usage"]["completion_tokens"] >= 1
