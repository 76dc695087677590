"""The response cache through the app (proxy/serving/quotas.py, proxy/ledger/response_cache.py), on
SQLite and on a real PostgreSQL: a deterministic request is answered from the cache (route and
reason ``cache``, its counterfactual saved), streams get it replayed as a stream, ``Cache-Control``
opts out, and one key never gets another key's entry unless ``[cache] shared``."""

from __future__ import annotations

import asyncio
from typing import Any

from proxy.ledger.db import access
from proxy.ledger.db.location import Database
from proxy.ledger.tenants import keys
from tests.conftest import AppFactory
from tests.fake_api import FakeAPI

CHAT = "/v1/chat/completions"
ASK = {
    "model": "gpt-4o-mini",
    "temperature": 0,
    "messages": [{"role": "user", "content": "Name a colour."}],
}


CACHE = {"enabled": True, "ttl_s": 600.0, "shared": False}


def _to_api_as(db: Database, *names: str) -> list[dict[str, str]]:
    """Headers of a request sent to the API with a new key of each name."""
    return [
        {"authorization": f"Bearer {keys.create(db, name)}", "x-frugal-route": "api"}
        for name in names
    ]


async def _settled(client: Any) -> None:
    """Until the cache entries written in the background so far are in."""
    await client.app.state.services.quotas.written()


async def test_a_deterministic_request_is_answered_from_the_cache(
    open_app: AppFactory, fake_api: FakeAPI, database: Database
) -> None:
    alice, bob = _to_api_as(database, "alice", "bob")
    async with open_app(cache=CACHE) as client:
        first = await client.post(CHAT, json=ASK, headers=alice)
        await _settled(client)
        hit = await client.post(CHAT, json=ASK, headers=alice)
        stream = await client.post(CHAT, json={**ASK, "stream": True}, headers=alice)
        fresh = await client.post(CHAT, json=ASK, headers={**alice, "cache-control": "no-cache"})
        other_key = await client.post(CHAT, json=ASK, headers=bob)
        warm = await client.post(CHAT, json={**ASK, "temperature": 0.7}, headers=alice)
        await asyncio.sleep(0.2)
    assert first.headers["x-frugal-route"] == "api"
    assert hit.headers["x-frugal-route"] == "cache" and hit.headers["x-frugal-reason"] == "cache"
    assert hit.json()["choices"] == first.json()["choices"]
    assert stream.headers["x-frugal-route"] == "cache"
    assert stream.text.startswith("data: ") and stream.text.rstrip().endswith("data: [DONE]")
    assert fresh.headers["x-frugal-route"] == "api"
    assert other_key.headers["x-frugal-route"] == "api"  # never another key's entry
    assert warm.headers["x-frugal-route"] == "api"  # not deterministic: not cached
    assert fake_api.count == 4
    with access.connect(database) as conn:
        rows = conn.query(
            "SELECT route, reason, api_cost_pusd, counterfactual_cost_pusd FROM requests "
            "WHERE route = 'cache'"
        )
    assert len(rows) == 2
    assert all(r[1] == "cache" and r[2] == 0 and r[3] and r[3] > 0 for r in rows)


async def test_a_shared_cache_serves_every_key(
    open_app: AppFactory, fake_api: FakeAPI, database: Database
) -> None:
    alice, bob = _to_api_as(database, "alice", "bob")
    async with open_app(cache={**CACHE, "shared": True}) as client:
        await client.post(CHAT, json=ASK, headers=alice)
        await _settled(client)
        other_key = await client.post(CHAT, json=ASK, headers=bob)
        no_store = await client.post(CHAT, json=ASK, headers={**bob, "cache-control": "no-store"})
    assert other_key.headers["x-frugal-route"] == "cache"
    assert no_store.headers["x-frugal-route"] == "api"
    assert fake_api.count == 2


async def test_a_new_key_given_a_revoked_keys_name_never_gets_its_entries(
    open_app: AppFactory, fake_api: FakeAPI, database: Database
) -> None:
    (old,) = _to_api_as(database, "alice")
    async with open_app(cache=CACHE) as client:
        first = await client.post(CHAT, json=ASK, headers=old)
        await _settled(client)
        hit = await client.post(CHAT, json=ASK, headers=old)  # the old key's own entry
        keys.revoke(database, "alice")
        (new,) = _to_api_as(database, "alice")  # the same name, another key
        await client.app.state.services.auth.refresh()  # as the server does every second
        fresh = await client.post(CHAT, json=ASK, headers=new)
        await _settled(client)
        new_hit = await client.post(CHAT, json=ASK, headers=new)
        gone = await client.post(CHAT, json=ASK, headers=old)
    assert first.headers["x-frugal-route"] == "api"
    assert hit.headers["x-frugal-route"] == "cache"
    assert fresh.status_code == 200 and fresh.headers["x-frugal-route"] == "api"
    assert new_hit.headers["x-frugal-route"] == "cache"  # its own entry, from now on
    assert gone.status_code == 401
    assert fake_api.count == 2
