"""Predicted finish on the batched engine when long prompts arrive together (issue 28).

Pure and fast: the forecast (proxy/engine/batch/forecast.py), the batch's own counters
(BatchStats), a LocalEngine that is never started (its queue of tickets, no worker, no model)
and the Predictor's decision. No clock is read.
"""

from __future__ import annotations

import asyncio

import pytest

from proxy.config import LocalSettings, RouterSettings
from proxy.engine.batch.forecast import BatchCosts, Work, forecast
from proxy.engine.batch.sequence import BatchStats
from proxy.engine.fair_queue import share_label
from proxy.engine.local_engine import LocalEngine
from proxy.routing.estimator import DEADLINE_MARGIN, Predictor
from proxy.routing.pool import EngineBackend

# 100 prompt tokens/s; a decode step of one sequence 20 ms, of two 30 ms, of four 50 ms.
COSTS = BatchCosts(prefill_tok_s=100.0, step_s={1: 0.02, 2: 0.03, 4: 0.05})


def test_every_prompt_being_read_or_queued_ahead_is_read_before_the_new_one() -> None:
    # Three 512-token prompts arrived a moment ago, none read yet; the new one is the fourth.
    ahead = [Work(512, 10), Work(512, 10), Work(512, 10)]
    done = forecast(ahead, [], Work(512, 10), slots=4, costs=COSTS)
    # A read (5.12 s); B read, A's answer waits for it (the prompts' turn comes first); A and B
    # decode together (10 two-row steps); C read; C decodes alone; the new one read, then its
    # own 10 steps: every prompt ahead costs the new request its whole prefill.
    assert done.wait_s == 0.0
    assert done.finish_s == pytest.approx(4 * 5.12 + 10 * 0.03 + 10 * 0.02 + 10 * 0.02)
    # One more prompt queued behind a full batch is read before the new one too.
    queued = forecast(ahead + [Work(0, 10)], [Work(512, 10)], Work(512, 10), slots=4, costs=COSTS)
    assert queued.finish_s > done.finish_s + 5.12


def test_a_width_never_measured_costs_a_one_row_step_per_extra_sequence() -> None:
    # Only one-row steps measured (a warm-up of lone requests): four answers decoding together
    # are not predicted as if a row were nearly free.
    lone = BatchCosts(prefill_tok_s=100.0, step_s={1: 0.02})
    assert lone.step(4) == pytest.approx(4 * 0.02)
    running = [Work(0, 100), Work(0, 100), Work(0, 100)]
    done = forecast(running, [], Work(0, 100), slots=4, costs=lone)
    assert done.finish_s == pytest.approx(100 * 0.08)
    # A steeper measured slope is followed beyond the widest measured width.
    steep = BatchCosts(prefill_tok_s=100.0, step_s={1: 0.02, 2: 0.05})
    assert steep.step(4) == pytest.approx(0.05 + 2 * 0.03)
    # Between measured widths, interpolated; measured ones as measured.
    assert COSTS.step(3) == pytest.approx(0.04) and COSTS.step(4) == pytest.approx(0.05)


def test_rates_by_width_count_a_steps_cost_and_the_tokens_each_sequence_gets() -> None:
    # With speculation a step of one sequence carries drafted rows: by rows it looks like a
    # 3-row step, by width it is one sequence's step, 25 ms, giving 1.6 tokens on average.
    health = {
        "prefill_tok_s": 100.0,
        "step_ms_by_rows": {"1": {"ms": 20.0, "steps": 9}, "3": {"ms": 45.0, "steps": 9}},
        "step_ms_by_width": {
            "1": {"ms": 25.0, "tokens_per_sequence": 1.6, "steps": 40},
            "2": {"ms": 40.0, "tokens_per_sequence": 1.25, "steps": 12},
        },
    }
    costs = BatchCosts.from_health(health, prefill_tok_s=90.0, decode_tok_s=40.0)
    assert costs is not None
    assert costs.step(1) == pytest.approx(0.025) and costs.step(2) == pytest.approx(0.04)
    assert costs.per_step(1) == 1.6 and costs.per_step(2) == 1.25
    assert costs.per_step(4) == 1.25  # the widest measured below it
    alone = forecast([], [], Work(0, 100), slots=4, costs=costs)
    assert alone.finish_s == pytest.approx(63 * 0.025)  # ceil(100 / 1.6) steps
    # Without widths, the rows table (one token a step), as before.
    rows_only = BatchCosts.from_health(
        {"prefill_tok_s": 100.0, "step_ms_by_rows": health["step_ms_by_rows"]},
        prefill_tok_s=None,
        decode_tok_s=None,
    )
    assert rows_only is not None and rows_only.per_step(1) == 1.0
    assert rows_only.step(1) == pytest.approx(0.02)


def test_the_batch_counts_its_decode_steps_by_width_for_the_forecast() -> None:
    stats = BatchStats()
    for _ in range(4):
        stats.decoded_step(1, 0.02, 1)
        stats.decoded_step(2, 0.035, 3)  # two sequences, one drafted token accepted
    table = stats.as_dict()["step_ms_by_width"]
    assert table == {
        "1": {"ms": 20.0, "tokens_per_sequence": 1.0, "steps": 4},
        "2": {"ms": 35.0, "tokens_per_sequence": 1.5, "steps": 4},
    }
    stats.decoded_step(1, 1.0, 1)  # preempted: counts as twice the average
    assert stats.as_dict()["step_ms_by_width"]["1"]["ms"] == pytest.approx(20.0 + 0.15 * 20.0)
    stats.decoded_step(0, 0.5, 0)  # no sequence: not a decode step
    assert set(stats.as_dict()["step_ms_by_width"]) == {"1", "2"}
    costs = BatchCosts.from_health(stats.as_dict(), prefill_tok_s=100.0, decode_tok_s=None)
    assert costs is not None and costs.per_step(2) == 1.5


def _long_request() -> dict[str, object]:
    # 2,048 bytes: 512 tokens at the tracker's first guess of 4 bytes a token, plus 4 for the
    # chat template.
    return {
        "model": "gpt-4o-mini",
        "messages": [{"role": "user", "content": "x" * 2048}],
        "max_tokens": 10,
    }


def test_the_engine_predicts_the_fourth_of_a_burst_behind_three_prompts_in_its_batch() -> None:
    engine = LocalEngine(LocalSettings(parallel=4))  # never started: no worker, no model
    engine.stats.batch = {
        "prefill_tok_s": 100.0,
        "step_ms_by_width": {"1": {"ms": 20.0, "tokens_per_sequence": 1.0, "steps": 50}},
    }
    backend = EngineBackend(engine, timeout_s=30.0)
    first = backend.predict(_long_request(), 10.0)
    for _ in range(3):  # three more arrive and take a slot before any prompt is read
        engine.work.start(engine.work.admit(_long_request(), 10))
    fourth = backend.predict(_long_request(), 10.0)
    assert first.seconds is not None and fourth.seconds is not None
    assert fourth.jobs_ahead == 3
    # Every prompt ahead is read first: four prefills of 516 tokens; the first two answers
    # decode together (a two-wide step, never measured: 40 ms), then the third, then its own.
    assert fourth.seconds == pytest.approx(4 * 5.16 + 10 * 0.04 + 10 * 0.02 + 10 * 0.02)
    assert fourth.rates_source == "batch"
    assert fourth.seconds > first.seconds + 3 * 5.16
    assert fourth.wait_s == 0.0  # a slot was free: it waits for prompts, not for a slot


def test_a_prediction_just_under_the_deadline_is_not_admitted() -> None:
    predictor = Predictor(RouterSettings())
    deadline = 30.0
    assert predictor.too_slow(deadline * 0.97, deadline)  # 3% to spare: a coin toss
    assert predictor.too_slow(deadline / (1 + DEADLINE_MARGIN) + 0.01, deadline)
    assert not predictor.too_slow(deadline / (1 + DEADLINE_MARGIN) - 0.01, deadline)
    assert not predictor.too_slow(deadline * 0.8, deadline)
    naive = Predictor(RouterSettings(predictive=False))
    assert not naive.too_slow(deadline * 0.97, deadline)


async def test_a_key_with_nothing_waiting_is_predicted_behind_the_running_work_only() -> None:
    """One key holds the four slots and twelve jobs waiting (issue 39). Another key's request
    takes the next free slot (proxy/engine/fair_queue.py), so its prediction counts the four
    running jobs, not the twelve waiting; the first key's own next one follows all sixteen."""
    engine = LocalEngine(LocalSettings(parallel=4))  # never started: no worker, no model
    engine.stats.batch = {
        "prefill_tok_s": 100.0,
        "step_ms_by_width": {"1": {"ms": 20.0, "tokens_per_sequence": 1.0, "steps": 50}},
    }
    backend = EngineBackend(engine, timeout_s=30.0)
    hog, other = share_label("id:1"), share_label("id:2")
    slots = engine._slots  # the queue in front of the worker, driven here without one
    for _ in range(4):
        assert await slots.acquire(hog, timeout=1.0)
        engine.work.start(engine.work.admit(_long_request(), 10, hog))
    waiting = []
    for _ in range(12):
        engine.work.admit(_long_request(), 10, hog)
        waiting.append(asyncio.create_task(slots.acquire(hog, timeout=60.0)))
    await asyncio.sleep(0)
    try:
        assert slots.waiting() == 12
        fair = backend.predict_for(_long_request(), 10.0, other)
        own = backend.predict_for(_long_request(), 10.0, hog)
        everyone = backend.predict(_long_request(), 10.0)
    finally:
        for task in waiting:
            task.cancel()
        await asyncio.gather(*waiting, return_exceptions=True)
    print(f"\npredicted: another key {fair.seconds} s, the same key {own.seconds} s")
    assert fair.jobs_ahead == 4
    assert own.jobs_ahead == everyone.jobs_ahead == 16
    assert fair.seconds is not None and own.seconds is not None
    assert own.seconds == everyone.seconds and fair.seconds < own.seconds
