"""What the engine has done, from its answers (engine_stats.py): pure bookkeeping, no model."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.engine.engine_stats import EngineStats


def _answer(
    *, prefilled: int, prefill_s: float, decoded: int, decode_s: float, **frugal: Any
) -> dict[str, Any]:
    return {
        "usage": {"completion_tokens": decoded},
        "frugal": {
            "prefilled_tokens": prefilled,
            "prefill_s": prefill_s,
            "decode_s": decode_s,
            "stop_cause": "eos",
            **frugal,
        },
    }


def test_rates_start_from_the_calibration_then_follow_the_answers() -> None:
    stats = EngineStats()
    stats.calibrated({"prefill_tok_s": 100.0, "decode_tok_s": 40.0})
    assert (stats.prefill_tok_s, stats.decode_tok_s, stats.rates_source) == (
        100.0,
        40.0,
        "calibration",
    )
    stats.observe(_answer(prefilled=200, prefill_s=1.0, decoded=21, decode_s=1.0))
    assert stats.prefill_tok_s == pytest.approx(100.0 + 0.2 * (200.0 - 100.0))
    assert stats.decode_tok_s == pytest.approx(40.0 + 0.2 * (20.0 - 40.0))
    assert stats.rates_source == "requests"
    stats.calibrated({"prefill_tok_s": 1.0, "decode_tok_s": 1.0})  # too late: ignored
    assert stats.rates_source == "requests"


def test_an_answer_stopped_in_its_prompt_says_nothing_of_the_prefill_rate() -> None:
    stats = EngineStats()
    cut = _answer(prefilled=300, prefill_s=0.5, decoded=0, decode_s=0.0)
    cut["frugal"]["stop_cause"] = "deadline"
    stats.observe(cut)
    assert stats.prefill_tok_s is None and stats.rates_source == "none"


def test_drafts_and_the_batch_are_counted_from_each_answer() -> None:
    stats = EngineStats()
    batch = {"engine": {"decode_steps": 9, "mean_rows_per_step": 3.0}, "tok_s": 30.0}
    spec = {"drafted": 10, "accepted": 6}
    stats.observe(
        _answer(prefilled=20, prefill_s=0.2, decoded=5, decode_s=0.1, speculative=spec, batch=batch)
    )
    stats.observe(
        _answer(prefilled=20, prefill_s=0.2, decoded=5, decode_s=0.1, speculative={"drafted": 0})
    )
    assert (stats.speculated, stats.drafted, stats.accepted) == (2, 10, 6)
    assert stats.acceptance_rate == pytest.approx(0.6)
    assert stats.batch == {"decode_steps": 9, "mean_rows_per_step": 3.0}
    assert stats.sequence_tok_s == 30.0
