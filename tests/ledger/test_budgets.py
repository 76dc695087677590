"""Budgets, rpm limits and the response cache in the ledger database
(proxy/ledger/tenants/budgets.py, limits.py, cache.py), on SQLite and on a real PostgreSQL:
reservations are atomic under concurrency, renewed while held, always released (settle or
expiry), and the cache keeps its TTL and size bound."""

from __future__ import annotations

import gc
import threading
from concurrent.futures import ThreadPoolExecutor

from proxy.ledger.db.connections import Pool
from proxy.ledger.response_cache import ResponseCache, cache_key, cacheable
from proxy.ledger.tenants.budgets import Budgets, month_of
from proxy.ledger.tenants.rpm import LocalWindow, RateLimits

NOW = 1_790_000_000.0  # 2026-09-21


def test_a_reservation_holds_the_budget_and_settles_to_the_real_cost(pool: Pool) -> None:
    budgets = Budgets(pool)
    first = budgets.reserve("alice", 100, 60, ttl_s=60, now=NOW)
    assert first is not None
    assert budgets.reserve("alice", 100, 60, ttl_s=60, now=NOW) is None  # 60 + 60 > 100
    budgets.settle(first, 25)
    usage = budgets.usage(month_of(NOW))["alice"]
    assert (usage.spent_pusd, usage.reserved_pusd) == (25, 0)
    second = budgets.reserve("alice", 100, 75, ttl_s=60, now=NOW)  # 25 + 75 = 100: fits
    assert second is not None
    budgets.settle(second, 0)  # failed upstream: released, nothing spent
    budgets.settle(second, 0)  # twice: no double release
    usage = budgets.usage(month_of(NOW))["alice"]
    assert (usage.spent_pusd, usage.reserved_pusd) == (25, 0)


def test_an_expired_reservation_is_released_and_never_blocks_the_key(pool: Pool) -> None:
    budgets = Budgets(pool)
    crashed = budgets.reserve("bob", 100, 90, ttl_s=30, now=NOW)  # its replica never settles
    assert crashed is not None
    assert budgets.reserve("bob", 100, 20, ttl_s=30, now=NOW + 10) is None  # still held
    later = budgets.reserve("bob", 100, 20, ttl_s=30, now=NOW + 31)  # expired: swept, room
    assert later is not None
    budgets.settle(crashed, 7)  # a late settle after the sweep adds its cost once
    budgets.settle(later, 3)
    usage = budgets.usage(month_of(NOW))["bob"]
    assert (usage.spent_pusd, usage.reserved_pusd) == (10, 0)


def test_a_held_reservation_is_renewed_until_settled_and_a_crashed_one_expires(
    pool: Pool,
) -> None:
    replica = Budgets(pool)  # renews what it holds
    crashed = Budgets(pool)  # a replica that died: nobody renews its reservations
    lost = crashed.reserve("fay", 100, 40, ttl_s=30, now=NOW)
    held = replica.reserve("fay", 100, 40, ttl_s=30, now=NOW)
    settled = replica.reserve("fay", 100, 20, ttl_s=30, now=NOW)
    assert lost is not None and held is not None and settled is not None
    replica.settle(settled, 20)
    assert replica.renew(30, now=NOW + 20) == (1, 0)  # one statement; the settled one is gone
    assert replica.renew(30, now=NOW + 40) == (1, 0)  # a call running past its first lease
    assert replica.sweep(now=NOW + 60) == 1  # the crashed replica's, not the running call's
    usage = replica.usage(month_of(NOW))["fay"]
    assert (usage.spent_pusd, usage.reserved_pusd) == (20, 40)
    assert replica.reserve("fay", 100, 41, ttl_s=30, now=NOW + 60) is None  # still held
    replica.settle(held, 35)
    assert replica.renew(30, now=NOW + 65) == (0, 0)  # nothing held any more
    usage = replica.usage(month_of(NOW))["fay"]
    assert (usage.spent_pusd, usage.reserved_pusd) == (55, 0)


def test_a_reservation_swept_while_held_is_reported_lost_once(pool: Pool) -> None:
    budgets = Budgets(pool)
    held = budgets.reserve("gus", 100, 50, ttl_s=30, now=NOW)
    assert held is not None
    assert budgets.sweep(now=NOW + 31) == 1  # the database was out of reach for a whole lease
    assert budgets.renew(30, now=NOW + 32) == (0, 1)
    assert budgets.renew(30, now=NOW + 33) == (0, 0)  # no longer renewed
    budgets.settle(held, 45)  # its cost still counts, once
    usage = budgets.usage(month_of(NOW))["gus"]
    assert (usage.spent_pusd, usage.reserved_pusd) == (45, 0)


def test_a_reservation_dropped_unsettled_stops_being_renewed(pool: Pool) -> None:
    budgets = Budgets(pool)
    assert budgets.reserve("hal", 100, 50, ttl_s=30, now=NOW) is not None  # kept by no one
    gc.collect()
    assert budgets.renew(30, now=NOW + 20) == (0, 0)
    assert budgets.sweep(now=NOW + 31) == 1


def test_concurrent_reservations_never_pass_the_budget(pool: Pool) -> None:
    budgets = Budgets(pool)
    start = threading.Barrier(16)

    def one(_: int) -> bool:
        start.wait()
        return budgets.reserve("carol", 10, 1, ttl_s=60, now=NOW) is not None

    with ThreadPoolExecutor(16) as workers:
        taken = sum(workers.map(one, range(16)))
    assert taken == 10
    assert budgets.usage(month_of(NOW))["carol"].reserved_pusd == 10


def test_rpm_is_a_sliding_minute(pool: Pool) -> None:
    limits = RateLimits(pool)
    assert [limits.admit("dave", 3, now=NOW + t) for t in (0, 10, 20)] == [None, None, None]
    wait = limits.admit("dave", 3, now=NOW + 30)
    assert wait is not None and abs(wait - 30) < 1e-6  # the first leaves the window at +60
    assert limits.admit("erin", 3, now=NOW + 30) is None  # per key
    assert limits.admit("dave", 3, now=NOW + 60.5) is None
    assert limits.sweep(now=NOW + 200) == 5
    window = LocalWindow()
    assert window.admit("dave", 1, now=0) is None and window.admit("dave", 1, now=1) == 59


def test_the_cache_keeps_its_ttl_and_size_bound(pool: Pool) -> None:
    cache = ResponseCache(pool, ttl_s=100, max_entries=2)
    body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}
    assert not cacheable(body) and cacheable({**body, "temperature": 0})
    assert cacheable({**body, "seed": 7, "temperature": 1})
    key = cache_key(body, route_model="gpt-4o-mini", model_hash="abc", scope="alice")
    assert key == cache_key(
        {**body, "stream": True, "user": "u"},
        route_model="gpt-4o-mini",
        model_hash="abc",
        scope="alice",
    )
    for other in (
        cache_key(body, route_model="gpt-4o-mini", model_hash="abc", scope="bob"),
        cache_key(body, route_model="gpt-4o", model_hash="abc", scope="alice"),
        cache_key(body, route_model="gpt-4o-mini", model_hash="def", scope="alice"),
        cache_key(
            {**body, "max_tokens": 5}, route_model="gpt-4o-mini", model_hash="abc", scope="alice"
        ),
    ):
        assert other != key
    cache.put(key, {"answer": 1}, now=NOW)
    assert cache.get(key, now=NOW + 50) == {"answer": 1}
    assert cache.get(key, now=NOW + 101) is None  # past its TTL
    for n, name in enumerate(("a", "b", "c")):
        cache.put(name, {"n": n}, now=NOW + 200 + n)
    cache.sweep(now=NOW + 210)
    assert cache.entries() == 2 and cache.get("a", now=NOW + 210) is None
    assert cache.get("c", now=NOW + 210) == {"n": 2}
