"""Deferred work fills the engine and yields to interactive requests (issue 41).

Three levels, each with the real thing beneath it:

- :class:`PrioritySlots` alone (asyncio, no model): interactive jobs take places over deferred
  ones, a waiting deferred job never goes before a waiting interactive one, each class is served
  in turn by share, and deferred jobs take the places once interactive traffic stops.
- :class:`BatchEngine` with the real SmolLM2, in-process: an interactive request that finds
  every sequence id taken by deferred ones parks one, runs while they are paused (they gain no
  token), and the deferred answers, resumed, are token for token the answers they give without
  the interruption.
- :class:`LocalEngine` through the real worker process: an interactive job submitted while the
  places are full of deferred jobs finishes before any of them; deferred jobs finish once it is
  done; deferred jobs waiting never fill ``[local] max_queue``, and have a bound of their own.

Order and counts are asserted, never times.
"""

from __future__ import annotations

import asyncio
import copy
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from proxy.config import LocalSettings
from proxy.engine.batch.decode import BatchEngine
from proxy.engine.batch.sequence import Sequence
from proxy.engine.generate import LocalModel
from proxy.engine.local_engine import LocalEngine
from proxy.engine.priority import DEFERRED, INTERACTIVE, PrioritySlots
from proxy.errors import EngineBusy

STORIES = [
    "Write a long story about a lighthouse keeper and a storm.",
    "Explain in detail how bread is made, step by step.",
    "Describe a walk through a busy market in the morning.",
]


def _request(prompt: str, max_tokens: int) -> dict[str, Any]:
    return {
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
    }


# -- the places, by class ------------------------------------------------------------------------


async def _settle() -> None:
    """Let every woken task run (a granted place takes a few turns of the loop to arrive)."""
    for _ in range(10):
        await asyncio.sleep(0)


async def _take(
    slots: PrioritySlots, share: str, priority: str, order: list[str], name: str
) -> None:
    assert await slots.acquire(share, 60.0, priority)
    order.append(name)


async def test_an_interactive_job_takes_a_place_over_deferred_ones_and_waits_first() -> None:
    slots = PrioritySlots(2)
    order: list[str] = []
    for name in ("d1", "d2"):
        await _take(slots, "a", DEFERRED, order, name)
    waiting = [asyncio.create_task(_take(slots, "a", DEFERRED, order, "d3"))]
    await _settle()
    assert order == ["d1", "d2"] and slots.waiting(DEFERRED) == 1
    # Both places are deferred: interactive jobs take places anyway, up to parallel of them.
    await _take(slots, "b", INTERACTIVE, order, "i1")
    await _take(slots, "b", INTERACTIVE, order, "i2")
    waiting.append(asyncio.create_task(_take(slots, "b", INTERACTIVE, order, "i3")))
    await _settle()
    assert order == ["d1", "d2", "i1", "i2"]
    slots.release(DEFERRED)  # d1 ends: still no room for d3, and i3 waits for an interactive
    await _settle()
    assert order == ["d1", "d2", "i1", "i2"]
    slots.release(INTERACTIVE)  # i1 ends: i3, never d3, which came first
    await _settle()
    assert order == ["d1", "d2", "i1", "i2", "i3"]
    for _ in range(2):
        slots.release(INTERACTIVE)
    await _settle()
    # Interactive traffic stopped: d2 holds one place, d3 takes the other.
    assert order == ["d1", "d2", "i1", "i2", "i3", "d3"]
    await asyncio.gather(*waiting)
    assert slots.running == {INTERACTIVE: 0, DEFERRED: 2}


async def test_each_class_is_served_in_turn_by_share() -> None:
    slots = PrioritySlots(1)
    order: list[str] = []
    await _take(slots, "x", INTERACTIVE, order, "first")
    tasks = []
    # Share a queues three deferred and two interactive jobs before share b's one of each.
    for name, share, priority in [
        ("a-d1", "a", DEFERRED),
        ("a-d2", "a", DEFERRED),
        ("a-d3", "a", DEFERRED),
        ("b-d1", "b", DEFERRED),
        ("a-i1", "a", INTERACTIVE),
        ("a-i2", "a", INTERACTIVE),
        ("b-i1", "b", INTERACTIVE),
    ]:
        tasks.append(asyncio.create_task(_take(slots, share, priority, order, name)))
        await _settle()
    for _ in range(7):
        last = order[-1]
        slots.release(DEFERRED if "-d" in last else INTERACTIVE)
        await _settle()
    await asyncio.gather(*tasks)
    assert order == ["first", "a-i1", "b-i1", "a-i2", "a-d1", "b-d1", "a-d2", "a-d3"]


async def test_a_deferred_job_the_worker_cannot_pause_holds_its_place() -> None:
    slots = PrioritySlots(1)
    order: list[str] = []
    assert await slots.acquire("a", 60.0, DEFERRED, pausable=False)
    waiting = asyncio.create_task(_take(slots, "b", INTERACTIVE, order, "i1"))
    await _settle()
    assert order == [] and slots.waiting(INTERACTIVE) == 1
    slots.release(DEFERRED, pausable=False)
    await waiting
    assert order == ["i1"]


async def test_a_deferred_job_that_gives_up_waiting_leaves_no_place_taken() -> None:
    slots = PrioritySlots(1)
    assert await slots.acquire("a", 60.0, INTERACTIVE)
    assert not await slots.acquire("a", 0.01, DEFERRED)
    slots.release(INTERACTIVE)
    assert slots.running == {INTERACTIVE: 0, DEFERRED: 0}
    assert await slots.acquire("a", 0.01, DEFERRED)


# -- the batch: pause, park, resume ---------------------------------------------------------------


def _alone(engine: BatchEngine, request: dict[str, Any], *, deferred: bool = False) -> Sequence:
    """``request`` run to its end with ``engine`` to itself, from an empty cache (emptied again
    after): the answer it gives without any interruption."""
    engine.forget()
    seq = engine.add(dict(request), deferred=deferred)
    assert seq is not None
    engine.run_all()
    engine.forget()
    return seq


def test_an_interactive_sequence_parks_a_paused_deferred_one_and_changes_no_answer(
    model: LocalModel,
) -> None:
    engine = BatchEngine(model, 2)
    try:
        deferred = [_request(p, 48) for p in STORIES[:2]]
        alone = [_alone(engine, request, deferred=True).text for request in deferred]
        seqs = [engine.add(r, deferred=True) for r in deferred]
        assert all(s is not None for s in seqs)
        while any(len(s.generated) < 8 for s in seqs if s is not None):
            engine.step()
        before = [len(s.generated) for s in seqs if s is not None]
        # Every id is taken by a deferred sequence: a new deferred one must wait ...
        assert engine.add(_request(STORIES[2], 8), deferred=True) is None
        # ... an interactive one parks the deferred sequence with the fewest cells.
        urgent = engine.add(_request("Name three colours.", 16))
        assert urgent is not None
        assert len(engine.parked) == 1 and engine.stats.parked == 1
        while not urgent.done:
            engine.step()
        # While it ran, the deferred sequences were paused: not one token more.
        assert [len(s.generated) for s in seqs if s is not None] == before
        assert not any(s.done for s in seqs if s is not None)
        engine.run_all()
        assert engine.stats.resumed == 1 and not engine.parked
        assert [s.text for s in seqs if s is not None] == alone
    finally:
        engine.close()


def test_a_parked_sequence_past_its_deadline_ends_without_resuming(model: LocalModel) -> None:
    engine = BatchEngine(model, 1)
    try:
        stop: dict[str, str | None] = {"why": None}
        seq = engine.add(_request(STORIES[0], 64), deferred=True, should_stop=lambda: stop["why"])
        assert seq is not None
        while len(seq.generated) < 4:
            engine.step()
        urgent = engine.add(_request("Name three colours.", 24))
        assert urgent is not None and engine.parked == [seq]
        engine.step()
        stop["why"] = "deadline"
        finished = engine.step()
        assert seq in finished and seq.stop_cause == "deadline" and not engine.parked
        engine.run_all()
        assert urgent.done and engine.stats.resumed == 0 and not engine.busy
        assert engine.fits()
    finally:
        engine.close()


# -- through the worker process -------------------------------------------------------------------


@pytest.fixture
async def engine() -> AsyncIterator[LocalEngine]:
    settings = LocalSettings(
        n_threads=1, n_ctx=1024, parallel=2, timeout_s=60.0, max_queue=1, max_deferred_queue=2
    )
    started = LocalEngine(settings, relevance=False)
    await started.start()
    yield started
    await started.stop()


async def _until(check: Any) -> None:
    for _ in range(1500):
        if check():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("the engine never got there")


async def test_an_interactive_job_finishes_before_the_deferred_jobs_that_fill_the_engine(
    engine: LocalEngine,
) -> None:
    deadline = time.monotonic() + 600
    done: list[str] = []

    async def run(name: str, request: dict[str, Any], priority: str) -> dict[str, Any]:
        answer = await engine.chat(request, deadline=deadline, priority=priority)
        done.append(name)
        return answer

    # Two deferred jobs fill both places, and two more wait in their own queue (its bound).
    batch = [
        asyncio.create_task(run(f"d{i}", _request(STORIES[i % 3], 160), DEFERRED)) for i in range(4)
    ]
    await _until(lambda: engine.worker.progress and engine.deferred_depth == 2)
    with pytest.raises(EngineBusy, match="deferred queue is full"):
        await engine.chat(_request("Hi", 4), deadline=deadline, priority=DEFERRED)
    # Both places hold deferred jobs: two interactive jobs start at once (parking both), and
    # a third waits in the interactive queue (max_queue = 1), which the two deferred jobs
    # waiting did not fill; a fourth finds that queue full.
    interactive = [
        asyncio.create_task(run(f"i{i}", _request(prompt, 12), INTERACTIVE))
        for i, prompt in enumerate(["Name three colours.", "What is bread made of?"])
    ]
    await _until(lambda: len(engine.worker.jobs) == 4)
    interactive.append(asyncio.create_task(run("i2", _request("Say hello.", 12), INTERACTIVE)))
    await _until(lambda: engine.queue_depth == 1)
    with pytest.raises(EngineBusy, match="local queue is full"):
        await engine.chat(_request("Hi", 4), deadline=deadline)
    await asyncio.gather(*interactive)
    assert sorted(done) == ["i0", "i1", "i2"], "an interactive job waited for a deferred one"
    answers = await asyncio.gather(*batch)
    assert sorted(done[3:]) == ["d0", "d1", "d2", "d3"]
    assert all(a["choices"][0]["message"]["content"] for a in answers)
    health = engine.health()
    assert health["batch"]["deferred"]["parked"] >= 2
    assert health["deferred"] == {"queue_depth": 0, "max_queue": 2, "running": 0}
    assert engine.stats.crashes == 0


def test_short_deferred_prompts_are_prefilled_before_the_batch_decodes_on(
    model: LocalModel,
) -> None:
    # A batch of short lines (issue 41): each line that joins as another ends is prefilled at
    # once, so every decode step serves the whole batch. With the interactive time share
    # (prompts wait for four times their prefill in decode steps) the prompts queued up behind
    # one or two answers, and the batch decoded about one row a step.
    lines = [
        f'Which city is mentioned? Answer with the city only: "We meet {name} in {city}."'
        for name, city in [
            ("Maria", "Lisbon"),
            ("James", "Osaka"),
            ("Aiko", "Denver"),
            ("Omar", "Nairobi"),
            ("Lena", "Hamburg"),
            ("Carlos", "Toronto"),
            ("Priya", "Lyon"),
            ("Tom", "Perth"),
        ]
    ]
    engine = BatchEngine(model, 4)
    try:
        queue = [_request(text, 12) for text in lines]
        seqs = []
        behind = 0  # decode steps taken while a line's prompt waited
        while queue or engine.busy:
            while queue and (seq := engine.add(queue[0], deferred=True)) is not None:
                queue.pop(0)
                seqs.append(seq)
            decode_steps = engine.stats.decode_steps
            waiting = any(q.prefilling and q.leader is None for q in engine.active)
            engine.step()
            if waiting and engine.stats.decode_steps > decode_steps:
                behind += 1
        assert len(seqs) == 8 and all(s.done and s.generated for s in seqs)
        stats = engine.stats
        print(f"decode steps {stats.decode_steps}, rows {stats.decode_rows}, behind {behind}")
        assert behind == 0
        # 8 answers of 12 tokens at most, four at a time: at most 2 x 12 full decode steps
        # and one partial step for each line that ended early.
        assert stats.decode_steps <= 2 * 12 + 8
    finally:
        engine.close()


def test_the_worker_scores_waiting_interactive_answers_before_deferred_ones(
    model: LocalModel,
) -> None:
    # Batched answers are scored on a thread of the worker, not in the loop that steps the
    # batch; an interactive answer goes before the batch lines' answers waiting to be scored.
    from proxy.engine.worker import _Scorer

    entered, release = threading.Event(), threading.Event()
    sent: list[tuple[str, int, Any]] = []

    class Pipe:  # the pipe's end: holds the first answer until the others are queued
        def send(self, message: tuple[Any, ...]) -> None:
            entered.set()
            assert release.wait(60)
            sent.append((message[0], message[1], message[2]))

    request = _request("What is the capital of France?", 12)
    answer = model.chat(dict(request))
    scorer = _Scorer(Pipe())  # type: ignore[arg-type]
    scorer.submit(1, request, copy.deepcopy(answer), deferred=True)
    assert entered.wait(60)  # the first deferred answer is being sent
    scorer.submit(2, request, copy.deepcopy(answer), deferred=True)
    scorer.submit(3, request, copy.deepcopy(answer), deferred=True)
    scorer.submit(4, request, copy.deepcopy(answer), deferred=False)
    release.set()
    scorer.close()
    assert [job for kind, job, _ in sent if kind == "done"] == [1, 4, 2, 3]
    assert all("value" in completion["frugal"]["quality"] for _, _, completion in sent)


def test_an_interactive_prompt_keeps_the_opening_the_parked_sequences_id_holds(
    model: LocalModel,
) -> None:
    # Parking copies a deferred sequence's cells out but leaves them held in its id, so the
    # interactive prompt that takes the id keeps the chat template's opening it shares with
    # them, as it would on an idle engine, instead of prefilling it again (issue 41).
    urgent_request = _request("Name three colours.", 8)
    engine = BatchEngine(model, 2)
    try:
        alone = _alone(engine, urgent_request)
        seqs = [engine.add(_request(p, 32), deferred=True) for p in STORIES[:2]]
        assert all(s is not None for s in seqs)
        while any(len(s.generated) < 4 for s in seqs if s is not None):
            engine.step()
        urgent = engine.add(dict(urgent_request))
        assert urgent is not None and engine.stats.parked == 1
        engine.run_all()
        answer = engine.completion(urgent)
        print("cached", answer["frugal"]["cached_tokens"])
        assert answer["frugal"]["cached_tokens"] >= 20
        assert urgent.generated == alone.generated
        assert engine.stats.resumed == 1 and all(s is not None and s.done for s in seqs)
    finally:
        engine.close()


def test_a_deferred_prompt_is_prefilled_in_short_steps_and_answers_as_alone(
    model: LocalModel,
) -> None:
    # An interactive request that arrives waits for the step under way: a deferred prompt
    # goes in steps of 16 rows at most, and its answer is the one it gets in one step.
    request = _request(
        'Which city is mentioned? Answer with the city only: "We meet Omar in Lyon."', 12
    )
    engine = BatchEngine(model, 2)
    try:
        alone = _alone(engine, request)
        before = engine.stats.steps - engine.stats.decode_steps
        seq = engine.add(dict(request), deferred=True)
        assert seq is not None
        engine.run_all()
        prefill_steps = engine.stats.steps - engine.stats.decode_steps - before
        n = len(seq.prompt) - 1
        assert prefill_steps == -(-n // 16) and prefill_steps > 1
        assert seq.generated == alone.generated
    finally:
        engine.close()
