"""Stored Responses in the ledger database (proxy/ledger/responses_store.py), on SQLite and on a
real PostgreSQL: a response and its input items come back as stored, a chain is walked back to
its first turn, deletion and retention remove rows, and two pools (two replicas) share them; an
answer carried by several responses is kept once, and a key's quota holds; a background
response's lease keeps it from another replica's sweep until it passes."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.ledger.db.connections import Pool
from proxy.ledger.db.location import Database
from proxy.ledger.responses_store import (
    OPEN,
    PRUNE_EVERY_S,
    QuotaFull,
    ResponseStore,
    StoredResponse,
    Usage,
)

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
    assert store.delete("resp_2") is not None
    assert store.delete("resp_2") is None
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


def _with_ids(n: int, output_ids: list[str]) -> StoredResponse:
    """turn(1)'s answer again, as a cache hit stores it: a new response id, new item ids."""
    first = turn(1)
    output = [
        {"id": item_id, "type": "message", "role": "assistant", "content": "answer 1 é"}
        for item_id in output_ids
    ]
    return StoredResponse(
        id=f"resp_{n}",
        owner=first.owner,
        key_name=first.key_name,
        created_at=first.created_at,
        previous_id=None,
        route="cache",
        response={**first.response, "id": f"resp_{n}", "output": output},
        input_items=first.input_items,
    )


def _answers(pool: Pool) -> int:
    with pool.transaction() as tx:
        return int(tx.rows("SELECT count(*) FROM response_outputs")[0][0])


def test_an_answer_carried_by_several_responses_is_kept_once(pool: Pool) -> None:
    store = ResponseStore(pool, retention_days=30)
    first = store.put(_with_ids(1, ["msg_a", "msg_b"]), now=NOW).cost
    again = store.put(_with_ids(2, ["msg_c", "msg_d"]), now=NOW).cost
    assert _answers(pool) == 1
    assert again < first  # the second pays for its ids and input items, not for the answer
    assert store.usage("id:1").bytes == first + again
    got = store.get("resp_2")
    assert got is not None and got == _with_ids(2, ["msg_c", "msg_d"])
    assert [item["id"] for item in got.response["output"]] == ["msg_c", "msg_d"]
    store.delete("resp_1")
    assert _answers(pool) == 1 and store.get("resp_2") == _with_ids(2, ["msg_c", "msg_d"])
    store.delete("resp_2")
    assert _answers(pool) == 0


def test_retention_takes_an_answer_along_with_its_last_response(pool: Pool) -> None:
    store = ResponseStore(pool, retention_days=7)
    store.put(_with_ids(1, ["msg_a"]), now=NOW - 8 * DAY)
    assert _answers(pool) == 1
    assert store.prune(now=NOW + 8 * DAY) == 1
    assert _answers(pool) == 0


def test_a_key_at_its_quota_stores_nothing_more_and_other_keys_are_not_held(pool: Pool) -> None:
    one = (
        ResponseStore(pool, retention_days=30, max_bytes=10_000_000, max_count=1000)
        .put(turn(1), now=NOW)
        .cost
    )
    store = ResponseStore(pool, retention_days=30, max_bytes=3 * one, max_count=1000)
    stored, refused = 1, 0
    for n in range(2, 8):
        try:
            store.put(turn(n), now=NOW)
            stored += 1
        except QuotaFull as exc:
            refused += 1
            assert exc.usage == store.usage("id:1")
    usage = store.usage("id:1")
    assert usage.count == stored and usage.bytes <= store.max_bytes
    assert refused > 0 and store.get(f"resp_{stored + 1}") is None
    store.put(turn(20, owner="id:2"), now=NOW)  # another key has its own quota
    keyless = turn(21)
    store.put(StoredResponse(**{**_fields(keyless), "owner": None}), now=NOW)
    assert store.usage(None).count == 1 and store.usage("id:2").count == 1
    counted = ResponseStore(pool, retention_days=30, max_count=usage.count)
    with pytest.raises(QuotaFull):
        counted.put(turn(30), now=NOW)


def _fields(stored: StoredResponse) -> dict[str, Any]:
    return {name: getattr(stored, name) for name in StoredResponse.__dataclass_fields__}


def test_a_keys_tally_stays_the_sum_of_its_rows_through_writes_deletes_and_prunes(
    pool: Pool,
) -> None:
    """What the quota reads (``response_usage``) is what the key's rows hold, whatever was
    written, deleted or pruned, for a key, another key and the keyless proxy."""
    store = ResponseStore(pool, retention_days=7)

    def summed(owner: str | None) -> Usage:
        where = "owner IS NULL" if owner is None else "owner = ?"
        with pool.transaction() as tx:
            row = tx.rows(
                f"SELECT count(*), coalesce(sum(bytes), 0) FROM responses WHERE {where}",
                () if owner is None else (owner,),
            )
        return Usage(count=int(row[0][0]), bytes=int(row[0][1]))

    for n in range(1, 7):
        store.put(turn(n, age_days=10 if n % 3 == 0 else 0), now=NOW)
    store.put(turn(7, owner="id:2"), now=NOW)
    store.put(StoredResponse(**{**_fields(turn(8, age_days=10)), "owner": None}), now=NOW)
    store.put(StoredResponse(**{**_fields(turn(9)), "owner": None}), now=NOW)
    assert store.delete("resp_2") and store.delete("resp_7")
    assert store.prune(now=NOW) == 3  # resp_3, resp_6 and the keyless resp_8
    for owner in ("id:1", "id:2", None):
        assert store.usage(owner) == summed(owner), owner
    assert store.usage("id:1").count == 3 and store.usage("id:2") == Usage(0, 0)
    assert store.usage(None).count == 1


def test_put_and_delete_read_back_the_keys_tally_and_a_refused_put_keeps_no_answer(
    pool: Pool,
) -> None:
    """What ``put`` and ``delete`` return is the key's tally as the database holds it after
    them (what the HTTP side checks its next request against); a put past the quota leaves
    neither the row, nor its answer, nor a change to the tally."""
    store = ResponseStore(pool, retention_days=30)
    first = store.put(turn(1), now=NOW)
    second = store.put(turn(2), now=NOW)
    assert first.usage == Usage(1, first.cost)
    assert second.usage == Usage(2, first.cost + second.cost) == store.usage("id:1")
    tight = ResponseStore(pool, retention_days=30, max_bytes=second.usage.bytes + 10)
    with pytest.raises(QuotaFull) as refused:
        tight.put(turn(3), now=NOW)
    assert refused.value.usage == second.usage == store.usage("id:1")
    assert store.get("resp_3") is None and _answers(pool) == 0
    hit = StoredResponse(**{**_fields(turn(3)), "route": "cache"})  # an answer to share
    with pytest.raises(QuotaFull):
        tight.put(hit, now=NOW)
    assert store.get("resp_3") is None and _answers(pool) == 0
    freed = store.delete("resp_1")
    assert freed is not None and freed.owner == "id:1"
    assert freed.usage == Usage(1, second.cost) == store.usage("id:1")


def _background(rid: str, lease_until: float | None, holder: str | None = None) -> StoredResponse:
    return StoredResponse(
        id=rid,
        owner="id:1",
        key_name="bob",
        created_at=NOW,
        previous_id=None,
        route="background",
        response={"id": rid, "status": "queued", "background": True, "output": []},
        input_items=[],
        lease_until=lease_until,
        lease_owner=holder,
    )


def test_a_background_responses_lease_is_shared_and_a_renewal_beats_a_sweep(
    database: Database, pool: Pool
) -> None:
    """Two pools (two replicas): one holds leased responses and renews one; the other reads
    the open ones with their leases (those that hold one through the lease's index), and its
    move of a response is refused once the lease was renewed past the time it judged; an ended
    response holds no lease, and a renewal does not give it one back."""
    other = Pool(database, size=1, timeout_s=10.0)
    try:
        mine, theirs = ResponseStore(pool, retention_days=0), ResponseStore(other, retention_days=0)
        mine.put(_background("resp_live", NOW + 300, "host-a:11"), now=NOW)
        mine.put(_background("resp_old", None), now=NOW)  # written before leases
        mine.put(_background("resp_dead", NOW + 300, "host-a:12"), now=NOW)
        mine.put(_background("resp_stopped", NOW + 300, "host-a:11"), now=NOW)
        given_up = mine.renew(["resp_stopped"], 0.0)  # a stop gives it up
        seen = {s.id: (s.lease_until, s.lease_owner) for s in theirs.unfinished()}
        leased = sorted(s.id for s in theirs.unfinished(leased=True))
        renewed = mine.renew(["resp_live"], NOW + 600)  # resp_dead's holder stopped renewing
        failed = {"status": "failed", "background": True, "output": []}
        moves = {
            rid: theirs.advance(
                rid, {**failed, "id": rid}, route="background", only_from=OPEN, lapsed_at=NOW + 300
            )
            for rid in ("resp_live", "resp_dead")
        }
        after = {s.id: s.lease_until for s in theirs.unfinished(leased=True)}
        revived = mine.renew(["resp_dead"], NOW + 10_000)
    finally:
        other.close()
    assert (given_up, renewed, revived) == (1, 1, 0)
    assert seen == {
        "resp_live": (NOW + 300, "host-a:11"),
        "resp_old": (None, None),
        "resp_dead": (NOW + 300, "host-a:12"),
        "resp_stopped": (0.0, "host-a:11"),
    }
    assert leased == ["resp_dead", "resp_live", "resp_stopped"]
    assert moves == {"resp_live": False, "resp_dead": True}
    assert after == {"resp_live": NOW + 600, "resp_stopped": 0.0}


def _fresh(n: int, output_ids: list[str]) -> StoredResponse:
    """turn(1)'s answer as a fresh answer (from the API) stores it, under new ids."""
    return StoredResponse(**{**_fields(_with_ids(n, output_ids)), "route": "api"})


def _kept(pool: Pool, items: int = 1) -> tuple[int, int]:
    """(copies of turn(1)'s answer, of ``items`` output items, in the database; the bytes its
    rows and answers take), read from the tables themselves."""
    with pool.transaction() as tx:
        rows = tx.rows("SELECT response, input_items FROM responses")
        outputs = [str(row[0]) for row in tx.rows("SELECT output FROM response_outputs")]
    texts = [str(text) for row in rows for text in row] + outputs
    copies = sum(text.count("answer 1 é") for text in texts) // items
    return copies, sum(len(text.encode("utf-8")) for text in texts)


def test_a_fresh_answer_is_kept_inline_and_its_cache_hits_share_it_in_one_copy(
    pool: Pool,
) -> None:
    """A fresh answer is one row, its answer inline; the first cache hit of it moves the answer
    to one shared copy, the fresh response still paying for it, and later hits pay nothing for
    it; every response reads back as stored, and the key's tally stays what its rows take."""
    store = ResponseStore(pool, retention_days=30)
    fresh = store.put(_fresh(1, ["msg_a", "msg_b"]), now=NOW)
    assert _answers(pool) == 0 and _kept(pool, 2) == (1, fresh.cost)
    hit = store.put(_with_ids(2, ["msg_c", "msg_d"]), now=NOW)
    again = store.put(_with_ids(3, ["msg_e", "msg_f"]), now=NOW)
    copies, stored = _kept(pool, 2)
    assert _answers(pool) == 1 and copies == 1, (_answers(pool), copies)
    assert hit.cost == again.cost < fresh.cost  # the hits pay no answer
    assert store.usage("id:1") == again.usage == Usage(3, stored)
    assert store.get("resp_1") == _fresh(1, ["msg_a", "msg_b"])
    assert store.get("resp_2") == _with_ids(2, ["msg_c", "msg_d"])
    assert store.get("resp_3") == _with_ids(3, ["msg_e", "msg_f"])
    store.delete("resp_1")
    assert store.get("resp_2") == _with_ids(2, ["msg_c", "msg_d"]) and _answers(pool) == 1
    store.delete("resp_2")
    store.delete("resp_3")
    assert _answers(pool) == 0 and store.usage("id:1") == Usage(0, 0) and _kept(pool) == (0, 0)


def test_a_cache_hit_takes_the_copies_of_every_fresh_answer_it_matches(pool: Pool) -> None:
    """Two fresh answers alike (two keys) each keep their own copy; a hit of them shares one
    copy, paid by the oldest, and each key's tally stays what its rows take."""
    store = ResponseStore(pool, retention_days=30)
    store.put(_fresh(1, ["msg_a"]), now=NOW)
    other = StoredResponse(
        **{**_fields(_fresh(2, ["msg_b"])), "owner": "id:2", "created_at": NOW + 1}
    )
    store.put(other, now=NOW)
    assert _kept(pool)[0] == 2
    store.put(StoredResponse(**{**_fields(_with_ids(3, ["msg_c"])), "owner": "id:3"}), now=NOW)
    copies, stored = _kept(pool)
    assert copies == 1 and _answers(pool) == 1
    tallies = [store.usage(owner) for owner in ("id:1", "id:2", "id:3")]
    assert sum(usage.bytes for usage in tallies) == stored
    assert tallies[0].bytes > tallies[1].bytes == tallies[2].bytes  # the oldest pays the answer
    assert store.get("resp_2") == other
    assert store.prune(now=NOW + 31 * DAY) == 3 and _answers(pool) == 0
