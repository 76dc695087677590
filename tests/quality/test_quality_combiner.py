"""The combiner: features to a Score, reasons in order, hard caps, and the committed weights."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from quality import Score, Signal, score
from quality.combiner import (
    MODEL_FEATURES,
    WEIGHTS_PATH,
    Combiner,
    Model,
    default_combiner,
)
from quality.dev.fit_weights import (
    FAULTS,
    MIN_ACCEPTED,
    fit_constrained,
    fit_logistic,
    operating_offset,
)


def model(coef: dict[str, float], intercept: float = 0.0) -> Model:
    names = tuple(coef)
    return Model(
        features=names,
        mean=(0.0,) * len(names),
        scale=(1.0,) * len(names),
        coef=tuple(coef.values()),
        intercept=intercept,
    )


HAND = Combiner(
    full=model({"conf_mean": 2.0, "fmt_fail": -3.0, "refusal": -2.0}, intercept=2.0),
    no_logprobs=model({"fmt_fail": -3.0, "refusal": -2.0}, intercept=1.0),
)


def confident(mean: float) -> Signal:
    return Signal("confidence", applied=True, features={"conf_mean": mean})


def test_a_confident_clean_answer_scores_high_and_an_unsure_one_low() -> None:
    sure = HAND.combine([confident(-0.1)])
    unsure = HAND.combine([confident(-2.5)])
    assert sure.value == pytest.approx(1 / (1 + np.exp(-(2.0 - 0.2))))
    assert unsure.value < 0.6 <= sure.value


def test_without_confidence_the_no_logprobs_model_is_used() -> None:
    s = HAND.combine([Signal("confidence", applied=False), Signal("degeneration", applied=True)])
    assert s.value == pytest.approx(1 / (1 + np.exp(-1.0)))
    assert s.signals == ["degeneration"]


def test_missing_answer_features_take_their_neutral_default() -> None:
    s = HAND.combine([confident(-0.1), Signal("evasion", applied=False)])
    assert s.value == pytest.approx(HAND.combine([confident(-0.1)]).value)


def test_a_hard_failure_caps_the_score_but_keeps_the_order() -> None:
    good = HAND.combine([confident(-0.1), Signal("format", True, hard=("json_invalid",))])
    bad = HAND.combine([confident(-3.0), Signal("format", True, hard=("json_invalid",))])
    assert good.value <= HAND.hard_cap
    assert bad.value < good.value
    assert good.reasons == ["json_invalid"]


def test_soft_reasons_are_ordered_by_what_they_cost() -> None:
    signals = [
        confident(-0.1),
        Signal("evasion", True, features={"refusal": 1.0}, soft={"refusal": "refusal"}),
        Signal(
            "instructions", True, features={"fmt_fail": 1.0}, soft={"format:one_word": "fmt_fail"}
        ),
        Signal("degeneration", True, hard=("template_leak",)),
    ]
    s = HAND.combine(signals)
    assert s.reasons == ["template_leak", "format:one_word", "refusal"]


def test_a_combiner_round_trips_through_its_dict_form() -> None:
    data: dict[str, Any] = {
        "hard_cap": 0.05,
        "models": {"full": HAND.full.to_dict(), "no_logprobs": HAND.no_logprobs.to_dict()},
    }
    again = Combiner.from_dict(json.loads(json.dumps(data)))
    assert again.full == HAND.full and again.hard_cap == 0.05


def test_mismatched_weight_lengths_are_rejected() -> None:
    bad = {
        "features": ["a", "b"],
        "mean": [0.0],
        "scale": [1.0, 1.0],
        "coef": [1, 1],
        "intercept": 0,
    }
    with pytest.raises(ValueError, match="differ in length"):
        Model.from_dict(bad)


def test_score_accepts_an_explicit_combiner() -> None:
    req = {"messages": [{"role": "user", "content": "Say hi."}]}
    comp = {"choices": [{"message": {"content": "Hi!"}, "finish_reason": "stop"}]}
    s = score(req, comp, combiner=HAND)
    assert isinstance(s, Score)
    assert s.value == pytest.approx(1 / (1 + np.exp(-1.0)))


# --- the committed weights --------------------------------------------------------------------


def test_committed_weights_cover_exactly_the_features_the_signals_produce() -> None:
    weights = json.loads(WEIGHTS_PATH.read_text())
    assert set(weights["models"]) == set(MODEL_FEATURES)
    for name, features in MODEL_FEATURES.items():
        assert tuple(weights["models"][name]["features"]) == features
    assert "calibrate" in weights["note"]


def test_committed_weights_never_reward_a_fault() -> None:
    combiner = default_combiner()
    models = [combiner.full, combiner.no_logprobs]
    models += [m for m in (combiner.full_no_relevance, combiner.no_logprobs_no_relevance) if m]
    assert len(models) == 4
    for m in models:
        for name, coef in zip(m.features, m.coef, strict=True):
            if name in FAULTS:
                assert coef <= 0.0, name


# --- the fit ----------------------------------------------------------------------------------


def test_newton_fit_recovers_known_logistic_weights() -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(4000, 2))
    true_w, true_b = np.array([1.5, -2.0]), 0.5
    p = 1 / (1 + np.exp(-(x @ true_w + true_b)))
    y = (rng.random(4000) < p).astype(float)
    w, b = fit_logistic(x, y, lam=1e-6)
    assert w == pytest.approx(true_w, abs=0.15)
    assert b == pytest.approx(true_b, abs=0.15)


def test_l2_shrinks_the_weights() -> None:
    rng = np.random.default_rng(1)
    x = rng.normal(size=(300, 1))
    y = (x[:, 0] + rng.normal(scale=0.5, size=300) > 0).astype(float)
    loose, _ = fit_logistic(x, y, lam=1e-6)
    tight, _ = fit_logistic(x, y, lam=100.0)
    assert 0 < tight[0] < loose[0]


def test_a_fault_feature_that_would_fit_positive_is_pinned_to_zero() -> None:
    rng = np.random.default_rng(2)
    x = rng.normal(size=(500, 2))
    y = (x[:, 0] + x[:, 1] > 0).astype(float)  # both features "help" on this data
    coef, _ = fit_constrained(x, y, 1.0, ["conf_mean", "refusal"])
    assert coef[0] > 0
    assert coef[1] == 0.0


def test_the_operating_offset_is_the_smallest_that_reaches_the_target_precision() -> None:
    # 40 answers: the 12 highest right, then 2 wrong, 8 right, and 20 wrong far below
    logits = np.array(
        [4.0 - 0.1 * i for i in range(12)] + [2.8, 2.7] + [2.6 - 0.1 * i for i in range(8)]
    )
    logits = np.concatenate([logits, np.full(20, -1.0)])
    y = np.array([1] * 12 + [0, 0] + [1] * 8 + [0] * 20, dtype=float)
    cut = np.log(0.6 / 0.4)

    def precision(offset: float) -> float:
        return float(y[logits - offset >= cut].mean())

    # accepting all 22 high answers happens to reach 0.9 (20/22), but stricter offsets that
    # accept 14 (12/14) do not: that lucky step is not taken
    assert precision(1.4) >= 0.9
    assert precision(2.2) < 0.9
    offset = operating_offset(logits, y)
    assert offset == pytest.approx(2.3)
    for stricter in np.arange(offset, 4.0, 0.1):
        if (logits - stricter >= cut).sum() >= MIN_ACCEPTED:
            assert precision(stricter) >= 0.9


def test_committed_weights_are_what_calibration_fits_on_the_cached_answers() -> None:
    from quality.dev.devset import load
    from quality.dev.fit_weights import calibrate
    from quality.dev.local_answers import grade, load_answers
    from quality.relevance import Embedder

    prompts = [p for p in load() if p.split == "train"]
    weights, _ = calibrate(grade(prompts, load_answers()), Embedder.load())
    committed = json.loads(WEIGHTS_PATH.read_text())
    for name in MODEL_FEATURES:
        fresh, saved = weights["models"][name], committed["models"][name]
        assert fresh["features"] == saved["features"]
        assert fresh["coef"] == pytest.approx(saved["coef"], abs=1e-9)
        assert fresh["intercept"] == pytest.approx(saved["intercept"], abs=1e-9)
