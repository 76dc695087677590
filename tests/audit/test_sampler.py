"""The sampler: the draw at `rate`, the bounded queue, the monthly budget, background jobs."""

from __future__ import annotations

import asyncio
import random
from datetime import UTC, datetime

import pytest
from structlog.testing import capture_logs

from proxy.audit.sampler import Sampler, month_of
from proxy.config.audit_settings import AuditSettings

MAY = datetime(2025, 5, 31, 23, 59, tzinfo=UTC).timestamp()
JUNE = datetime(2025, 6, 1, 0, 1, tzinfo=UTC).timestamp()


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def sampler(clock: Clock | None = None, spent_pusd: int = 0, **settings: object) -> Sampler:
    return Sampler(
        AuditSettings(**settings),  # type: ignore[arg-type]
        spent_pusd=spent_pusd,
        rng=random.Random(17),
        clock=clock or Clock(MAY),
    )


def test_month_of_is_the_utc_month() -> None:
    assert (month_of(MAY), month_of(JUNE)) == ("2025-05", "2025-06")


def test_rate_one_audits_everything_with_weight_one() -> None:
    s = sampler(rate=1.0)
    tickets = [s.offer(accepted=i % 2 == 0) for i in range(10)]
    assert all(t is not None and t.weight == 1.0 for t in tickets)
    assert s.audited == s.pending == 10


def test_accepted_and_rejected_answers_are_drawn_at_the_same_rate() -> None:
    s = sampler(rate=0.25, max_pending=10_000)
    drawn = {True: 0, False: 0}
    for i in range(8000):
        accepted = i % 2 == 0
        ticket = s.offer(accepted=accepted)
        if ticket is not None:
            assert ticket.weight == 4.0 and ticket.accepted is accepted
            drawn[accepted] += 1
    assert 0.22 < drawn[True] / 4000 < 0.28
    assert 0.22 < drawn[False] / 4000 < 0.28
    assert s.skipped["not_sampled"] == 8000 - drawn[True] - drawn[False]


def test_rate_zero_is_off() -> None:
    s = sampler(rate=0.0)
    assert s.offer(accepted=True) is None
    assert s.skipped["off"] == 1
    assert s.health()["state"] == "off"


def test_a_full_queue_skips_and_counts_until_a_slot_is_free() -> None:
    s = sampler(rate=1.0, max_pending=2)
    first, second = s.offer(accepted=True), s.offer(accepted=False)
    assert first is not None and second is not None
    assert s.offer(accepted=True) is None
    assert s.skipped["queue_full"] == 1
    s.finish(first, 0)
    assert s.pending == 1
    assert s.offer(accepted=True) is not None
    assert s.health()["pending"] == 2


def test_spend_reaching_the_budget_stops_audits_logged_once() -> None:
    s = sampler(rate=1.0, monthly_budget_usd=100e-12)  # 100 pico-dollars
    ticket = s.offer(accepted=True)
    assert ticket is not None
    s.finish(ticket, 60)
    assert not s.budget_spent and s.spent_pusd == 60
    more = s.offer(accepted=False)
    assert more is not None
    with capture_logs() as logs:
        s.finish(more, 40)
        assert s.offer(accepted=True) is None
        assert s.offer(accepted=False) is None
    assert s.budget_spent and s.skipped["budget_spent"] == 2
    assert [e["event"] for e in logs] == ["audit_budget_spent"]
    health = s.health()
    assert health["state"] == "budget_spent"
    assert health["spent_usd"] == pytest.approx(100e-12)


def test_a_new_month_has_a_new_budget() -> None:
    clock = Clock(MAY)
    s = sampler(clock, spent_pusd=5 * 10**12, rate=1.0)  # May's budget spent before a restart
    with capture_logs() as logs:
        assert s.offer(accepted=True) is None
    assert len(logs) == 1
    clock.now = JUNE
    ticket = s.offer(accepted=True)
    assert ticket is not None and ticket.month == "2025-06"
    assert s.spent_pusd == 0 and s.health()["state"] == "on"


def test_a_job_that_ends_after_the_month_does_not_charge_the_new_one() -> None:
    clock = Clock(MAY)
    s = sampler(clock, rate=1.0)
    ticket = s.offer(accepted=True)
    assert ticket is not None
    clock.now = JUNE
    s.finish(ticket, 10**12)
    assert s.spent_pusd == 0 and s.pending == 0


async def test_submit_returns_before_the_job_runs_and_gives_back_slot_and_cost() -> None:
    s = sampler(rate=1.0, max_pending=1)
    release = asyncio.Event()

    async def job() -> int:
        await release.wait()
        return 1234

    ticket = s.offer(accepted=True)
    assert ticket is not None
    task = s.submit(ticket, job)
    assert not task.done() and s.pending == 1
    assert s.offer(accepted=True) is None  # the queue is full while it runs
    release.set()
    await asyncio.wait_for(task, 10)
    assert s.pending == 0 and s.spent_pusd == 1234


async def test_a_failing_job_is_logged_without_its_text_and_frees_its_slot() -> None:
    s = sampler(rate=1.0)

    async def job() -> int:
        raise RuntimeError("secret prompt text")

    ticket = s.offer(accepted=True)
    assert ticket is not None
    with capture_logs() as logs:
        await asyncio.wait_for(s.submit(ticket, job), 10)
    assert s.pending == 0
    assert logs == [{"event": "audit_failed", "error": "RuntimeError", "log_level": "warning"}]
    assert "secret" not in repr(logs)


async def test_drain_waits_for_jobs_and_cancels_the_stuck_ones() -> None:
    s = sampler(rate=1.0)
    never = asyncio.Event()

    async def quick() -> int:
        return 5

    async def stuck() -> int:
        await never.wait()
        return 7

    for job in (quick, stuck):
        ticket = s.offer(accepted=True)
        assert ticket is not None
        s.submit(ticket, job)
    assert await s.drain(timeout_s=0.2) == 1
    assert s.pending == 0 and s.spent_pusd == 5
    assert await s.drain() == 0
