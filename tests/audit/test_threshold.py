"""Choosing the threshold for a target precision from (score, verdict, weight) audits."""

from __future__ import annotations

import pytest

from proxy.ledger.audits.estimate import wilson
from proxy.ledger.audits.threshold import ACCEPT_NOTHING, choose_threshold


def graded(
    score: float, right: int, wrong: int, weight: float = 1.0
) -> list[tuple[float, bool, float]]:
    return [(score, True, weight)] * right + [(score, False, weight)] * wrong


def test_no_target_keeps_the_configured_threshold() -> None:
    choice = choose_threshold(graded(0.9, 100, 0), target_precision=None, configured=0.6)
    assert (choice.threshold, choice.source, choice.n) == (0.6, "configured", 100)
    assert "no target" in choice.why


def test_too_few_audits_keep_the_configured_threshold() -> None:
    audits = graded(0.9, 29, 0) + [(0.8, None, 1.0)] * 50  # failed audits do not count
    choice = choose_threshold(audits, target_precision=0.9, configured=0.6)
    assert (choice.threshold, choice.source, choice.n) == (0.6, "configured", 29)
    assert "29 of the 30" in choice.why


def test_the_lowest_threshold_whose_lower_bound_reaches_the_target() -> None:
    # 0.9: 60 right; 0.7: 40 right, 2 wrong; 0.5: 10 right, 30 wrong.
    audits = graded(0.9, 60, 0) + graded(0.7, 40, 2) + graded(0.5, 10, 30)
    choice = choose_threshold(audits, target_precision=0.85, configured=0.6)
    low_at_07 = wilson(100 / 102, 102)[0]
    assert low_at_07 >= 0.85 > wilson(110 / 142, 142)[0]  # the hand check of the premise
    assert (choice.threshold, choice.source, choice.n) == (0.7, "target", 102)
    assert choice.precision_low == pytest.approx(low_at_07)
    assert "0.85" in choice.why and "102" in choice.why


def test_a_lower_threshold_is_chosen_when_it_also_reaches_the_target() -> None:
    audits = graded(0.9, 60, 0) + graded(0.3, 200, 0)
    assert choose_threshold(audits, target_precision=0.9, configured=0.6).threshold == 0.3


def test_a_threshold_needs_min_audits_above_it() -> None:
    # 20 perfect answers at 0.95 would reach any target, but 20 are too few to rest on.
    audits = graded(0.95, 20, 0) + graded(0.4, 30, 30)
    choice = choose_threshold(audits, target_precision=0.8, configured=0.6)
    assert choice.source == "accept_nothing"


def test_when_nothing_reaches_the_target_it_says_so_and_accepts_nothing() -> None:
    audits = graded(0.9, 50, 10) + graded(0.5, 20, 40)
    choice = choose_threshold(audits, target_precision=0.9, configured=0.6)
    assert choice.threshold == ACCEPT_NOTHING and choice.threshold > 1
    assert choice.source == "accept_nothing" and choice.n == 120
    assert choice.why.startswith("no threshold reaches target precision 0.9 on 120 audits")
    assert "accepting no local answer" in choice.why
    assert choice.precision_low == pytest.approx(wilson(50 / 60, 60)[0])


def test_weights_count_in_the_precision() -> None:
    # At 0.8: 40 right at weight 1 and 10 wrong at weight 50 (a low-rate period).
    audits = graded(0.8, 40, 0) + graded(0.8, 0, 10, weight=50.0)
    choice = choose_threshold(audits, target_precision=0.5, configured=0.6)
    assert choice.source == "accept_nothing"
    unweighted = [(s, v, 1.0) for s, v, _ in audits]
    assert choose_threshold(unweighted, target_precision=0.5, configured=0.6).threshold == 0.8


def test_order_of_audits_does_not_matter() -> None:
    audits = graded(0.9, 60, 0) + graded(0.7, 40, 2) + graded(0.5, 10, 30)
    forward = choose_threshold(audits, target_precision=0.85, configured=0.6)
    backward = choose_threshold(audits[::-1], target_precision=0.85, configured=0.6)
    assert forward == backward
