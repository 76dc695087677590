"""The local engine: the real SmolLM2 in a real worker process."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

from proxy.config import LocalSettings
from proxy.engine.local_engine import ContextOverflow, LocalEngine
from proxy.engine.model_files import ModelLoadError
from proxy.errors import EngineBusy
from tests.engine.conftest import started

QUESTION = {"role": "user", "content": "Name three colors."}


def _deadline(seconds: float = 30.0) -> float:
    return time.monotonic() + seconds


async def test_greedy_answer_carries_the_logprob_of_each_sampled_token(
    engine: LocalEngine,
) -> None:
    request = {
        "messages": [QUESTION],
        "max_tokens": 24,
        "temperature": 0,
        "top_logprobs": 3,
        "logprobs": True,
    }
    completion = await engine.chat(request, deadline=_deadline())
    choice = completion["choices"][0]
    entries = choice["logprobs"]["content"]
    assert choice["message"]["content"].strip()
    assert len(entries) == completion["usage"]["completion_tokens"]
    assert "".join(e["token"] for e in entries).startswith(choice["message"]["content"][:8])
    for entry in entries:
        assert entry["logprob"] <= 0.0
        # Greedy decoding picks the most likely token, so it must be the first alternative.
        assert entry["top_logprobs"][0]["token"] == entry["token"]
        assert entry["top_logprobs"][0]["logprob"] == pytest.approx(entry["logprob"], abs=1e-5)
        assert entry["top_logprobs"][0]["logprob"] >= entry["top_logprobs"][1]["logprob"]


async def test_same_request_twice_gives_the_same_greedy_answer_from_the_prefix_cache(
    engine: LocalEngine,
) -> None:
    request = {
        "messages": [{"role": "system", "content": "You answer briefly. " * 20}, QUESTION],
        "max_tokens": 16,
        "temperature": 0,
    }
    first = await engine.chat(request, deadline=_deadline())
    second = await engine.chat(request, deadline=_deadline())
    assert first["choices"][0]["message"] == second["choices"][0]["message"]
    prompt = second["usage"]["prompt_tokens"]
    assert second["frugal"]["cached_tokens"] == prompt - 1
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] == prompt - 1


async def test_max_tokens_cut_is_reported_as_the_clients_own(engine: LocalEngine) -> None:
    request = {
        "messages": [{"role": "user", "content": "Write a long story about a dragon."}],
        "max_tokens": 5,
    }
    completion = await engine.chat(request, deadline=_deadline())
    assert completion["usage"]["completion_tokens"] == 5
    assert completion["choices"][0]["finish_reason"] == "length"
    assert completion["frugal"]["stop_cause"] == "max_tokens"


async def test_stop_sequence_ends_the_answer_before_it(engine: LocalEngine) -> None:
    request = {
        "messages": [{"role": "user", "content": "Count from 1 to 10, separated by commas."}],
        "max_tokens": 40,
    }
    full = await engine.chat(request, deadline=_deadline())
    text = full["choices"][0]["message"]["content"]
    assert "3" in text, text
    stopped = await engine.chat({**request, "stop": ["3"]}, deadline=_deadline())
    assert stopped["choices"][0]["message"]["content"] == text[: text.index("3")]
    assert stopped["frugal"]["stop_cause"] == "stop_sequence"
    assert stopped["choices"][0]["finish_reason"] == "stop"


async def test_live_tokens_arrive_in_order_and_add_up_to_the_answer(engine: LocalEngine) -> None:
    pieces: list[str] = []
    request = {"messages": [QUESTION], "max_tokens": 20}
    completion = await engine.chat(request, deadline=_deadline(), on_token=pieces.append)
    assert len(pieces) > 1
    assert "".join(pieces) == completion["choices"][0]["message"]["content"]


async def test_deadline_stops_the_generation_and_frees_the_engine(engine: LocalEngine) -> None:
    request = {
        "messages": [{"role": "user", "content": "Write a very long essay on rivers."}],
        "max_tokens": 3000,
    }
    started = time.monotonic()
    completion = await engine.chat(request, deadline=time.monotonic() + 0.8)
    assert completion["frugal"]["stop_cause"] == "deadline"
    assert completion["choices"][0]["finish_reason"] == "length"
    assert 0 < completion["usage"]["completion_tokens"] < 3000
    assert not engine.busy
    # The worker stopped itself (it checks the deadline every token): no kill was needed.
    assert engine.health()["pid"] is not None and engine.state == "ready"
    assert time.monotonic() - started < 30


async def test_a_prompt_longer_than_the_context_is_refused_before_generation() -> None:
    small = LocalEngine(LocalSettings(n_ctx=256, n_threads=1))
    await small.start()
    try:
        words = " ".join(["river"] * 400)
        with pytest.raises(ContextOverflow):
            await small.chat(
                {"messages": [{"role": "user", "content": words}]}, deadline=_deadline()
            )
        ok = await small.chat({"messages": [QUESTION], "max_tokens": 4}, deadline=_deadline())
        assert ok["usage"]["completion_tokens"] > 0
    finally:
        await small.stop()


async def test_a_full_queue_refuses_new_work_at_once() -> None:
    async with started(n_threads=1, max_queue=1, parallel=1) as own:  # one slot
        long = {"messages": [{"role": "user", "content": "Write a long story."}], "max_tokens": 200}
        running = asyncio.create_task(own.chat(long, deadline=_deadline()))
        await asyncio.sleep(0.2)
        waiting = asyncio.create_task(own.chat(long, deadline=_deadline()))
        await asyncio.sleep(0.05)
        assert own.queue_depth == 1
        with pytest.raises(EngineBusy):
            await own.chat(long, deadline=_deadline())
        waiting.cancel()
        running.cancel()
        await asyncio.gather(running, waiting, return_exceptions=True)
        # Cancelled jobs stop their generation; the engine serves the next request.
        done = await own.chat({"messages": [QUESTION], "max_tokens": 4}, deadline=_deadline())
        assert done["usage"]["completion_tokens"] > 0


async def test_missing_model_file_is_a_clear_start_error(tmp_path: Path) -> None:
    missing = tmp_path / "nope.gguf"
    with pytest.raises(ModelLoadError, match=str(missing)):
        await LocalEngine(LocalSettings(model_path=str(missing))).start()


async def test_corrupt_model_file_is_a_clear_start_error(tmp_path: Path) -> None:
    corrupt = tmp_path / "corrupt.gguf"
    corrupt.write_bytes(b"GGUF" + os.urandom(4096))
    with pytest.raises(ModelLoadError, match="corrupt.gguf"):
        await LocalEngine(LocalSettings(model_path=str(corrupt))).start()
