"""Estimates from audits: hand-computed values, and the interval's coverage in simulation."""

from __future__ import annotations

import numpy as np
import pytest

from proxy.ledger.audits.audit_record import AuditRecord
from proxy.ledger.audits.estimate import estimate, estimates, weighted_share, wilson


def a(accepted: bool, verdict: bool | None, weight: float = 1.0, **more: str) -> AuditRecord:
    return AuditRecord(accepted=accepted, verdict=verdict, weight=weight, **more)  # type: ignore[arg-type]


def test_wilson_by_hand() -> None:
    # 8 of 10: centre (0.8 + z²/20) / (1 + z²/10), half z/(1 + z²/10) · sqrt(0.016 + z²/400)
    assert wilson(0.8, 10) == pytest.approx((0.49016, 0.94332), abs=1e-4)
    # 0 of 10: the upper end is z²/n / (1 + z²/n) = 0.2775
    low, high = wilson(0.0, 10)
    assert low == pytest.approx(0.0, abs=1e-12) and high == pytest.approx(0.27753, abs=1e-4)
    assert wilson(1.0, 10) == pytest.approx((0.72247, 1.0), abs=1e-4)
    assert wilson(0.5, 0) == (0.0, 1.0)


def test_equal_weights_give_the_textbook_interval() -> None:
    share = weighted_share([(50.0, True)] * 8 + [(50.0, False)] * 2)
    assert share.value == pytest.approx(0.8)
    assert share.n == 10 and share.n_eff == pytest.approx(10.0)
    assert share.interval == pytest.approx(wilson(0.8, 10))


def test_uneven_weights_use_kish_effective_size() -> None:
    # weights 1, 1, 1, 1 (right) and 4 (wrong): p = 4/8, n_eff = 8² / (4 + 16) = 3.2
    share = weighted_share([(1.0, True)] * 4 + [(4.0, False)])
    assert share.value == pytest.approx(0.5)
    assert share.n_eff == pytest.approx(3.2)
    # centre 0.5; half = z/(1 + z²/3.2) · sqrt(0.25/3.2 + z²/(4 · 3.2²)) = 0.36931
    assert share.interval == pytest.approx((0.13069, 0.86931), abs=1e-4)


def test_nothing_to_count_is_no_value_and_the_whole_interval() -> None:
    share = weighted_share([])
    assert share.value is None and share.interval == (0.0, 1.0) and share.n == 0


def test_the_three_shares_and_failed_audits() -> None:
    audits = (
        [a(True, True)] * 3
        + [a(True, False), a(True, None)]
        + [a(False, True)]
        + [a(False, False)] * 3
    )
    e = estimate(audits)
    assert (e.audits, e.failed) == (9, 1)
    assert e.precision.value == pytest.approx(3 / 4) and e.precision.n == 4
    assert e.acceptance.value == pytest.approx(5 / 9) and e.acceptance.n == 9
    assert e.rejected_but_correct.value == pytest.approx(1 / 4)


def test_a_failed_audit_is_never_counted_correct() -> None:
    e = estimate([a(True, False)] + [a(True, None)] * 20)
    assert e.precision.value == 0.0 and e.precision.n == 1 and e.failed == 20


def test_weights_undo_a_change_of_rate() -> None:
    # 10 right answers drawn at rate 0.5 stand for 20; 2 wrong ones at rate 0.1 stand for 20.
    e = estimate([a(True, True, 2.0)] * 10 + [a(True, False, 10.0)] * 2)
    assert e.precision.value == pytest.approx(0.5)


def test_by_kind_and_by_model() -> None:
    audits = [
        a(True, True, task_kind="math", requested_model="gpt-4o-mini"),
        a(True, False, task_kind="math", requested_model="gpt-4o"),
        a(False, True, task_kind="json", requested_model="gpt-4o"),
        a(True, True, task_kind="", requested_model="gpt-4o"),
    ]
    e = estimates(audits)
    assert e.overall.audits == 4
    assert list(e.by_kind) == ["json", "math", "other"]
    assert e.by_kind["math"].precision.value == pytest.approx(0.5)
    assert e.by_kind["json"].rejected_but_correct.value == 1.0
    assert e.by_kind["json"].precision.value is None
    assert list(e.by_model) == ["gpt-4o", "gpt-4o-mini"]
    assert e.by_model["gpt-4o"].precision.value == pytest.approx(0.5)
    assert e.by_model["gpt-4o-mini"].acceptance.value == 1.0


def test_the_interval_covers_the_true_precision_about_95_percent_of_the_time() -> None:
    """A month of traffic in two halves: the rate is cut from 0.05 to 0.02 halfway, and the
    local model gets worse (precision 0.9, then 0.7). The weighted estimate's 95% interval
    must cover the true precision of the month's accepted answers in about 95% of months."""
    rng = np.random.default_rng(17)
    halves = [  # attempts, rate, acceptance, precision
        (4000, 0.05, 0.5, 0.9),
        (4000, 0.02, 0.5, 0.7),
    ]
    accepted_total = sum(n * acc for n, _, acc, _ in halves)
    truth = sum(n * acc * p for n, _, acc, p in halves) / accepted_total
    runs, covered = 2000, 0
    for _ in range(runs):
        audits: list[AuditRecord] = []
        for n, rate, acceptance, precision in halves:
            drawn = int(rng.binomial(n, rate))
            accepted = rng.random(drawn) < acceptance
            correct = rng.random(drawn) < precision
            audits += [
                a(bool(acc), bool(ok), 1.0 / rate)
                for acc, ok in zip(accepted, correct, strict=True)
            ]
        share = estimate(audits).precision
        covered += share.low <= truth <= share.high
    coverage = covered / runs
    assert 0.92 <= coverage <= 0.98, coverage
