"""``/v1/responses`` under a key's budget and through the response cache
(proxy/serving/responses.py, proxy/serving/quotas.py), on SQLite and on a real PostgreSQL, with
the real engine and the fake API's own ``/v1/responses``.

The budget reserves the worst case of the body the upstream is sent, the earlier turns of a
chain included, and a stated bound for what its bytes cannot measure (images, files, built-in
tools). The cache keys an answer on the whole conversation and every field that changes it; a
hit gets a response id and item ids of its own, and is stored for the key that asked."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

from proxy.ledger.db import access
from proxy.ledger.db.location import Database
from proxy.ledger.pricing import PriceBook, load_price_map
from proxy.ledger.tenants import keys
from proxy.serving.quotas import IMAGE_TOKENS, unmeasured_tokens, worst_case_tokens
from tests.conftest import AppFactory
from tests.fake_api import FakeAPI
from tests.serving.test_budgets import spend

RESPONSES = "/v1/responses"
API = {"x-frugal-route": "api"}
LOCAL = {"x-frugal-route": "local", "x-frugal-min-quality": "0"}
ASK: dict[str, Any] = {
    "model": "gpt-4o-mini",
    "input": "Name a colour.",
    "max_output_tokens": 16,
}
IMAGE = {"type": "input_image", "image_url": "https://example.com/a.png", "detail": "high"}
CACHE = {"enabled": True, "ttl_s": 600.0, "shared": False}
BUDGET_PUSD = 1_000_000_000  # $0.001


def _auth(db: Database, name: str, **limits: Any) -> dict[str, str]:
    return {"authorization": f"Bearer {keys.create(db, name, **limits)}"}


def _with_image(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": [{"type": "input_text", "text": text}, IMAGE]}]


def _rows(db: Database) -> list[tuple[Any, ...]]:
    with access.connect(db) as conn:
        return list(
            conn.query(
                "SELECT route, reason, status, key_name, api_cost_pusd FROM requests "
                "WHERE endpoint = 'responses' ORDER BY id"
            )
        )


# -- budgets -------------------------------------------------------------------------------------


def test_what_bytes_cannot_measure_is_charged_its_stated_bound() -> None:
    text: dict[str, Any] = {"model": "m", "input": [{"role": "user", "content": "Look."}]}
    assert unmeasured_tokens(text, 1000) == 0
    assert unmeasured_tokens({**text, "input": _with_image("Look.")}, 1000) == IMAGE_TOKENS
    filed = [{"role": "user", "content": [{"type": "input_file", "file_id": "file-1"}]}]
    assert unmeasured_tokens({**text, "input": filed}, 1000) == 1000
    tools = [{"type": "web_search"}, {"type": "file_search"}, {"type": "function", "name": "f"}]
    assert unmeasured_tokens({**text, "tools": tools}, 1000) == 2000  # one call each
    assert unmeasured_tokens({**text, "tools": tools, "max_tool_calls": 5}, 1000) == 5000
    assert unmeasured_tokens({**text, "tools": tools}, None) == 2 * 128_000  # window unknown
    # A tool's output may hold an image too, and chat's image parts count the same.
    output = [{"type": "function_call_output", "call_id": "c", "output": [IMAGE]}]
    assert unmeasured_tokens({**text, "input": output}, 1000) == IMAGE_TOKENS
    chat = {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}
    assert unmeasured_tokens(chat, 1000) == IMAGE_TOKENS


def test_every_input_item_counts_by_its_bytes_whatever_the_local_model_read() -> None:
    # No local count takes the place of any item's bytes (issue 39): what the local model was
    # sent and what it never reads (a reasoning item) count alike, by their bytes / 2.
    said = {"role": "user", "content": [{"type": "input_text", "text": "hello " * 100}]}
    reasoning = {"type": "reasoning", "summary": [], "encrypted_content": "Z" * 4000}
    plain, _ = worst_case_tokens({"model": "m", "input": [said]}, 16)
    hidden, _ = worst_case_tokens({"model": "m", "input": [said, reasoning]}, 16)
    assert plain >= len("hello " * 100) // 2  # the text sent, by its bytes
    assert hidden - plain >= 4000 // 2  # the reasoning item, by its bytes
    # max_output_tokens caps the answer as max_tokens does on chat.
    assert worst_case_tokens({"model": "m", "input": "x", "max_output_tokens": 7})[1] == 7


async def test_a_budget_that_holds_text_refuses_the_same_request_with_images_or_built_in_tools(
    open_app: AppFactory, fake_api: FakeAPI, database: Database
) -> None:
    # gpt-4o-mini at $0.15 / $0.60 per Mtok: the text request's worst case is a few
    # micro-dollars; one image is reserved 48,169 tokens ($0.0072), a built-in tool the whole
    # input window (128,000 tokens, $0.0192): each more than the $0.001 budget, though the
    # image's URL and the tool's definition are a few bytes.
    auth = {**_auth(database, "small", monthly_budget_pusd=BUDGET_PUSD), **API}
    async with open_app() as client:
        text = await client.post(RESPONSES, json=ASK, headers=auth)
        image = await client.post(
            RESPONSES, json={**ASK, "input": _with_image("Name a colour.")}, headers=auth
        )
        searched = await client.post(
            RESPONSES, json={**ASK, "tools": [{"type": "web_search"}]}, headers=auth
        )
        streamed = await client.post(
            RESPONSES,
            json={**ASK, "tools": [{"type": "file_search"}], "stream": True},
            headers=auth,
        )
        again = await client.post(RESPONSES, json=ASK, headers=auth)
        await asyncio.sleep(0.3)  # the settles run in the background
    assert text.status_code == 200, text.text
    assert again.status_code == 200, again.text
    for refused in (image, searched, streamed):
        assert refused.status_code == 429, refused.text
        assert refused.json()["error"]["code"] == "insufficient_quota"
    assert [path for path, _h, _b in fake_api.requests] == [RESPONSES] * 2  # the two texts
    spent, reserved = spend(database, "small")
    assert 0 < spent <= BUDGET_PUSD and reserved == 0
    outcomes = [(r[1], r[2], r[3]) for r in _rows(database)]
    assert outcomes[1:4] == [("budget_exhausted", 429, "small")] * 3


async def test_a_chain_whose_earlier_turns_pass_the_budget_is_refused(
    open_app: AppFactory, fake_api: FakeAPI, database: Database
) -> None:
    # 20,000 words (100,000 bytes) are reserved as 50,000 prompt tokens ($0.0075) and billed
    # 20,000 by the fake API ($0.003): the $0.009 budget holds the first turn, but not the next
    # one that carries it (another $0.0075 or more, $0.006 left). The same short turn without
    # the chain fits.
    budget = 9_000_000_000
    auth = {**_auth(database, "chain", monthly_budget_pusd=budget), **API}
    long_text = "word " * 20_000
    async with open_app() as client:
        first = await client.post(RESPONSES, json={**ASK, "input": long_text}, headers=auth)
        await asyncio.sleep(0.3)
        chained = await client.post(
            RESPONSES,
            json={**ASK, "input": "And then?", "previous_response_id": first.json()["id"]},
            headers=auth,
        )
        alone = await client.post(RESPONSES, json={**ASK, "input": "And then?"}, headers=auth)
        await asyncio.sleep(0.3)
    assert first.status_code == 200, first.text
    assert chained.status_code == 429, chained.text
    assert chained.json()["error"]["code"] == "insufficient_quota"
    assert alone.status_code == 200, alone.text
    assert fake_api.count == 2
    spent, reserved = spend(database, "chain")
    assert 0 < spent <= budget and reserved == 0


# -- the response cache --------------------------------------------------------------------------


async def _settled(client: Any) -> None:
    """Until the cache entries written in the background so far are in."""
    await client.app.state.services.quotas.written()


def _item_ids(response: dict[str, Any]) -> list[str]:
    return [item["id"] for item in response["output"]]


async def test_an_identical_request_is_answered_from_the_cache_with_ids_of_its_own(
    open_app: AppFactory, fake_api: FakeAPI, database: Database
) -> None:
    alice = {**_auth(database, "alice"), **API}
    ask = {**ASK, "temperature": 0, "metadata": {"n": "1"}}
    async with open_app(cache=CACHE) as client:
        first = await client.post(RESPONSES, json=ask, headers=alice)
        await _settled(client)
        hit = await client.post(RESPONSES, json={**ask, "metadata": {"n": "2"}}, headers=alice)
        as_items = await client.post(
            RESPONSES,
            json={**ask, "input": [{"role": "user", "content": ASK["input"]}]},
            headers=alice,
        )
        streamed = await client.post(RESPONSES, json={**ask, "stream": True}, headers=alice)
        other = await client.post(
            RESPONSES, json={**ask, "instructions": "Answer in French."}, headers=alice
        )
        warm = await client.post(RESPONSES, json={**ask, "temperature": 0.7}, headers=alice)
        stored = await client.get(f"{RESPONSES}/{hit.json()['id']}", headers=alice)
        await asyncio.sleep(0.2)
    assert first.headers["x-frugal-route"] == "api"
    assert hit.headers["x-frugal-route"] == "cache" and hit.headers["x-frugal-reason"] == "cache"
    assert as_items.headers["x-frugal-route"] == "cache"  # the same conversation, spelled out
    body, cached = first.json(), hit.json()
    assert cached["output"][0]["content"] == body["output"][0]["content"]
    assert cached["id"] != body["id"] and cached["id"].startswith("resp_")
    assert not set(_item_ids(cached)) & set(_item_ids(body))
    assert cached["metadata"] == {"n": "2"} and cached["store"] is True
    assert stored.status_code == 200 and stored.json()["id"] == cached["id"]
    assert streamed.headers["x-frugal-route"] == "cache"
    events = [json.loads(line[6:]) for line in streamed.text.splitlines() if line[:6] == "data: "]
    assert events[-1]["type"] == "response.completed"
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert other.headers["x-frugal-route"] == "api"  # other instructions: another answer
    assert warm.headers["x-frugal-route"] == "api"  # not deterministic: never cached
    assert fake_api.count == 3
    rows = [r for r in _rows(database) if r[0] == "cache"]
    assert len(rows) == 3 and all(r[1] == "cache" and r[4] == 0 for r in rows)


async def test_a_different_chain_is_a_miss_and_the_same_chain_a_hit(
    open_app: AppFactory, fake_api: FakeAPI, database: Database
) -> None:
    alice = {**_auth(database, "alice"), **API}
    ask = {**ASK, "temperature": 0}
    async with open_app(cache=CACHE) as client:
        red = await client.post(RESPONSES, json={**ask, "input": "Say red."}, headers=alice)
        blue = await client.post(RESPONSES, json={**ask, "input": "Say blue."}, headers=alice)
        await _settled(client)

        async def next_turn(previous: Any) -> Any:
            turn = {**ask, "input": "Again.", "previous_response_id": previous.json()["id"]}
            return await client.post(RESPONSES, json=turn, headers=alice)

        after_red = await next_turn(red)
        await _settled(client)
        after_blue = await next_turn(blue)
        red_again = await next_turn(red)
        alone = await client.post(RESPONSES, json={**ask, "input": "Again."}, headers=alice)
    assert after_red.headers["x-frugal-route"] == "api"
    assert after_blue.headers["x-frugal-route"] == "api"  # another conversation before it
    assert red_again.headers["x-frugal-route"] == "cache"  # the same conversation
    assert red_again.json()["previous_response_id"] == red.json()["id"]
    assert alone.headers["x-frugal-route"] == "api"  # the turn without its history
    assert fake_api.count == 5


async def test_another_keys_cached_answer_leaks_none_of_its_ids(
    open_app: AppFactory, fake_api: FakeAPI, database: Database
) -> None:
    alice = {**_auth(database, "alice"), **API}
    bob = {**_auth(database, "bob"), **API}
    ask = {**ASK, "temperature": 0, "tools": [{"type": "web_search"}]}  # an API-only answer
    async with open_app(cache={**CACHE, "shared": True}) as client:
        first = await client.post(RESPONSES, json=ask, headers=alice)
        await _settled(client)
        shared = await client.post(RESPONSES, json=ask, headers=bob)
        bobs = shared.json()["id"]
        bob_reads_his = await client.get(f"{RESPONSES}/{bobs}", headers=bob)
        alice_reads_bobs = await client.get(f"{RESPONSES}/{bobs}", headers=alice)
        bob_reads_alices = await client.get(f"{RESPONSES}/{first.json()['id']}", headers=bob)
        streamed = await client.post(RESPONSES, json={**ask, "stream": True}, headers=bob)
    assert first.headers["x-frugal-reason"] == "unsupported"
    assert shared.headers["x-frugal-route"] == "cache"
    text = shared.text
    assert first.json()["id"] not in text
    assert not any(item_id in text for item_id in _item_ids(first.json()))
    assert [i["type"] for i in shared.json()["output"]] == ["web_search_call", "message"]
    assert bob_reads_his.status_code == 200
    assert alice_reads_bobs.status_code == 404 and bob_reads_alices.status_code == 404
    assert streamed.headers["x-frugal-route"] == "cache"
    assert first.json()["id"] not in streamed.text
    assert '"type":"response.completed"' in streamed.text
    assert fake_api.count == 1


async def _ask_twice(
    client: httpx.AsyncClient, ask: dict[str, Any], headers: dict[str, str]
) -> tuple[httpx.Response, httpx.Response]:
    """The same request twice, the cache given time to store the first answer in between."""
    first = await client.post(RESPONSES, json=ask, headers=headers)
    await _settled(client)
    return first, await client.post(RESPONSES, json=ask, headers=headers)


def _assert_a_cached_copy(first: httpx.Response, hit: httpx.Response) -> None:
    """``hit`` came from the cache: ``first``'s content under an id of its own."""
    assert hit.headers["x-frugal-route"] == "cache"
    assert hit.json()["output"][0]["content"] == first.json()["output"][0]["content"]
    assert hit.json()["id"] != first.json()["id"]


async def test_a_local_answer_is_cached_for_the_next_identical_request(
    open_app: AppFactory, fake_api: FakeAPI, database: Database
) -> None:
    alice = {**_auth(database, "alice"), **LOCAL}
    ask = {**ASK, "temperature": 0, "max_output_tokens": 8}
    async with open_app(cache=CACHE) as client:
        first, hit = await _ask_twice(client, ask, alice)
    assert first.headers["x-frugal-route"] == "local", first.text
    _assert_a_cached_copy(first, hit)
    assert fake_api.count == 0


async def test_with_translate_the_api_chat_answer_is_cached_as_a_response(
    open_app: AppFactory, fake_api: FakeAPI, database: Database
) -> None:
    alice = {**_auth(database, "alice"), **API}
    ask = {**ASK, "temperature": 0}
    async with open_app(cache=CACHE, fallback={"responses": "translate"}) as client:
        first, hit = await _ask_twice(client, ask, alice)
    assert first.headers["x-frugal-route"] == "api", first.text
    _assert_a_cached_copy(first, hit)
    assert [path for path, _h, _b in fake_api.requests] == ["/v1/chat/completions"]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_a_web_search_is_charged_its_fee_from_the_price_map(
    open_app: AppFactory, fake_api: FakeAPI, database: Database, stream: bool
) -> None:
    # gpt-4o-mini's web search: $0.025 a call in litellm's map (search_context_cost_per_query);
    # the fake's answer holds one web_search_call item, as OpenAI's does after one search.
    book = PriceBook(load_price_map())
    fee = book.search_fee("gpt-4o-mini", "low")
    assert fee == 25_000_000_000
    auth = {**_auth(database, "searcher", monthly_budget_pusd=10**12), **API}
    ask = {**ASK, "tools": [{"type": "web_search", "search_context_size": "low"}]}
    async with open_app() as client:
        reply = await client.post(RESPONSES, json={**ask, "stream": stream}, headers=auth)
        text = reply.text
        await asyncio.sleep(0.3)  # the settle runs in the background
        assert await client.app.state.services.ledger.flush(10)
    assert reply.status_code == 200, text[:300]
    with access.connect(database) as conn:
        [(searches, size, prompt, completion, cost)] = list(
            conn.query(
                "SELECT web_searches, search_context_size, prompt_tokens, completion_tokens, "
                "api_cost_pusd FROM requests WHERE endpoint = 'responses'"
            )
        )
    tokens = book.cost("gpt-4o-mini", int(prompt), int(completion))
    assert tokens is not None
    assert (searches, size, cost) == (1, "low", tokens + fee)
    assert spend(database, "searcher") == (tokens + fee, 0)
