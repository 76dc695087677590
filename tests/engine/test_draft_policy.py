"""The draft-length policy and the step costs it reads (proxy.engine.draft_policy): no model."""

from __future__ import annotations

import pytest

from proxy.engine.draft_policy import DraftPolicy, Priors, StepCosts, VerifyCost


def test_the_policy_drafts_long_when_drafts_are_accepted_and_stops_when_they_fail() -> None:
    cost = VerifyCost(fixed=0.012, per_row=0.010)  # measured shape on SmolLM2, one thread
    good = DraftPolicy(max_draft=8, cost=cost, prior=0.97)
    assert good.choose(room=100) >= 4
    bad = DraftPolicy(max_draft=8, cost=cost, prior=0.6)
    for _ in range(10):
        bad.update(drafted=4, accepted=0)
    choices = [bad.choose(room=100) for _ in range(32)]
    assert choices == [0] * 32  # even the optimistic estimate says no draft pays
    assert good.choose(room=1) == 1  # never drafts past what the caller will take


def test_an_uncertain_policy_explores_short_drafts_until_they_fail() -> None:
    cost = VerifyCost(fixed=0.010, per_row=0.009)  # a verify row costs 47% of a plain step
    policy = DraftPolicy(max_draft=8, cost=cost, prior=0.35)
    assert policy.gain(1) < policy.min_gain  # the prior alone would not draft
    first = policy.choose(room=100)
    assert 1 <= first <= policy.explore_max
    tried = 0
    while policy.choose(room=100) and tried < 50:
        policy.update(drafted=1, accepted=0)
        tried += 1
    assert 0 < tried < 50
    assert [policy.choose(room=100) for _ in range(20)] == [0] * 20


def test_step_costs_learn_from_measured_steps_and_stay_optimistic_where_unmeasured() -> None:
    costs = StepCosts(9, prior=VerifyCost(fixed=0.005, per_row=0.015))
    assert costs(1) == pytest.approx(0.020)  # the calibration seeds the one-row cost only
    for _ in range(5):
        costs.observe(1, 0.016)
        costs.observe(3, 0.019)
    assert costs(1) == pytest.approx(0.016, rel=0.05)
    assert costs(3) == pytest.approx(0.019, rel=0.05)
    assert costs(2) <= costs(3)  # never above a measured larger batch
    assert costs(3) < costs(5) < costs(9)  # unmeasured: extrapolated from the largest below
    costs.observe(3, 1.0)  # a step the machine preempted moves the average a bounded amount
    assert costs(3) < 0.019 * 1.2
    policy = DraftPolicy(max_draft=8, cost=costs, prior=0.7)
    assert policy.choose(room=100) >= 2  # three rows for little more than one: draft
    assert set(costs.as_dict()) == {"1", "3"}


def test_priors_fall_where_drafts_fail_and_a_policy_at_the_floor_tries_one_draft() -> None:
    cost = VerifyCost(fixed=0.010, per_row=0.0085)  # a verify row costs 46% of a plain step
    priors = Priors({1: 0.4}, default=0.65, floor=0.4)
    tried = []
    for _ in range(6):  # free chat: every draft fails
        policy = DraftPolicy(max_draft=8, cost=cost, prior=priors[3], min_gain=1.1)
        n = 0
        while policy.choose(room=100) and n < 50:
            policy.update(drafted=1, accepted=0)
            n += 1
        tried.append(n)
        priors.learn({3: policy})
    assert priors[3] == pytest.approx(0.4)  # fell to the floor, no further
    assert tried[0] > tried[-1] == 1  # at the floor: one draft per request, then no more
    copying = DraftPolicy(max_draft=8, cost=cost, prior=priors[3], min_gain=1.1)
    for _ in range(8):  # then copy-heavy work: its first draft is tried and accepted
        k = copying.choose(room=100)
        assert k >= 1
        copying.update(drafted=k, accepted=k)
    priors.learn({3: copying, 2: DraftPolicy(max_draft=8, cost=cost)})
    assert priors[3] > 0.8  # the next request starts from what copying yielded
    assert priors[2] == 0.65  # a kind that drafted nothing keeps its prior


def test_in_a_batch_a_draft_must_pay_for_the_other_sequences_rows_too() -> None:
    cost = VerifyCost(fixed=0.010, per_row=0.0085)
    in_batch = lambda rows: cost(3 + rows)  # noqa: E731 - three other sequences in the step
    alone = DraftPolicy(max_draft=8, cost=in_batch, prior=0.5, min_gain=1.1)
    assert alone.choose(room=100) >= 1  # this sequence alone would gain from the draft
    shared = DraftPolicy(max_draft=8, cost=in_batch, prior=0.5, min_gain=1.1, others=3)
    assert shared.choose(room=100) == 0  # but the step's four answers would lose more
