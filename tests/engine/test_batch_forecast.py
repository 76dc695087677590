"""The batched engine's forecast (batch/forecast.py): pure arithmetic, no model."""

from __future__ import annotations

import pytest

from proxy.engine.batch.forecast import BatchCosts, Work, forecast

# 100 prompt tokens/s; a decode step costs 20 ms with one row, 30 ms with two, 50 ms with four.
COSTS = BatchCosts(prefill_tok_s=100.0, step_s={1: 0.02, 2: 0.03, 4: 0.05})


def test_step_cost_is_measured_else_interpolated_else_extended() -> None:
    assert COSTS.step(2) == pytest.approx(0.03)
    assert COSTS.step(3) == pytest.approx(0.04)  # between 2 and 4
    # beyond the widest: a one-row step per extra row, the 2 -> 4 slope being shallower
    assert COSTS.step(6) == pytest.approx(0.05 + 2 * 0.02)
    lone = BatchCosts(prefill_tok_s=100.0, step_s={1: 0.03})
    assert lone.step(4) == pytest.approx(4 * 0.03)  # no batching gain until one is measured


def test_a_lone_request_takes_its_prefill_then_a_step_a_token() -> None:
    done = forecast([], [], Work(200, 50), slots=4, costs=COSTS)
    assert done.wait_s == 0.0
    assert done.finish_s == pytest.approx(2.0 + 50 * 0.02)


def test_answers_decoded_together_cost_a_step_of_their_rows_each_token() -> None:
    running = [Work(0, 100), Work(0, 100), Work(0, 100)]
    done = forecast(running, [], Work(0, 100), slots=4, costs=COSTS)
    assert done.finish_s == pytest.approx(100 * 0.05)  # four rows a step: 5 s, not 4 x 2 s


def test_a_prompt_step_is_followed_by_four_times_its_time_of_decode_steps() -> None:
    running = [Work(0, 100)]
    done = forecast(running, [], Work(1024, 10), slots=4, costs=COSTS)
    # 512 prompt tokens (5.12 s); the running answer's 100 steps alone (2 s, of the 20.48 s
    # owed); the other 512 (5.12 s); then 10 steps
    assert done.finish_s == pytest.approx(5.12 + 2.0 + 5.12 + 10 * 0.02)
    longer = forecast([Work(0, 2000)], [], Work(1024, 10), slots=4, costs=COSTS)
    # a longer answer gets its 20.48 s (1024 steps) before the prompt goes on, then both decode
    assert longer.finish_s == pytest.approx(5.12 + 1024 * 0.02 + 5.12 + 10 * 0.03)


def test_a_request_waits_for_a_slot_when_every_one_is_taken() -> None:
    running = [Work(0, 10), Work(0, 200)]
    done = forecast(running, [], Work(0, 10), slots=2, costs=COSTS)
    assert done.wait_s == pytest.approx(10 * 0.03)
    assert done.finish_s == pytest.approx(10 * 0.03 + 10 * 0.03)


def test_without_a_new_request_it_is_the_time_until_the_engine_is_idle() -> None:
    done = forecast([Work(0, 10)], [Work(100, 10)], None, slots=1, costs=COSTS)
    assert done.finish_s == pytest.approx(10 * 0.02 + 1.0 + 10 * 0.02)


def test_costs_come_from_the_batch_health_else_the_engine_rates() -> None:
    health = {"step_ms_by_rows": {"1": {"ms": 20.0, "steps": 9}}, "prefill_tok_s": 150.0}
    costs = BatchCosts.from_health(health, prefill_tok_s=90.0, decode_tok_s=40.0)
    assert costs is not None and costs.prefill_tok_s == 150.0
    assert costs.step(1) == pytest.approx(0.02)
    early = BatchCosts.from_health(None, prefill_tok_s=90.0, decode_tok_s=40.0)
    assert early is not None and early.step(1) == pytest.approx(0.025)
    assert BatchCosts.from_health(None, prefill_tok_s=None, decode_tok_s=None) is None
