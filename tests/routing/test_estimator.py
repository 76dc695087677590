"""The predicted finish time, and what it learns from: pure functions, no engine."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from proxy.config import RouterSettings
from proxy.engine.batch.forecast import BatchCosts, Work, forecast
from proxy.engine.rates import PendingWork, Rates
from proxy.ledger.db.migrate import open_database
from proxy.routing.estimator import (
    DEFAULT_ANSWER_TOKENS,
    MAX_LENGTH_MODELS,
    AnswerLengths,
    Ewma,
    PredictionErrors,
    Predictor,
    answer_cap,
    answers_per_request,
    batched,
    predict,
    read_ledger,
)

RATES = Rates(prefill_tok_s=100.0, decode_tok_s=10.0, source="requests")
IDLE = PendingWork(jobs=0, prefill_tokens=0, decode_tokens=0, decode_tokens_max=0)


def test_finish_counts_the_work_ahead_and_the_requests_own() -> None:
    ahead = PendingWork(jobs=2, prefill_tokens=300, decode_tokens=40, decode_tokens_max=80)
    p = predict("engine", rates=RATES, pending=ahead, prompt_tokens=200, completion_tokens=20)
    # (300 + 200) / 100 + (40 + 20) / 10
    assert p.seconds == pytest.approx(5.0 + 6.0)
    assert p.wait_s == pytest.approx(3.0 + 4.0)
    assert p.own_s == pytest.approx(2.0 + 2.0)
    assert p.jobs_ahead == 2 and p.rates_source == "requests"


def test_a_free_slot_means_no_wait_and_a_full_backend_shares_the_work_ahead() -> None:
    ahead = PendingWork(jobs=2, prefill_tokens=0, decode_tokens=40, decode_tokens_max=40)
    free = predict(
        "gpu", rates=RATES, pending=ahead, prompt_tokens=0, completion_tokens=10, slots=4
    )
    assert free.seconds == pytest.approx(1.0)
    full = predict(
        "gpu", rates=RATES, pending=ahead, prompt_tokens=0, completion_tokens=10, slots=2
    )
    assert full.seconds == pytest.approx(40 / 10 / 2 + 1.0)


def test_a_batched_engine_predicts_from_the_rows_ahead_and_its_step_costs() -> None:
    costs = BatchCosts(prefill_tok_s=100.0, step_s={1: 0.02, 2: 0.03, 3: 0.04, 4: 0.05})
    ahead = PendingWork(jobs=4, prefill_tokens=0, decode_tokens=400, decode_tokens_max=400)
    full = forecast([Work(0, 20)] + [Work(0, 100)] * 3, [], Work(50, 10), slots=4, costs=costs)
    p = batched(
        "engine", full, pending=ahead, prompt_tokens=50, completion_tokens=10, rates_source="batch"
    )
    # a slot frees after 20 four-row steps; then its prompt at 100 tok/s while the three others
    # wait (0.5 s), then 10 four-row steps
    assert p.wait_s == pytest.approx(20 * 0.05)
    assert p.seconds == pytest.approx(20 * 0.05 + 0.5 + 10 * 0.05)
    assert p.own_s == pytest.approx(p.seconds - p.wait_s)
    assert p.jobs_ahead == 4 and p.rates_source == "batch"
    # the serial finish-time formula would say 400 / 10 + ...: the batch is not a queue
    serial = predict("engine", rates=RATES, pending=ahead, prompt_tokens=50, completion_tokens=10)
    assert serial.seconds is not None and serial.seconds > 10 * p.seconds


def test_unknown_rates_predict_nothing() -> None:
    rates = Rates(prefill_tok_s=None, decode_tok_s=None, source="none")
    p = predict("engine", rates=rates, pending=IDLE, prompt_tokens=10, completion_tokens=10)
    assert p.seconds is None


def test_answer_cap_is_the_requests_own_else_the_default() -> None:
    assert answer_cap({"max_tokens": 40}, 512) == 40
    assert answer_cap({"max_completion_tokens": 30, "max_tokens": 40}, 512) == 30
    assert answer_cap({}, 512) == 512
    assert answer_cap({"prompt": "x"}, 512, kind="complete") == 16
    assert answers_per_request({"n": 3}) == 3
    assert answers_per_request({"prompt": ["a", "b"], "n": 2}) == 4


def test_answer_length_is_a_modest_default_until_answers_are_seen() -> None:
    lengths = AnswerLengths()
    assert lengths.expected("gpt-4o-mini", 512) == DEFAULT_ANSWER_TOKENS
    assert lengths.expected("gpt-4o-mini", 40) == 40


def test_answer_length_is_learned_per_model_under_the_cap() -> None:
    lengths = AnswerLengths()
    for n in (20, 40):
        lengths.observe("gpt-4o-mini", n, cut=False)
    lengths.observe("gpt-4o", 300, cut=False)
    assert lengths.expected("gpt-4o-mini", 512) == 30
    assert lengths.expected("gpt-4o-mini", 25) == (20 + 25) / 2
    assert lengths.expected("gpt-4o", 512) == 300
    # A model never seen: every model's answers.
    assert lengths.expected("other", 512) == (20 + 40 + 300) / 3


def test_an_answer_cut_short_only_says_it_reaches_that_length() -> None:
    """An answer cut at 16 tokens would have been at least 16 long: it reaches a cap of 16 or
    less, and says nothing about a cap of 200."""
    lengths = AnswerLengths()
    lengths.observe("m", 16, cut=True)
    assert lengths.expected("m", 200) == DEFAULT_ANSWER_TOKENS
    assert lengths.expected("m", 8) == 8
    lengths.observe("m", 10, cut=False)
    assert lengths.expected("m", 200) == 10
    assert lengths.expected("m", 12) == (12 + 10) / 2


def test_seeding_does_not_overwrite_what_was_observed_since_start() -> None:
    lengths = AnswerLengths()
    lengths.observe("live", 5, cut=False)
    lengths.seed([("live", 500), ("old", 50), ("old", 70)])
    assert lengths.expected("live", 1000) == 5
    assert lengths.expected("old", 1000) == 60
    assert lengths.seeded == 3


def test_read_ledger_returns_finished_local_answers_oldest_first(tmp_path: Path) -> None:
    db = tmp_path / "ledger.db"
    open_database(str(db))
    conn = sqlite3.connect(db)
    rows = [
        ("a", "local", "accepted", 200, 11),
        ("b", "api", "low_quality", 200, 22),
        ("c", "api", "local_timeout", 200, 99),  # cut by its deadline: not a length
        ("d", "api", "forced", 200, None),
        ("e", "local", "accepted", 200, 33),
    ]
    with conn:
        for i, (rid, route, reason, status, tokens) in enumerate(rows):
            conn.execute(
                "INSERT INTO requests (request_id, ts, endpoint, requested_model, route, reason, "
                "status, latency_ms, local_completion_tokens) VALUES (?, ?, 'chat.completions', "
                "'gpt-4o-mini', ?, ?, ?, 1.0, ?)",
                (rid, 1000.0 + i, route, reason, status, tokens),
            )
    conn.close()
    assert read_ledger(str(db)) == [("gpt-4o-mini", 11), ("gpt-4o-mini", 22), ("gpt-4o-mini", 33)]
    assert read_ledger(str(tmp_path / "missing.db")) == []


def test_mdape_is_the_median_of_the_absolute_percentage_errors() -> None:
    errors = PredictionErrors()
    assert errors.mdape() is None
    for predicted, actual in ((1.1, 1.0), (2.0, 4.0), (3.0, 3.0)):
        errors.add(predicted, actual)
    assert errors.mdape() == pytest.approx(0.1)
    assert errors.samples == 3


def test_ewma_starts_at_the_first_value() -> None:
    e = Ewma(alpha=0.5)
    assert e.value is None
    e.add(2.0)
    e.add(4.0)
    assert e.value == 3.0


def test_too_slow_past_the_deadline_only_when_predictive() -> None:
    on = Predictor(RouterSettings())
    assert on.too_slow(31.0, 30.0) and not on.too_slow(27.0, 30.0)
    assert on.too_slow(29.0, 30.0)  # under the deadline, but not by the margin
    assert not on.too_slow(None, 30.0)
    off = Predictor(RouterSettings(predictive=False))
    assert not off.too_slow(1000.0, 30.0)


def test_latency_objective_compares_with_the_apis_latency_plus_the_margin() -> None:
    latency = Predictor(RouterSettings(objective="latency", latency_margin_s=0.5))
    assert not latency.too_slow(5.0, 30.0)  # the API's latency is not known yet
    latency.observe({"route": "api", "status": 200, "api_ms": 2000.0})
    latency.observe({"route": "api", "status": 502, "api_ms": 10.0})  # a failure: not counted
    latency.observe({"route": "local", "status": 200, "api_ms": 0.0})
    assert latency.api_latency.value == 2.0
    assert latency.too_slow(2.6, 30.0) and not latency.too_slow(2.4, 30.0)
    cost = Predictor(RouterSettings(objective="cost"))
    cost.observe({"route": "api", "status": 200, "api_ms": 2000.0})
    assert not cost.too_slow(2.6, 30.0)


def test_learn_records_the_actual_time_only_for_answers_that_ran_to_their_end() -> None:
    predictor = Predictor(RouterSettings())
    request = {"model": "m", "messages": [], "max_tokens": 50}

    def answer(tokens: int, stop: str, finish: str = "stop") -> dict[str, object]:
        return {
            "choices": [{"finish_reason": finish}],
            "usage": {"completion_tokens": tokens},
            "frugal": {"stop_cause": stop},
        }

    learn = predictor.learn
    assert learn(request, answer(10, "eos"), predicted_s=1.2, elapsed_s=1.0, comparable=True) == 1
    assert predictor.errors.mdape() == pytest.approx(0.2)
    # Cut by its deadline: learned as a long answer, not as a time.
    cut = answer(5, "deadline", "length")
    assert learn(request, cut, predicted_s=1.0, elapsed_s=9.0, comparable=True) is None
    # Moved to another backend: not comparable with the prediction.
    assert learn(request, answer(10, "eos"), predicted_s=1, elapsed_s=3, comparable=False) is None
    assert predictor.learn(request, None, predicted_s=1.0, elapsed_s=3.0, comparable=True) is None
    assert predictor.errors.samples == 1
    assert predictor.lengths.expected("m", 50) == 10  # the cut one says nothing about 50
    assert predictor.lengths.expected("m", 5) == 5


def test_answer_lengths_stay_bounded_after_1500_made_up_model_names() -> None:
    """A client names the model: past MAX_LENGTH_MODELS names, the answers of the others share
    one window, and the table holds no more (issue 39)."""
    lengths = AnswerLengths()
    lengths.observe("gpt-4o-mini", 20, cut=False)
    for i in range(1500):
        lengths.observe(f"made-up-{i}", 300, cut=False)
    lengths.observe("gpt-4o-mini", 40, cut=False)
    table = lengths.as_dict()
    print(f"\nafter 1,500 made-up names: {table}")
    assert table["models"] == MAX_LENGTH_MODELS
    assert table["folded_answers"] == 1500 - (MAX_LENGTH_MODELS - 1)
    assert lengths.expected("gpt-4o-mini", 512) == 30  # its own window, as before
    assert lengths.expected("made-up-1499", 512) == 300  # the folded names' window
    assert lengths.expected("never-seen", 512) == 300  # a new name past the limit: folded too


def test_seeding_keeps_the_busiest_names_and_folds_the_rest() -> None:
    lengths = AnswerLengths(max_models=2)
    lengths.observe("live", 5, cut=False)
    rows: list[tuple[str | None, int]] = [("rare", 900), ("busy", 10), ("busy", 30)]
    rows += [(f"junk-{i}", 700) for i in range(50)]
    lengths.seed(rows)
    assert lengths.as_dict()["models"] == 2
    assert lengths.expected("busy", 1000) == 20
    assert lengths.expected("rare", 1000) == (900 + 700 * 50) / 51  # folded with the junk
    assert lengths.folded == 51
