"""Stored Responses against the in-process app, with the official ``openai`` SDK: ``store``,
``previous_response_id`` across the local and API routes, GET/DELETE ``/v1/responses/{id}``,
its ``input_items`` with OpenAI's pagination, each key's own responses, and retention."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import openai
import pytest
import structlog
from starlette.requests import Request

from proxy.errors import StoreFull, StoreUnavailable
from proxy.ledger.db import access
from proxy.ledger.db.connections import Pool
from proxy.ledger.db.location import Database, parse
from proxy.ledger.db.migrate import open_database
from proxy.ledger.responses_store import ResponseStore, StoredResponse
from proxy.ledger.tenants import keys
from proxy.serving.responses_state import ResponsesState
from tests.conftest import settings_for
from tests.fake_api import FakeAPI
from tests.ledger.conftest import database, pg_server  # noqa: F401 - fixtures
from tests.server.test_responses import API, LOCAL, QUESTION, WEATHER

KEYS_ENV = "FRUGAL_TEST_RESPONSES_KEYS"
ALICE, BOB, CAROL = "sk-alice-admin-0001", "sk-bob-client-0002", "sk-carol-client-0003"


@pytest.fixture
def sdk(
    tmp_path: Path, fake_api: FakeAPI, make_client: Any, monkeypatch: pytest.MonkeyPatch
) -> Callable[..., Any]:
    """``async with sdk(key=None, **sections) as (client, http)``: an ``AsyncOpenAI`` on the
    in-process app; with ``keys=True`` the app wants one of ALICE (admin), BOB, CAROL. Its API
    fallback is Chat Completions (``[fallback] responses = "translate"``), whose requests say
    what each turn was sent; ``tests/server/test_responses_fallback.py`` has the upstream's own
    ``/v1/responses``."""
    monkeypatch.setenv(KEYS_ENV, f"alice;admin:{ALICE},bob:{BOB},carol:{CAROL}")

    @asynccontextmanager
    async def factory(
        *, keys: bool = False, **sections: dict[str, Any]
    ) -> AsyncIterator[Callable[[str | None], openai.AsyncOpenAI]]:
        if keys:
            sections.setdefault("server", {})["api_keys_env"] = KEYS_ENV
        sections.setdefault("fallback", {}).setdefault("responses", "translate")
        async with make_client(settings_for(tmp_path, fake_api, **sections)) as http:

            def client(key: str | None = None) -> openai.AsyncOpenAI:
                return openai.AsyncOpenAI(
                    api_key=key or "sk-unused",
                    base_url="http://localhost/v1",
                    http_client=http,
                    max_retries=0,
                )

            yield client

    return factory


async def test_a_stored_response_is_retrieved_listed_and_deleted(sdk: Any) -> None:
    async with sdk() as client:
        sdk_client = client()
        made = await sdk_client.responses.create(
            model="gpt-4o-mini",
            instructions="Answer briefly.",
            input=[
                {"role": "user", "content": QUESTION},
                {"role": "user", "content": [{"type": "input_text", "text": "One word."}]},
            ],
            extra_headers=API,
        )
        assert made.store is True and made.previous_response_id is None
        again = await sdk_client.responses.retrieve(made.id)
        assert again.model_dump() == made.model_dump()
        items = await sdk_client.responses.input_items.list(made.id, order="asc")
        assert [item.type for item in items.data] == ["message", "message"]
        first, second = items.data
        assert first.content[0].text == QUESTION  # type: ignore[union-attr]
        assert first.content[0].type == "input_text"  # type: ignore[union-attr]
        assert second.content[0].text == "One word."  # type: ignore[union-attr]
        assert all(item.id.startswith("msg_") for item in items.data)  # type: ignore[union-attr]
        deleted = await sdk_client.responses.with_raw_response.delete(made.id)
        said = deleted.http_response.json()
        assert said == {"id": made.id, "object": "response", "deleted": True}
        with pytest.raises(openai.NotFoundError) as gone:
            await sdk_client.responses.retrieve(made.id)
        with pytest.raises(openai.NotFoundError):
            await sdk_client.responses.delete(made.id)
    error = gone.value.body
    assert error["code"] == "not_found" and made.id in error["message"]  # type: ignore[index]


async def test_store_false_is_not_kept(sdk: Any, tmp_path: Path) -> None:
    async with sdk() as client:
        made = await client().responses.create(
            model="gpt-4o-mini", input=QUESTION, store=False, extra_headers=API
        )
        assert made.store is False
        with pytest.raises(openai.NotFoundError):
            await client().responses.retrieve(made.id)
        with pytest.raises(openai.NotFoundError) as caught:
            await client().responses.create(
                model="gpt-4o-mini",
                input="And Italy?",
                previous_response_id=made.id,
                extra_headers=API,
            )
    assert caught.value.body["param"] == "previous_response_id"  # type: ignore[index]
    conn = sqlite3.connect(tmp_path / "ledger.db")
    assert conn.execute("SELECT count(*) FROM responses").fetchone() == (0,)
    conn.close()


async def test_a_chain_local_then_api_sends_the_api_the_earlier_turns(
    sdk: Any, fake_api: FakeAPI
) -> None:
    async with sdk() as client:
        first = await client().responses.with_raw_response.create(
            model="gpt-4o-mini",
            instructions="Answer briefly.",
            input=QUESTION,
            max_output_tokens=16,
            extra_headers=LOCAL,
        )
        assert first.headers["x-frugal-route"] == "local"
        local = first.parse()
        second = await client().responses.create(
            model="gpt-4o-mini",
            input="And of Italy?",
            previous_response_id=local.id,
            extra_headers=API,
        )
        third = await client().responses.create(
            model="gpt-4o-mini", input="Thanks.", previous_response_id=second.id, extra_headers=API
        )
    assert second.previous_response_id == local.id and second.store is True
    assert third.output_text == fake_api.reply
    sent = [body for path, _headers, body in fake_api.requests]
    assert sent[0]["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": QUESTION}]},
        {"role": "assistant", "content": local.output_text},
        {"role": "user", "content": [{"type": "text", "text": "And of Italy?"}]},
    ]  # the first turn's instructions are not carried over, as OpenAI's are not
    assert sent[1]["messages"] == [
        *sent[0]["messages"],
        {"role": "assistant", "content": fake_api.reply},
        {"role": "user", "content": [{"type": "text", "text": "Thanks."}]},
    ]
    for body in sent:  # our ids never leave the proxy
        assert "resp_" not in json.dumps(body) and "previous_response_id" not in body
        assert "store" not in body


async def test_a_function_call_round_trip_with_previous_response_id(
    sdk: Any, fake_api: FakeAPI
) -> None:
    async with sdk() as client:
        first = await client().responses.create(
            model="gpt-4o-mini",
            input="What is the weather in Paris?",
            tools=[WEATHER],
            tool_choice={"type": "function", "name": "get_weather"},
            extra_headers=LOCAL,
        )
        [call] = [item for item in first.output if item.type == "function_call"]
        second = await client().responses.create(
            model="gpt-4o-mini",
            previous_response_id=first.id,
            input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}],
            tools=[WEATHER],
            extra_headers=API,
        )
        items = await client().responses.input_items.list(second.id)
    assert second.output_text == fake_api.reply
    [(_path, _headers, sent)] = fake_api.requests
    assert sent["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "What is the weather in Paris?"}]},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call.call_id,
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": call.arguments},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call.call_id, "content": "sunny"},
    ]
    [output] = items.data  # this turn's own input only
    assert output.type == "function_call_output" and output.call_id == call.call_id


async def test_a_key_sees_only_its_own_responses_and_an_admin_sees_all(sdk: Any) -> None:
    async with sdk(keys=True) as client:
        bob, carol, alice = client(BOB), client(CAROL), client(ALICE)
        made = await bob.responses.create(model="gpt-4o-mini", input=QUESTION, extra_headers=API)
        assert (await bob.responses.retrieve(made.id)).id == made.id
        errors = []
        for attempt in (
            carol.responses.retrieve(made.id),
            carol.responses.input_items.list(made.id),
            carol.responses.delete(made.id),
            carol.responses.create(
                model="gpt-4o-mini", input="hi", previous_response_id=made.id, extra_headers=API
            ),
        ):
            with pytest.raises(openai.NotFoundError) as caught:
                await attempt
            errors.append(caught.value.body)
        # The same 404 as an id never stored: carol cannot tell that it exists.
        with pytest.raises(openai.NotFoundError) as unknown:
            await carol.responses.retrieve("resp_never")
        assert (await alice.responses.retrieve(made.id)).id == made.id  # an admin key
        assert len((await alice.responses.input_items.list(made.id)).data) == 1
        assert (await bob.responses.retrieve(made.id)).id == made.id  # carol deleted nothing
    assert [e["code"] for e in errors] == ["not_found"] * 4  # type: ignore[index]
    assert errors[3]["param"] == "previous_response_id"  # type: ignore[index]
    assert unknown.value.body["message"] == errors[0]["message"].replace(  # type: ignore[index]
        made.id, "resp_never"
    )


async def test_input_items_are_paged_as_openai_pages_them(sdk: Any) -> None:
    words = ["one", "two", "three", "four", "five"]
    async with sdk() as client:
        made = await client().responses.create(
            model="gpt-4o-mini",
            input=[{"role": "user", "content": w} for w in words],
            extra_headers=API,
        )
        http = client()._client  # the in-process httpx client

        async def page(**params: Any) -> dict[str, Any]:
            r = await http.get(f"/v1/responses/{made.id}/input_items", params=params)
            assert r.status_code == 200, r.text
            found: dict[str, Any] = r.json()
            return found

        def texts(found: dict[str, Any]) -> list[str]:
            return [item["content"][0]["text"] for item in found["data"]]

        newest = await page()  # desc by default, 20 at most
        assert texts(newest) == words[::-1] and newest["has_more"] is False
        assert newest["first_id"] == newest["data"][0]["id"]
        assert newest["last_id"] == newest["data"][-1]["id"]
        first = await page(order="asc", limit=2)
        assert texts(first) == ["one", "two"] and first["has_more"] is True
        rest = await page(order="asc", limit=2, after=first["last_id"])
        assert texts(rest) == ["three", "four"] and rest["has_more"] is True
        last = await page(order="asc", limit=2, after=rest["last_id"])
        assert texts(last) == ["five"] and last["has_more"] is False
        before = await page(order="asc", before=rest["last_id"])
        assert texts(before) == ["one", "two", "three"]
        # The SDK's own pager walks every page with `after`.
        listed = [
            item.content[0].text  # type: ignore[union-attr]
            async for item in client().responses.input_items.list(made.id, limit=2, order="asc")
        ]
        assert listed == words
        # Without /v1, as the other routes.
        plain = await http.get(f"/responses/{made.id}/input_items", params={"order": "asc"})
        assert [i["content"][0]["text"] for i in plain.json()["data"]] == words
        assert (await http.get(f"/responses/{made.id}")).json()["id"] == made.id
        bad = {
            "limit": {"limit": 0},
            "order": {"order": "sideways"},
            "after": {"after": "msg_unknown"},
        }
        for param, params in bad.items():
            r = await http.get(f"/v1/responses/{made.id}/input_items", params=params)
            assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
        gone = await http.delete(f"/responses/{made.id}")
        assert gone.json()["deleted"] is True
        assert (await http.get(f"/v1/responses/{made.id}")).status_code == 404


async def test_a_streamed_response_is_stored_before_its_events(sdk: Any) -> None:
    async with sdk() as client:
        async with client().responses.stream(
            model="gpt-4o-mini", input=QUESTION, extra_headers=API
        ) as stream:
            final = await stream.get_final_response()
        assert final.store is True
        again = await client().responses.retrieve(final.id)
    assert again.output_text == final.output_text


async def test_retention_deletes_old_responses_at_start(
    sdk: Any, tmp_path: Path, fake_api: FakeAPI
) -> None:
    db = parse(str(tmp_path / "ledger.db"))
    open_database(db)
    pool = Pool(db)
    store = ResponseStore(pool, retention_days=0)  # keeps everything, for the set-up
    day = 86400.0
    for name, age_days in (("resp_old", 10.0), ("resp_new", 1.0)):
        store.put(
            StoredResponse(
                id=name,
                owner=None,
                key_name=None,
                created_at=time.time() - age_days * day,
                previous_id=None,
                route="api",
                response={"id": name, "object": "response", "output": []},
                input_items=[],
            )
        )
    pool.close()
    async with sdk(responses={"retention_days": 5}) as client:
        with pytest.raises(openai.NotFoundError):
            await client().responses.retrieve("resp_old")
        assert (await client().responses.retrieve("resp_new")).id == "resp_new"


async def test_stored_keys_chain_on_either_ledger_backend(
    tmp_path: Path,
    fake_api: FakeAPI,
    make_client: Any,
    database: Database,  # noqa: F811
) -> None:
    """On SQLite and on PostgreSQL (what replicas share): a stored key's chain, and another
    stored key's 404; the rows name the key that made them."""
    ledger: dict[str, Any] = {"path": str(tmp_path / "ledger.db"), "flush_interval_s": 0.02}
    if database.is_postgres:
        ledger["url"] = database.url
    dave, erin = keys.create(database, "dave"), keys.create(database, "erin")
    async with make_client(settings_for(tmp_path, fake_api, ledger=ledger)) as http:

        def client(key: str) -> openai.AsyncOpenAI:
            return openai.AsyncOpenAI(
                api_key=key, base_url="http://localhost/v1", http_client=http, max_retries=0
            )

        first = await client(dave).responses.create(
            model="gpt-4o-mini", input=QUESTION, extra_headers=API
        )
        second = await client(dave).responses.create(
            model="gpt-4o-mini",
            input="And Italy?",
            previous_response_id=first.id,
            extra_headers=API,
        )
        with pytest.raises(openai.NotFoundError):
            await client(erin).responses.retrieve(second.id)
        assert (await client(dave).responses.retrieve(second.id)).output_text == fake_api.reply
    # the upstream's own /v1/responses (the default fallback) is sent the whole conversation
    assert [len(body["input"]) for _p, _h, body in fake_api.requests] == [1, 3]
    with access.connect(database) as conn:
        stored = conn.query("SELECT id, key_name, previous_id, route FROM responses ORDER BY id")
    assert sorted(stored) == sorted(
        [(first.id, "dave", None, "api"), (second.id, "dave", first.id, "api")]
    )


async def test_a_database_out_of_reach_skips_storing_and_a_read_is_a_503(tmp_path: Path) -> None:
    """The answer is still sent (``store: false``); reading is ``store_unavailable``."""
    state = ResponsesState(settings_for(tmp_path), parse(str(tmp_path)))  # a folder: no file
    request = Request({"type": "http", "method": "GET", "headers": [], "state": {}})
    response = {"id": "resp_1", "object": "response", "output": []}
    try:
        assert await state.keep(request, response, [], "local") is False
        with pytest.raises(StoreUnavailable) as caught:
            await state.visible(request, "resp_1")
        with pytest.raises(StoreUnavailable):
            await state.history(request, "resp_1")
    finally:
        await state.stop()
    assert caught.value.status == 503 and caught.value.code == "store_unavailable"


# -- the stored-responses quota, checked in memory (ResponsesState.tallies) ---------------------


def _stored_request(identity: int) -> Request:
    key = keys.ClientKey(name=f"k{identity}", digest=b"\0" * 32, key_id=identity)
    return Request({"type": "http", "method": "POST", "headers": [], "state": {"client_key": key}})


def _answer(n: int) -> dict[str, Any]:
    """A response of its own answer (no two share one), about 1 KB stored."""
    text = f"answer {n} " + "x" * 900
    return {"id": f"resp_{n}", "object": "response", "output": [{"id": f"msg_o{n}", "text": text}]}


ITEMS = [{"id": "msg_in", "type": "message", "role": "user", "content": "q"}]


def _ledger_lock(db: Database) -> sqlite3.Connection:
    """Another connection holding the SQLite ledger's write lock: every statement of the store
    waits on it (up to the pool's 3 s), then fails."""
    held = sqlite3.connect(db.path, isolation_level=None)
    held.execute("BEGIN IMMEDIATE")
    return held


def _quota_reads(logs: list[dict[str, Any]]) -> int:
    return sum(1 for line in logs if line["event"] == "responses_quota_unread")


QUOTA = {"max_stored_bytes_per_key": 8 * 1024, "max_stored_per_key": 5}
"""Five responses of about 1 KB, or 8 KiB: the count is what the tests below reach first."""


async def _filled(state: ResponsesState, request: Request, start: int) -> list[str]:
    """Store responses for ``request``'s key until ``admit`` refuses the next; the ids stored."""
    kept: list[str] = []
    for n in range(start, start + 100):
        try:
            await state.admit(request, ITEMS)
        except StoreFull as refused:
            assert (refused.param, refused.code) == ("store", "store_quota_exceeded")
            return kept
        assert await state.keep(request, _answer(n), ITEMS, "local") is True
        kept.append(f"resp_{n}")
    raise AssertionError("the quota never refused")


async def test_a_key_under_its_stored_quota_is_admitted_without_a_round_trip(
    tmp_path: Path,
) -> None:
    """Once the key's tally is known, ``admit`` reads nothing for a key under its quota: with
    the ledger locked by another writer, it is admitted with no read (none failed). A key at
    its quota, and a request whose input alone would pass it, are still refused."""
    db = parse(str(tmp_path / "ledger.db"))
    open_database(db)
    state = ResponsesState(settings_for(tmp_path, responses=QUOTA), db)
    under, full = _stored_request(1), _stored_request(2)
    try:
        await state.admit(under, ITEMS)  # the first: read once
        assert await state.keep(under, _answer(1), ITEMS, "local") is True
        assert len(await _filled(state, full, 100)) == 5
        with pytest.raises(StoreFull):
            await state.admit(under, [{**ITEMS[0], "content": "y" * 9000}])
        held = _ledger_lock(db)
        try:
            with structlog.testing.capture_logs() as logs:
                for _ in range(3):
                    await state.admit(under, ITEMS)
        finally:
            held.execute("ROLLBACK")
            held.close()
        assert _quota_reads(logs) == 0, logs
        with pytest.raises(StoreFull):
            await state.admit(full, ITEMS)
    finally:
        await state.stop()


async def test_a_delete_frees_the_tally_the_quota_is_checked_against(tmp_path: Path) -> None:
    """A key refused at its quota deletes one response: its next request is admitted from
    the tally the delete read back, with no read of its own (the ledger is locked)."""
    db = parse(str(tmp_path / "ledger.db"))
    open_database(db)
    state = ResponsesState(settings_for(tmp_path, responses=QUOTA), db)
    request = _stored_request(3)
    try:
        filled = await _filled(state, request, 1)
        await state.remove(filled[0])
        held = _ledger_lock(db)
        try:
            with structlog.testing.capture_logs() as logs:
                await state.admit(request, ITEMS)
        finally:
            held.execute("ROLLBACK")
            held.close()
        assert _quota_reads(logs) == 0, logs
        assert await state.keep(request, _answer(500), ITEMS, "local") is True
        with pytest.raises(StoreFull):
            await state.admit(request, ITEMS)
    finally:
        await state.stop()


async def test_replicas_share_the_stored_quota_and_a_stale_tally_never_stores_past_it(
    tmp_path: Path,
    database: Database,  # noqa: F811
) -> None:
    """Two replicas on one database (SQLite, or the PostgreSQL replicas share): what one
    stores leaves the other's tally too low, and its ``put`` refuses what would pass the quota
    (the answer is sent with ``store: false``); what one deletes leaves the other's too high,
    and its ``admit`` reads the tally again rather than refuse."""
    open_database(database)
    settings = settings_for(tmp_path, responses=QUOTA)
    one, two = ResponsesState(settings, database), ResponsesState(settings, database)
    request = _stored_request(4)
    try:
        await one.admit(request, ITEMS)
        assert await one.keep(request, _answer(1), ITEMS, "local") is True
        filled = await _filled(two, request, 2)
        await one.admit(request, ITEMS)  # its tally: one response, from before the other's
        assert await one.keep(request, _answer(99), ITEMS, "local") is False
        with pytest.raises(StoreFull):  # the refused put read the tally back
            await one.admit(request, ITEMS)
        usage = await asyncio.to_thread(one.store.usage, request.state.client_key.identity)
        assert usage.count == 1 + len(filled) == QUOTA["max_stored_per_key"]
        assert usage.bytes <= QUOTA["max_stored_bytes_per_key"]
        for response_id in ["resp_1", *filled]:
            await two.remove(response_id)
        await one.admit(request, ITEMS)  # its tally says full; the database says empty
        assert await one.keep(request, _answer(200), ITEMS, "local") is True
    finally:
        await one.stop()
        await two.stop()
