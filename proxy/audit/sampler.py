"""Which local attempts are audited, and the two limits that keep audits cheap and harmless.

Every local attempt that produced an answer is offered to :meth:`Sampler.offer`, accepted or
rejected alike: a sample of accepted answers only would say nothing about the answers the gate
turned away, and the estimates must be unbiased. Each attempt is drawn with probability ``rate``;
a drawn one carries the sampling weight ``1 / rate`` (how many attempts it stands for), stored
with the audit so that estimates stay unbiased when the rate changes during a month.

Two limits can skip a drawn attempt; both are counted and shown by :meth:`Sampler.health`:

* the queue: at most ``max_pending`` audits are in flight; a full queue skips the audit at once,
  so an audit never waits for a slot and never slows a client;
* the budget: once the month's audit spend (integer pico-dollars) reaches
  ``monthly_budget_usd``, audits stop until the next UTC month. That is logged once per month.

An audit runs in the background through :meth:`Sampler.submit`: the job is an ``async`` function
that returns what the audit cost (shadow call plus judge), which is added to the month's spend.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import structlog

from proxy.config.audit_settings import PICO_PER_USD, AuditSettings

log = structlog.get_logger(__name__)

SKIP_REASONS = ("not_sampled", "off", "budget_spent", "queue_full")


def month_of(ts: float) -> str:
    """The UTC month ``YYYY-MM`` of a unix time: the period a budget covers."""
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m")


@dataclass(frozen=True, kw_only=True)
class Ticket:
    """A drawn audit holding one queue slot until :meth:`Sampler.finish` (or the end of the job
    given to :meth:`Sampler.submit`) gives it back."""

    accepted: bool
    weight: float  # 1 / rate at the time of the draw
    month: str  # the UTC month whose budget pays for it


class Sampler:
    """The draw, the pending queue and the monthly budget of audits; one per app.

    ``spent_pusd`` is the current month's audit spend already in the ledger (read at start, so
    a restart does not reset the budget). ``rng`` and ``clock`` are there for tests.
    """

    def __init__(
        self,
        settings: AuditSettings,
        *,
        spent_pusd: int = 0,
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self._rng = rng or random.Random()
        self._clock = clock
        self._month = month_of(clock())
        self._spent_pusd = spent_pusd
        self._stop_logged = False
        self._pending = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self.offered = 0
        self.audited = 0
        self.skipped: dict[str, int] = dict.fromkeys(SKIP_REASONS, 0)

    # -- the draw ---------------------------------------------------------------------------

    def offer(self, *, accepted: bool) -> Ticket | None:
        """Decide whether this local attempt is audited. None: it is not (the reason is
        counted in ``skipped``). A ticket holds a queue slot: run the audit with
        :meth:`submit`, or give the slot back with :meth:`finish`."""
        self._roll_month()
        self.offered += 1
        reason = self._skip_reason()
        if reason is not None:
            self.skipped[reason] += 1
            return None
        self._pending += 1
        self.audited += 1
        return Ticket(accepted=accepted, weight=1.0 / self.settings.rate, month=self._month)

    def _skip_reason(self) -> str | None:
        if not self.settings.enabled:
            return "off"
        if self._rng.random() >= self.settings.rate:
            return "not_sampled"
        if self.budget_spent:
            self._log_stop()
            return "budget_spent"
        if self._pending >= self.settings.max_pending:
            return "queue_full"
        return None

    def finish(self, ticket: Ticket, cost_pusd: int) -> None:
        """The audit of ``ticket`` is over (whatever its verdict) and cost ``cost_pusd``."""
        if cost_pusd < 0:
            raise ValueError("an audit cannot cost less than nothing")
        self._pending = max(0, self._pending - 1)
        self._roll_month()
        if ticket.month == self._month:
            self._spent_pusd += cost_pusd
            if self.budget_spent:
                self._log_stop()

    # -- background jobs --------------------------------------------------------------------

    def submit(self, ticket: Ticket, job: Callable[[], Awaitable[int]]) -> asyncio.Task[None]:
        """Run ``job`` (which returns the audit's cost in pico-dollars) in the background; its
        slot and its cost are given back when it ends. A job that raises is logged by its
        exception's type only (never its text, which may quote a prompt) and costs 0 here: a
        job must return what it paid even when the audit failed."""

        async def run() -> None:
            cost = 0
            try:
                cost = await job()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 (an audit never takes anything down)
                log.warning("audit_failed", error=type(exc).__name__)
            finally:
                self.finish(ticket, max(0, int(cost)))

        task = asyncio.get_running_loop().create_task(run())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def drain(self, timeout_s: float = 10.0) -> int:
        """Wait up to ``timeout_s`` for the audits in flight (at shutdown), then cancel the
        rest; returns how many were cancelled."""
        tasks = list(self._tasks)
        if not tasks:
            return 0
        _, late = await asyncio.wait(tasks, timeout=timeout_s)
        for task in late:
            task.cancel()
        if late:
            await asyncio.gather(*late, return_exceptions=True)
        return len(late)

    # -- the budget -------------------------------------------------------------------------

    @property
    def spent_pusd(self) -> int:
        self._roll_month()
        return self._spent_pusd

    @property
    def pending(self) -> int:
        return self._pending

    @property
    def budget_spent(self) -> bool:
        self._roll_month()
        return self._spent_pusd >= self.settings.monthly_budget_pusd

    def _roll_month(self) -> None:
        month = month_of(self._clock())
        if month != self._month:
            self._month, self._spent_pusd, self._stop_logged = month, 0, False

    def _log_stop(self) -> None:
        if not self._stop_logged:
            self._stop_logged = True
            log.warning(
                "audit_budget_spent",
                month=self._month,
                spent_usd=self._spent_pusd / PICO_PER_USD,
                budget_usd=self.settings.monthly_budget_usd,
            )

    def health(self) -> dict[str, Any]:
        """What ``/healthz`` shows of audits."""
        self._roll_month()
        if not self.settings.enabled:
            state = "off"
        elif self.budget_spent:
            state = "budget_spent"
        else:
            state = "on"
        return {
            "state": state,
            "rate": self.settings.rate,
            "month": self._month,
            "spent_usd": self._spent_pusd / PICO_PER_USD,
            "budget_usd": self.settings.monthly_budget_usd,
            "pending": self._pending,
            "max_pending": self.settings.max_pending,
            "offered": self.offered,
            "audited": self.audited,
            "skipped": dict(self.skipped),
        }
