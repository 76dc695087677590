"""Stored Responses in the ledger database (proxy/ledger/responses_store.py), on SQLite and on a
real PostgreSQL: a response and its input items come back as stored, a chain is walked back to
its first turn, deletion and retention remove rows, and two pools (two replicas) share them."""

from __future__ import annotations

from proxy.ledger.db.connections import Pool
from proxy.ledger.db.location import Database
from proxy.ledger.responses_store import PRUNE_EVERY_S, ResponseStore, StoredResponse

NOW = 1_790_000_000.0
DAY = 86400.0


def turn(
    n: int, *, previous: str | None = None, age_days: float = 0.0, owner: str = "id:1"
) -> StoredResponse:
    return StoredResponse(
        id=f"resp_{n}",
        owner=owner,
        key_name="bob",
        created_at=NOW - age_days * DAY,
        previous_id=previous,
        route="local" if n % 2 else "api",
        response={
            "id": f"resp_{n}",
            "object": "response",
            "output": [{"type": "message", "role": "assistant", "content": f"answer {n} é"}],
        },
        input_items=[{"id": f"msg_{n}", "type": "message", "role": "user", "content": f"q{n}"}],
    )


def test_a_response_comes_back_as_stored(pool: Pool) -> None:
    store = ResponseStore(pool, retention_days=30)
    store.put(turn(1), now=NOW)
    assert store.get("resp_1") == turn(1)
    assert store.get("resp_2") is None
    assert store.chain("resp_2") == []


def test_a_chain_is_walked_back_to_its_first_turn_in_order(pool: Pool) -> None:
    store = ResponseStore(pool, retention_days=30)
    store.put(turn(1), now=NOW)
    store.put(turn(2, previous="resp_1"), now=NOW)
    store.put(turn(3, previous="resp_2"), now=NOW)
    store.put(turn(4, previous="resp_1"), now=NOW)  # a branch off the first turn
    assert [t.id for t in store.chain("resp_3")] == ["resp_1", "resp_2", "resp_3"]
    assert [t.id for t in store.chain("resp_4")] == ["resp_1", "resp_4"]
    assert store.delete("resp_2") is True
    assert store.delete("resp_2") is False
    assert [t.id for t in store.chain("resp_3")] == ["resp_3"]  # the link is gone: it ends


def test_retention_deletes_what_is_older_and_keeps_the_rest(pool: Pool) -> None:
    store = ResponseStore(pool, retention_days=7)
    keep_all = ResponseStore(pool, retention_days=0)
    keep_all.put(turn(1, age_days=8), now=NOW)
    keep_all.put(turn(2, age_days=6), now=NOW)
    assert keep_all.prune(now=NOW) == 0 and keep_all.count() == 2
    assert store.prune(now=NOW) == 1
    assert store.get("resp_1") is None and store.get("resp_2") is not None
    # A write prunes too, at most once an hour.
    keep_all.put(turn(3, age_days=30), now=NOW)
    store.put(turn(4), now=NOW + 60)  # pruned a minute ago: not yet
    assert store.get("resp_3") is not None
    store.put(turn(5), now=NOW + PRUNE_EVERY_S + 1)
    assert store.get("resp_3") is None
    assert store.count() == 3


def test_two_replicas_share_the_stored_responses(database: Database, pool: Pool) -> None:
    other = Pool(database, size=1, timeout_s=10.0)
    try:
        ResponseStore(pool, retention_days=30).put(turn(1), now=NOW)
        replica = ResponseStore(other, retention_days=30)
        replica.put(turn(2, previous="resp_1"), now=NOW)
        assert [t.id for t in ResponseStore(pool, retention_days=30).chain("resp_2")] == [
            "resp_1",
            "resp_2",
        ]
    finally:
        other.close()
