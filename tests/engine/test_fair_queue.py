"""The order the engine's waiting jobs take its slots in (``proxy/engine/fair_queue.py``): in turn
by share (client key), one share alone first come first served, and no state kept for shares
that have gone."""

from __future__ import annotations

import asyncio

import pytest

from proxy.engine.fair_queue import KEYLESS, FairQueue, FairSlots, share_label


def drain(queue: FairQueue[str]) -> list[str]:
    return [queue.pop() for _ in range(len(queue))]


def queued(**backlogs: int) -> FairQueue[str]:
    """A queue with each share's backlog pushed, share after share in the order given:
    ``queued(a=2, b=1)`` pushes a0 and a1 for ``a``, then b0 for ``b``."""
    queue: FairQueue[str] = FairQueue()
    for share, count in backlogs.items():
        for i in range(count):
            queue.push(share, f"{share}{i}")
    return queue


def test_one_share_alone_is_first_come_first_served() -> None:
    assert drain(queued(a=5)) == ["a0", "a1", "a2", "a3", "a4"]


def test_a_share_that_arrives_behind_a_backlog_goes_next() -> None:
    queue = queued(a=16)
    served = [queue.pop() for _ in range(4)]  # the engine's four slots
    queue.push("b", "b0")
    assert served == ["a0", "a1", "a2", "a3"]
    assert queue.pop() == "b0"
    assert drain(queue) == [f"a{i}" for i in range(4, 16)]


def test_shares_with_backlogs_take_turns() -> None:
    queue = queued(a=6, b=3)
    queue.push(KEYLESS, "k0")
    assert drain(queue) == ["a0", "b0", "k0", "a1", "b1", "a2", "b2", "a3", "a4", "a5"]


def test_a_share_that_asks_again_after_its_turn_waits_for_the_others() -> None:
    """One job at a time, asked again as soon as it is served, does not jump a backlog."""
    queue = queued(a=4)
    order = []
    for i in range(4):
        queue.push("c", f"c{i}")
        order.append(queue.pop())
        order.append(queue.pop())
    assert order == ["a0", "c0", "a1", "c1", "a2", "c2", "a3", "c3"]


def test_a_job_that_leaves_gives_its_turn_back() -> None:
    queue: FairQueue[str] = FairQueue()
    a = [f"a{i}" for i in range(3)]  # the queue finds an item by identity, as a waiter
    for item in a:
        queue.push("a", item)
    for i in range(3):
        queue.push("b", f"b{i}")
    assert queue.remove("a", a[0]) and queue.remove("a", a[1])
    assert not queue.remove("a", a[0])  # gone already
    assert not queue.remove("z", a[2])  # not that share's
    assert len(queue) == 4
    # a2 moved up to a0's turn: it goes before b0, as a0 would have.
    assert drain(queue) == ["a2", "b0", "b1", "b2"]


def test_no_state_is_kept_for_shares_that_have_gone() -> None:
    queue: FairQueue[str] = FairQueue()
    queue.push("backlog", "x0")
    for i in range(1500):
        queue.push(f"key{i}", f"k{i}")
        queue.push("backlog", f"x{i + 1}")
        queue.pop()
        queue.pop()
    print(f"\nshares kept after 1,500 keys came and went: {queue.shares}")
    assert len(queue) == 1
    assert queue.shares <= 2


def test_ahead_counts_what_a_new_item_of_a_share_would_follow() -> None:
    queue = queued(a=5, b=2)
    assert queue.ahead("c") == {"a": 1, "b": 1}  # a0 and b0 hold turn 0, as c would
    assert queue.ahead("b") == {"a": 3, "b": 2}  # after b1 (turn 1): a0, a1, a2
    assert queue.ahead("a") == {"a": 5, "b": 2}  # behind everything, as first come


def test_jobs_served_at_once_take_their_shares_turns() -> None:
    """Four jobs of one key that found free slots hold turns 0-3: its fifth waits behind a job
    of another key that comes later."""
    queue: FairQueue[str] = FairQueue()
    for _ in range(4):
        queue.take_turn("a")
    for i in range(4, 16):
        queue.push("a", f"a{i}")
    queue.push("b", "b0")
    assert queue.pop() == "b0"
    with pytest.raises(ValueError):
        queue.take_turn("c")  # items wait: a job must queue behind them


def test_pop_from_an_empty_queue_is_an_index_error() -> None:
    with pytest.raises(IndexError):
        FairQueue[str]().pop()


def test_a_share_label_names_a_key_without_saying_it() -> None:
    identity = "env:" + "ab" * 32
    label = share_label(identity)
    assert label == share_label(identity) != share_label("id:7")
    assert len(label) == 16 and identity[4:20] not in label
    assert share_label(None) == KEYLESS == share_label("")


async def test_free_slots_go_to_the_waiting_in_turn() -> None:
    slots = FairSlots(1)
    started: list[str] = []

    async def job(share: str, name: str) -> None:
        assert await slots.acquire(share, timeout=30)
        started.append(name)
        await asyncio.sleep(0)
        slots.release()

    assert await slots.acquire("a", timeout=30)  # the running job: a's turn
    tasks = [asyncio.create_task(job("a", f"a{i}")) for i in range(3)]
    await asyncio.sleep(0)
    tasks.append(asyncio.create_task(job("b", "b0")))
    await asyncio.sleep(0)
    assert slots.waiting == 4
    slots.release()
    await asyncio.gather(*tasks)
    assert started == ["b0", "a0", "a1", "a2"]
    assert slots.free == 1 and slots.waiting == 0


async def test_a_waiter_that_times_out_or_is_cancelled_leaves_the_queue() -> None:
    slots = FairSlots(1)
    assert await slots.acquire("a", timeout=30)
    assert not await slots.acquire("b", timeout=0.01)  # timed out
    cancelled = asyncio.create_task(slots.acquire("c", timeout=30))
    await asyncio.sleep(0)
    assert slots.waiting == 1
    cancelled.cancel()
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    assert slots.waiting == 0
    slots.release()
    assert slots.free == 1


async def test_a_slot_handed_to_a_waiter_that_was_cancelled_is_passed_on() -> None:
    slots = FairSlots(1)
    assert await slots.acquire("a", timeout=30)
    first = asyncio.create_task(slots.acquire("b", timeout=30))
    second = asyncio.create_task(slots.acquire("c", timeout=30))
    await asyncio.sleep(0)
    slots.release()  # the slot goes to first's future ...
    first.cancel()  # ... whose task is cancelled before it runs again
    with pytest.raises(asyncio.CancelledError):
        await first
    assert await second  # handed on, not lost
    slots.release()
    assert slots.free == 1 and slots.waiting == 0
