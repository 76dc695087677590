"""Background responses (issue 41) against the in-process app, with the official ``openai`` SDK:
``background: true`` answered at once with a ``queued`` response, then polled to its end with
``responses.retrieve`` (the local answer when the gate accepts it, the API's when it rejects
it); ``responses.cancel`` of one whose API call is under way (the call abandoned); another
key's 404; the 400s of ``store: false``, ``stream`` and a cancel of a response that is not a
background one; and the responses a stopped proxy left open, at the next start. Each background
response is one ledger row, ``deferred_tier`` ``background``."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import openai
import pytest

from proxy.ledger.db.connections import Pool
from proxy.ledger.db.location import Database, parse
from proxy.ledger.db.migrate import open_database
from proxy.ledger.responses_store import ResponseStore, StoredResponse
from tests.conftest import settings_for
from tests.fake_api import DEFAULT_REPLY, FakeAPI
from tests.ledger.conftest import database, pg_server  # noqa: F401 - fixtures
from tests.load_factor import scaled
from tests.server.test_app import rows as _rows
from tests.server.test_responses import API, LOCAL, QUESTION

KEYS_ENV = "FRUGAL_TEST_BACKGROUND_KEYS"
ALICE, BOB, CAROL = "sk-alice-admin-0001", "sk-bob-client-0002", "sk-carol-client-0003"
OPEN = ("queued", "in_progress")
COUNT = "Count from one to two hundred in words, separated by commas."
REJECT = {"x-frugal-min-quality": "1"}  # the gate's bar: no local answer reaches it


@pytest.fixture
def sdk(
    tmp_path: Path, fake_api: FakeAPI, make_client: Any, monkeypatch: pytest.MonkeyPatch
) -> Callable[..., Any]:
    """``async with sdk() as client``: ``client(key)`` is an ``AsyncOpenAI`` on the in-process
    app, which wants ALICE (admin), BOB or CAROL; its API fallback is the fake's Chat
    Completions (``[fallback] responses = "translate"``)."""
    monkeypatch.setenv(KEYS_ENV, f"alice;admin:{ALICE},bob:{BOB},carol:{CAROL}")

    @asynccontextmanager
    async def factory(
        **sections: dict[str, Any],
    ) -> AsyncIterator[Callable[[str], openai.AsyncOpenAI]]:
        sections.setdefault("server", {})["api_keys_env"] = KEYS_ENV
        sections.setdefault("fallback", {})["responses"] = "translate"
        settings = settings_for(tmp_path, fake_api, **sections)
        async with make_client(settings) as http:

            def client(key: str) -> openai.AsyncOpenAI:
                return openai.AsyncOpenAI(
                    api_key=key, base_url="http://localhost/v1", http_client=http, max_retries=0
                )

            client.http = http  # type: ignore[attr-defined]
            yield client
            assert await http.app.state.services.ledger.flush(10)  # type: ignore[attr-defined]

    return factory


async def _polled(client: openai.AsyncOpenAI, rid: str, *, until: tuple[str, ...]) -> Any:
    """The response ``rid``, retrieved until its status is one of ``until``."""
    deadline = time.monotonic() + scaled(120)
    while True:
        found = await client.responses.retrieve(rid)
        if found.status in until or time.monotonic() > deadline:
            return found
        await asyncio.sleep(0.05)


async def _background(client: openai.AsyncOpenAI, route: dict[str, str], **more: Any) -> Any:
    """A background response to QUESTION, made with the headers ``route`` (LOCAL, API or
    REJECT) and any ``more`` parameters."""
    return await client.responses.create(
        model="gpt-4o-mini", input=QUESTION, background=True, extra_headers=route, **more
    )


async def _to_its_end(sdk: Any, route: dict[str, str]) -> tuple[Any, Any]:
    """Bob's background response of 16 tokens at most with the headers ``route``: as it was
    made, and as it stands once it has ended."""
    async with sdk() as client:
        bob = client(BOB)
        made = await _background(bob, route, max_output_tokens=16)
        return made, await _polled(bob, made.id, until=("completed", "incomplete", "failed"))


async def test_a_background_response_is_queued_then_answered_locally(
    sdk: Any, fake_api: FakeAPI, tmp_path: Path
) -> None:
    made, done = await _to_its_end(sdk, LOCAL)
    assert (made.status, made.background, made.store, made.output) == ("queued", True, True, [])
    print(f"background local answer: {done.status} {done.output_text!r}")
    assert done.id == made.id and done.background is True
    assert done.status in ("completed", "incomplete") and done.output_text
    assert done.output_text != DEFAULT_REPLY and fake_api.count == 0  # the local model's
    [row] = _rows(tmp_path / "ledger.db")  # the queueing wrote none: the run wrote one
    assert (row["endpoint"], row["route"], row["deferred_tier"]) == (
        "responses",
        "local",
        "background",
    )


async def test_a_background_response_runs_as_deferred_work_past_the_interactive_deadline(
    sdk: Any, fake_api: FakeAPI, tmp_path: Path
) -> None:
    """``[local] timeout_s`` too short for the answer; the background run has flex's window,
    and holds its engine place as deferred work (/healthz's ``engine.deferred.running``)."""
    long = {"input": COUNT, "max_output_tokens": 96, "extra_headers": LOCAL}
    async with sdk(local={"timeout_s": 0.2}, batch={"flex_timeout_s": 600.0}) as client:
        bob = client(BOB)
        interactive = await bob.responses.create(model="gpt-4o-mini", **long)
        made = await bob.responses.create(model="gpt-4o-mini", background=True, **long)
        seen_deferred = 0
        deadline = time.monotonic() + scaled(120)
        while time.monotonic() < deadline:
            auth = {"authorization": f"Bearer {ALICE}"}
            health = (await client.http.get("/healthz", headers=auth)).json()
            seen_deferred = max(seen_deferred, health["engine"]["deferred"]["running"])
            done = await bob.responses.retrieve(made.id)
            if done.status not in OPEN:
                break
            await asyncio.sleep(0.01)
    print(f"interactive: {interactive.status}; background: {done.status}, {done.usage}")
    assert interactive.status == "failed"  # cut by [local] timeout_s
    assert interactive.error is not None and "timeout_s" in interactive.error.message
    assert done.status in ("completed", "incomplete") and done.error is None
    assert done.usage is not None and done.usage.output_tokens > 0
    assert seen_deferred == 1  # it ran in the engine's deferred class
    assert fake_api.count == 0


async def test_a_background_response_the_gate_rejects_is_the_apis(
    sdk: Any, fake_api: FakeAPI, tmp_path: Path
) -> None:
    made, done = await _to_its_end(sdk, REJECT)
    assert made.status == "queued"
    assert (done.status, done.output_text) == ("completed", DEFAULT_REPLY)
    assert fake_api.single_calls == 1
    [row] = _rows(tmp_path / "ledger.db")
    assert (row["route"], row["deferred_tier"], row["status"]) == ("api", "background", 200)


async def test_a_running_background_response_is_cancelled_and_its_api_call_abandoned(
    sdk: Any, fake_api: FakeAPI, tmp_path: Path
) -> None:
    fake_api.set(hang=True)
    async with sdk() as client:
        bob, carol = client(BOB), client(CAROL)
        made = await _background(bob, API)
        running = await _polled(bob, made.id, until=("in_progress",))
        assert running.status == "in_progress"
        deadline = time.monotonic() + scaled(30)
        while fake_api.count == 0 and time.monotonic() < deadline:  # the call is under way
            await asyncio.sleep(0.02)
        with pytest.raises(openai.NotFoundError):
            await carol.responses.cancel(made.id)  # another key's: as if it did not exist
        with pytest.raises(openai.NotFoundError):
            await carol.responses.retrieve(made.id)
        cancelled = await bob.responses.cancel(made.id)
        assert (cancelled.id, cancelled.status) == (made.id, "cancelled")
        again = await bob.responses.cancel(made.id)  # a finished one is answered as it is
        assert again.status == "cancelled"
        deadline = time.monotonic() + scaled(30)
        while fake_api.disconnects == 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        assert (await bob.responses.retrieve(made.id)).status == "cancelled"
    assert (fake_api.count, fake_api.disconnects) == (1, 1)  # the API call was abandoned
    [row] = _rows(tmp_path / "ledger.db")
    assert (row["deferred_tier"], row["status"]) == ("background", 499)


async def test_background_needs_store_and_only_it_is_cancelled(
    sdk: Any, fake_api: FakeAPI, tmp_path: Path
) -> None:
    async with sdk() as client:
        bob = client(BOB)
        with pytest.raises(openai.BadRequestError) as refused:
            await bob.responses.create(
                model="gpt-4o-mini", input=QUESTION, background=True, store=False
            )
        assert refused.value.body["param"] == "store"  # type: ignore[index]
        plain = await bob.responses.create(
            model="gpt-4o-mini", input=QUESTION, max_output_tokens=8, extra_headers=LOCAL
        )
        with pytest.raises(openai.BadRequestError) as refused:
            await bob.responses.cancel(plain.id)
        assert refused.value.body["param"] == "response_id"  # type: ignore[index]
        with pytest.raises(openai.BadRequestError) as refused:
            await bob.responses.retrieve(plain.id, stream=True)
        assert refused.value.body["param"] == "stream"  # type: ignore[index]
    assert fake_api.count == 0 and len(_rows(tmp_path / "ledger.db")) == 2


def _left_open(db: Path, rid: str, status: str) -> None:
    """A background response ``status`` in the store, as a proxy killed mid-run leaves it."""
    pool = Pool(parse(str(db)), size=1, timeout_s=3.0)
    try:
        ResponseStore(pool, retention_days=0).put(
            StoredResponse(
                id=rid,
                owner=None,
                key_name="bob",
                created_at=time.time(),
                previous_id=None,
                route="background",
                response={"id": rid, "status": status, "background": True, "output": []},
                input_items=[],
            )
        )
    finally:
        pool.close()


async def test_background_responses_left_open_are_failed_at_start_with_one_row_each(
    sdk: Any, fake_api: FakeAPI, tmp_path: Path
) -> None:
    async with sdk() as client:  # a first start makes the ledger; then a killed run's leftovers
        fake_api.set(hang=True)
        made = await _background(client(BOB), API)
        await _polled(client(BOB), made.id, until=("in_progress",))
    # stopped mid-run: its run wrote its row, and it is failed
    assert [r["status"] for r in _rows(tmp_path / "ledger.db")] == [499]
    _left_open(tmp_path / "ledger.db", "resp_killed_queued", "queued")
    _left_open(tmp_path / "ledger.db", "resp_killed_running", "in_progress")
    fake_api.reset()
    async with sdk() as client:
        alice = client(ALICE)  # the admin reads every key's
        for rid in (made.id, "resp_killed_queued", "resp_killed_running"):
            found = await alice.responses.retrieve(rid)
            assert found.status == "failed" and found.error is not None, rid
    rows = _rows(tmp_path / "ledger.db")
    print([(r["status"], r["error"], r["deferred_tier"]) for r in rows])
    assert [(r["status"], r["deferred_tier"]) for r in rows] == [
        (499, "background"),
        (500, "background"),
        (500, "background"),
    ]
    assert fake_api.count == 0  # not run again


async def test_a_key_past_its_background_bound_gets_a_429_naming_background(
    sdk: Any, fake_api: FakeAPI, tmp_path: Path
) -> None:
    fake_api.set(hang=True)
    async with sdk(responses={"max_background_per_key": 1}) as client:
        bob, carol = client(BOB), client(CAROL)
        first = await _background(bob, API)
        with pytest.raises(openai.RateLimitError) as refused:
            await _background(bob, API)
        assert refused.value.body["param"] == "background"  # type: ignore[index]
        other = await _background(carol, API)  # another key's bound is its own
        await bob.responses.cancel(first.id)
        await carol.responses.cancel(other.id)
        background = client.http.app.state.services.background
        deadline = time.monotonic() + scaled(30)
        while background.running and time.monotonic() < deadline:  # until both runs end
            await asyncio.sleep(0.02)
        third = await _background(bob, API)  # its place is free once its run has ended
        await bob.responses.cancel(third.id)
    assert third.status == "queued"
    rows = [(r["status"], r["deferred_tier"]) for r in _rows(tmp_path / "ledger.db")]
    # one each, queued or running when cancelled; the refusal's own, as any refusal's
    assert sorted(rows, key=str) == [(429, None), *[(499, "background")] * 3]


async def test_a_streamed_background_response_is_resumed_after_a_sequence_number(
    sdk: Any, fake_api: FakeAPI, tmp_path: Path
) -> None:
    async with sdk() as client:
        bob, carol = client(BOB), client(CAROL)
        stream = await bob.responses.create(
            model="gpt-4o-mini",
            input=QUESTION,
            max_output_tokens=16,
            background=True,
            stream=True,
            extra_headers=LOCAL,
        )
        first = [event async for event in stream]
        rid = first[0].response.id  # type: ignore[union-attr]
        resumed = [
            event
            async for event in await bob.responses.retrieve(rid, stream=True, starting_after=2)
        ]
        with pytest.raises(openai.NotFoundError):
            await carol.responses.retrieve(rid, stream=True)
    numbers = [event.sequence_number for event in first]
    print(f"streamed: {[event.type for event in first]}")
    assert numbers == list(range(len(first))) and len(first) > 3
    assert first[-1].type in ("response.completed", "response.incomplete")  # 16 tokens may end it
    assert first[-1].response.output_text  # type: ignore[union-attr]
    assert [e.model_dump() for e in resumed] == [e.model_dump() for e in first[3:]]
    [row] = _rows(tmp_path / "ledger.db")
    assert (row["route"], row["deferred_tier"]) == ("local", "background")


def test_a_background_responses_moves_are_conditional_on_either_ledger_backend(
    database: Database,  # noqa: F811
) -> None:
    """The store's side, on SQLite and on PostgreSQL (replicas): each move happens only from
    the statuses it names, so a cancel and the run's end cannot both win; the open ones are
    listed for the restart; the key's tally follows each row's bytes."""
    open_database(database)
    pool = Pool(database, size=1, timeout_s=3.0)
    store = ResponseStore(pool, retention_days=0)
    try:
        for rid in ("resp_a", "resp_b"):
            shell = {"id": rid, "status": "queued", "background": True, "output": []}
            store.put(
                StoredResponse(
                    id=rid,
                    owner="bob-id",
                    key_name="bob",
                    created_at=time.time(),
                    previous_id=None,
                    route="background",
                    response=shell,
                    input_items=[{"type": "message", "role": "user", "content": "q"}],
                )
            )
        open_before = sorted(s.id for s in store.unfinished())
        running = {"id": "resp_a", "status": "in_progress", "background": True, "output": []}
        moves = [
            store.advance("resp_a", running, route="background", only_from=("queued",)),
            store.advance("resp_a", running, route="background", only_from=("queued",)),
            store.advance(
                "resp_a",
                {**running, "status": "cancelled"},
                route="background",
                only_from=("queued", "in_progress"),
            ),
        ]
        answer = {**running, "status": "completed", "output": [{"id": "msg_1", "text": "x" * 50}]}
        late = store.advance("resp_a", answer, route="local", only_from=("in_progress",))
        done_b = store.advance("resp_b", answer, route="local", only_from=("queued",))
        found_a, found_b = store.get("resp_a"), store.get("resp_b")
        open_ids = [s.id for s in store.unfinished()]
        usage = store.usage("bob-id")
        with pool.transaction() as tx:
            kept = sum(int(row[0]) for row in tx.rows("SELECT bytes FROM responses"))
    finally:
        pool.close()
    assert moves == [True, False, True] and (late, done_b) == (False, True)
    assert found_a is not None and found_a.response["status"] == "cancelled"
    assert found_b is not None and found_b.response["output"] == answer["output"]
    assert found_b.route == "local" and found_b.response["store"] is True
    assert (open_before, open_ids) == (["resp_a", "resp_b"], [])
    assert (usage.count, usage.bytes) == (2, kept)
