"""Fair shares between client keys (proxy/server/shares.py), in-process, with the fake API on
loopback: a key holds at most its share of ``[server] max_concurrency``, never every slot, and
its next request is refused (429) before a byte of its body is read; its rpm is counted from the
headers too; a request without a good key is refused (401) without taking a slot.

Bodies that stall are async generators held on an event, so a test knows exactly which bodies
were read: a refusal "before the body" is one whose generator never started. Every stalled
request is released at the end and must then be answered."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from proxy.ledger.tenants import keys
from tests.conftest import settings_for
from tests.fake_api import FakeAPI

ENV = "FRUGAL_TEST_SHARE_KEYS"
HOG = "hog-" + "h" * 24
OTHER = "other-" + "o" * 24
CAROL = "carol-" + "c" * 24
ASK = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "Say hi."}]}
URL = "/v1/chat/completions"


def _headers(key: str) -> dict[str, str]:
    return {
        "authorization": f"Bearer {key}",
        "content-type": "application/json",
        "x-frugal-route": "api",
    }


class StalledBody:
    """A request body that sends its first bytes, then waits for ``release``."""

    def __init__(self, release: asyncio.Event) -> None:
        self.release = release
        self.started = False  # whether anyone asked for a byte of it

    async def __aiter__(self) -> AsyncIterator[bytes]:
        self.started = True
        data = json.dumps(ASK).encode()
        yield data[:10]
        await self.release.wait()
        yield data[10:]


class Client:
    """The in-process app, and requests whose bodies stall until :meth:`release`."""

    def __init__(self, http: httpx.AsyncClient) -> None:
        self.http = http
        self.services = http.app.state.services  # type: ignore[attr-defined]
        self.gate = asyncio.Event()
        self.stalled: list[asyncio.Task[httpx.Response]] = []

    def stall(self, key: str) -> StalledBody:
        body = StalledBody(self.gate)
        self.stalled.append(
            asyncio.create_task(self.http.post(URL, content=body, headers=_headers(key)))
        )
        return body

    async def held(self, count: int) -> None:
        """Wait until ``count`` requests are in flight (their bodies being read)."""
        for _ in range(2000):
            if self.services.in_flight.count >= count:
                return
            await asyncio.sleep(0.01)
        raise AssertionError(f"{self.services.in_flight.count} in flight, not {count}")

    async def refused(self, key: str) -> tuple[httpx.Response, StalledBody]:
        """A request whose body would stall for good: its answer, and whether it was read."""
        body = StalledBody(asyncio.Event())  # never released
        response = await asyncio.wait_for(
            self.http.post(URL, content=body, headers=_headers(key)), timeout=60
        )
        return response, body

    async def release(self) -> list[int]:
        self.gate.set()
        return [r.status_code for r in await asyncio.gather(*self.stalled)]


def _settings(tmp_path: Path, api: FakeAPI, **server: Any) -> Any:
    return settings_for(
        tmp_path, api, server={"api_keys_env": ENV, "body_timeout_s": 60.0, **server}
    )


@pytest.fixture
def keyed_app(
    tmp_path: Path, fake_api: FakeAPI, make_client: Any, monkeypatch: pytest.MonkeyPatch
) -> Callable[..., Any]:
    """``async with keyed_app(env_keys, **server) as client``: the app, as a :class:`Client`,
    with ``server`` in its [server] section and ``env_keys`` (if given) as its keys from the
    environment, besides those in the ledger."""

    @asynccontextmanager
    async def open_(env_keys: str | None = None, **server: Any) -> AsyncIterator[Client]:
        if env_keys is not None:
            monkeypatch.setenv(ENV, env_keys)
        async with make_client(_settings(tmp_path, fake_api, **server)) as http:
            yield Client(http)

    return open_


def _assert_share_429(response: httpx.Response, body: StalledBody, name: str) -> None:
    assert response.status_code == 429, response.text
    error = response.json()["error"]
    assert (error["type"], error["code"]) == ("requests", "rate_limit_exceeded")
    assert f"the key {name!r} holds its share" in error["message"]
    assert response.headers["retry-after"] == "1"
    assert response.headers["connection"] == "close"  # the unread body is not waited for
    assert not body.started, "the body was read before the refusal"


async def test_a_key_holds_at_most_its_share_and_its_next_request_is_refused_before_its_body(
    tmp_path: Path, fake_api: FakeAPI, keyed_app: Callable[..., Any]
) -> None:
    async with keyed_app(f"hog:{HOG},other:{OTHER}", max_concurrency=8) as client:
        http = client.http
        for _ in range(2):  # the default share: a quarter of 8
            client.stall(HOG)
        await client.held(2)
        third, third_body = await client.refused(HOG)
        other = await http.post(URL, json=ASK, headers=_headers(OTHER))
        in_flight = client.services.in_flight.count
        statuses = await client.release()
        again = await http.post(URL, json=ASK, headers=_headers(HOG))  # its share is back
    _assert_share_429(third, third_body, "hog")
    assert "(2 in flight at once" in third.json()["error"]["message"]
    assert other.status_code == 200, other.text
    assert in_flight == 2
    assert statuses == [200, 200]
    assert again.status_code == 200
    assert fake_api.count == 4  # the two released, the other key's, and the one after


async def test_a_key_never_holds_every_slot_whatever_share_it_was_given(
    tmp_path: Path, fake_api: FakeAPI, keyed_app: Callable[..., Any]
) -> None:
    db = tmp_path / "ledger.db"
    big = keys.create(str(db), "big", max_concurrency=100)
    async with keyed_app(
        f"carol;max_concurrency=1:{CAROL},other:{OTHER}", max_concurrency=4
    ) as client:
        http = client.http
        for _ in range(3):  # 100 asked for, held to max_concurrency - 1
            client.stall(big)
        await client.held(3)
        fourth, fourth_body = await client.refused(big)
        other = await http.post(URL, json=ASK, headers=_headers(OTHER))  # the slot left
        statuses = await client.release()
        client.gate = asyncio.Event()
        client.stalled = []
        client.stall(CAROL)  # a key of the environment, with its own share of 1
        await client.held(1)
        second, second_body = await client.refused(CAROL)
        statuses += await client.release()
    _assert_share_429(fourth, fourth_body, "big")
    assert "(3 in flight at once" in fourth.json()["error"]["message"]
    assert other.status_code == 200, other.text
    _assert_share_429(second, second_body, "carol")
    assert statuses == [200] * 4


async def test_a_request_without_a_good_key_is_refused_without_taking_a_slot(
    tmp_path: Path, fake_api: FakeAPI, keyed_app: Callable[..., Any]
) -> None:
    async with keyed_app(f"hog:{HOG},other:{OTHER}", max_concurrency=2) as client:
        http = client.http
        client.stall(HOG)  # a share of 1: one slot of 2 held
        await client.held(1)
        strangers = [await client.refused("wrong-" + "w" * 24) for _ in range(5)]
        keyless = await asyncio.wait_for(
            http.post(
                URL,
                content=StalledBody(asyncio.Event()),
                headers={"content-type": "application/json"},
            ),
            timeout=60,
        )
        in_flight = client.services.in_flight.count
        other = await http.post(URL, json=ASK, headers=_headers(OTHER))  # the last slot
        statuses = await client.release()
    for response, body in strangers:
        assert response.status_code == 401 and response.headers["connection"] == "close"
        assert response.json()["error"]["code"] == "invalid_api_key"
        assert not body.started
    assert keyless.status_code == 401
    assert in_flight == 1
    assert other.status_code == 200, other.text
    assert statuses == [200]


async def test_the_keys_rpm_is_counted_before_its_body_is_read(
    tmp_path: Path, fake_api: FakeAPI, keyed_app: Callable[..., Any]
) -> None:
    db = tmp_path / "ledger.db"
    limited = keys.create(str(db), "limited", rpm=1)
    async with keyed_app() as client:
        http = client.http
        first = await http.post(URL, json=ASK, headers=_headers(limited))
        second, body = await client.refused(limited)
        in_flight = client.services.in_flight.count
    assert first.status_code == 200, first.text
    assert second.status_code == 429, second.text
    error = second.json()["error"]
    assert error["code"] == "rate_limit_exceeded" and "1 requests per minute" in error["message"]
    assert int(second.headers["retry-after"]) >= 1
    assert second.headers["connection"] == "close"
    assert not body.started, "the body was read before the rpm refusal"
    assert in_flight == 0
    assert fake_api.count == 1
