"""How busy this machine is, measured once per test run, and the waits and bounds built on it.

The suite runs on 2-core machines that are often shared: a second build, other test runs and
their servers beside it. A fixed wait tuned on a quiet machine ("ready within 60 s", "a hundred
answers in 3 s") then fails for no fault of the code. So the suite keeps two rules:

- **Wait on an event, with a generous ceiling.** A wait polls for the thing it needs (a health
  state, a count, a file, a process's exit) and goes on until :data:`CEILING_S` at most. The
  ceiling is reached only when the event never comes (a hung server); a process that exits first
  ends the wait at once. :func:`wait_until` is that loop, and :func:`settle` the same on an
  event loop.
- **Scale the bounds that must stay.** A bound the code promises ("an answer within 1 s",
  "memory grows less than 1 GB") stays in the test, multiplied by :func:`load_factor`: how much
  slower than a quiet machine this one runs now. What a test counts never scales: 100 answers
  stay 100.

:func:`load_factor` times a fixed pure-Python workload a few times on one thread and compares
two figures, keeping the larger: its wall time over the CPU time it was given (the share of a
core it got: 1 on an idle machine, about 4 with 8 busy processes on 2 cores), and its CPU time
over :data:`REFERENCE_CPU_S` (a slower CPU than the project's build machine). The result is
clamped to [1, 8]. ``tests/conftest.py`` measures it once when the session starts, prints it in
the report header and keeps it in ``$FRUGAL_TEST_LOAD_FACTOR``, so that every test, helper and
child process reads the same figure; set that variable yourself to pin it (``=1`` for the
quiet-machine bounds).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

__all__ = [
    "CEILING_S",
    "ENV",
    "REFERENCE_CPU_S",
    "Measured",
    "load_factor",
    "measure",
    "scaled",
    "settle",
    "wait_until",
]

ENV = "FRUGAL_TEST_LOAD_FACTOR"
CEILING_S = 600.0
"""Longest any wait on an event goes on before the test fails: a hang, not a slow machine."""
REFERENCE_CPU_S = 0.055
"""CPU seconds one round of :func:`_workload` took on the project's 2-core build machine."""
LOWEST, HIGHEST = 1.0, 8.0
ROUNDS = 5

T = TypeVar("T")


def _workload() -> int:
    """A fixed amount of pure-Python work: about 55 ms of one core on the build machine."""
    total = 0
    for i in range(1_000_000):
        total = (total * 31 + i) % 1_000_003
    return total


@dataclass(frozen=True)
class Measured:
    """One measurement: wall and CPU seconds of :data:`ROUNDS` rounds, and the factor."""

    wall_s: float
    cpu_s: float
    factor: float

    def describe(self) -> str:
        return (
            f"load factor {self.factor:.2f} ({ROUNDS} rounds of a fixed workload: "
            f"{self.wall_s:.2f} s wall, {self.cpu_s:.2f} s CPU, "
            f"reference {REFERENCE_CPU_S * ROUNDS:.2f} s CPU)"
        )


def measure(rounds: int = ROUNDS) -> Measured:
    """Time :func:`_workload` ``rounds`` times on this thread; the factor, clamped."""
    wall = cpu = 0.0
    for _ in range(rounds):
        started, cpu_started = time.perf_counter(), time.thread_time()
        _workload()
        cpu += time.thread_time() - cpu_started
        wall += time.perf_counter() - started
    cpu = max(cpu, 1e-9)
    contention = wall / cpu
    slowness = cpu / (REFERENCE_CPU_S * rounds)
    factor = min(HIGHEST, max(LOWEST, contention, slowness))
    return Measured(wall_s=wall, cpu_s=cpu, factor=round(factor, 2))


def load_factor() -> float:
    """The run's factor: ``$FRUGAL_TEST_LOAD_FACTOR`` (set when the session started, or by
    hand), else measured now and kept there for the rest of this process and its children."""
    pinned = os.environ.get(ENV)
    if pinned:
        try:
            return min(HIGHEST, max(LOWEST, float(pinned)))
        except ValueError:
            raise ValueError(f"${ENV} must be a number, got {pinned!r}") from None
    factor = measure().factor
    os.environ[ENV] = str(factor)
    return factor


def scaled(bound: float) -> float:
    """A bound the code promises, scaled to this run's load: ``bound`` x :func:`load_factor`."""
    return bound * load_factor()


def wait_until(
    check: Callable[[], T | None],
    what: str,
    *,
    ceiling_s: float = CEILING_S,
    every_s: float = 0.05,
    alive: Callable[[], bool] | None = None,
) -> T:
    """Call ``check()`` every ``every_s`` until it returns something other than None (or
    False), and return that. An AssertionError naming ``what`` if ``ceiling_s`` passes first,
    or at once if ``alive()`` (the process the wait is for) says it has gone."""
    deadline = time.monotonic() + ceiling_s
    while True:
        got = check()
        if got is not None and got is not False:
            return got
        if alive is not None and not alive():
            raise AssertionError(f"gone while waiting for {what}")
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} within {ceiling_s:g} s")
        time.sleep(every_s)


async def settle(
    check: Callable[[], T | None], what: str, *, ceiling_s: float = CEILING_S, every_s: float = 0.02
) -> T:
    """:func:`wait_until` for a test on an event loop: ``check()`` every ``every_s`` (awaiting,
    so the loop runs on) until it returns something other than None (or False)."""
    deadline = time.monotonic() + ceiling_s
    while True:
        got = check()
        if got is not None and got is not False:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} within {ceiling_s:g} s")
        await asyncio.sleep(every_s)
