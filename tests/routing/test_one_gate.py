"""One quality gate for every local answer: the bundled engine's, scored in its worker, and a
remote backend's, scored in the proxy (``proxy.engine.gate``). The same answer to the same
request gets the same verdict from both, signal by signal.

The remote is a stand-in server on loopback (``tests/stand_in_servers.py``), or for a legacy
completion ``httpx.MockTransport``, that answers with exactly what the shared engine answered.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from proxy import config
from proxy.engine.local_engine import LocalEngine
from proxy.routing.pool import engine_gate
from proxy.routing.remote import RemoteBackend
from tests.conftest import settings_for
from tests.fake_api import FakeAPI
from tests.load_factor import settle
from tests.stand_in_servers import StandIn

ACCEPT_ANY = {"x-frugal-min-quality": "0"}
REQUESTS = [
    {
        "model": "gpt-4o-mini",
        "messages": [{"role": "user", "content": "What is the capital of France?"}],
        "max_tokens": 24,
        "temperature": 0,
    },
    {  # cut by max_tokens: the stop cause is part of the verdict
        "model": "gpt-4o-mini",
        "messages": [{"role": "user", "content": "Write a long story about a dragon."}],
        "max_tokens": 12,
        "temperature": 0,
    },
]


def as_served(completion: dict[str, Any]) -> str:
    """The engine's answer as a remote server would send it: no ``frugal`` block."""
    return json.dumps({k: v for k, v in completion.items() if k != "frugal"})


async def remote_of(client: Any) -> RemoteBackend:
    pool = client.app.state.services.router.pool
    backend: RemoteBackend = next(b for b in pool.backends if b.name == "twin")
    await settle(lambda: backend.state == "up", "backend twin up", every_s=0.05)
    return backend


@pytest.mark.parametrize("request_body", REQUESTS, ids=["short", "cut"])
async def test_the_same_answer_gets_the_same_score_from_the_engine_and_a_backend(
    tmp_path: Path,
    fake_api: FakeAPI,
    make_client: Callable[..., Any],
    engine: LocalEngine,
    request_body: dict[str, Any],
) -> None:
    own = await engine.chat(dict(request_body), deadline=time.monotonic() + 60)
    engine_verdict = own["frugal"]["quality"]
    assert engine_verdict["value"] is not None
    with StandIn("openai-compatible") as twin:
        twin.chat_body = as_served(own)
        entry = {"name": "twin", "api_base": twin.url, "prefill_tok_s": 1e6, "decode_tok_s": 1e6}
        s = settings_for(tmp_path, fake_api, local={"backends": [entry]})
        async with make_client(s) as client:
            backend = await remote_of(client)
            # the backend's own path: the pool gave it the engine's gate
            answer = await backend.chat(dict(request_body), deadline=time.monotonic() + 30)
            # and through the proxy, decided by the router on that score
            r = await client.post("/v1/chat/completions", json=request_body, headers=ACCEPT_ANY)
    remote_verdict = answer["frugal"]["quality"]
    assert answer["frugal"]["backend"] == "twin"
    assert answer["choices"][0]["message"] == own["choices"][0]["message"]
    assert answer["frugal"]["stop_cause"] == own["frugal"]["stop_cause"]
    assert remote_verdict == engine_verdict
    if engine.health().get("relevance", {}).get("enabled"):
        # the relevance signal needs the embedding model: loaded for the backend's gate too
        assert "relevance" in remote_verdict["signals"]
    assert r.status_code == 200 and r.headers["x-frugal-route"] == "local"
    assert float(r.headers["x-frugal-quality"]) == pytest.approx(engine_verdict["value"], abs=5e-4)
    conn = sqlite3.connect(tmp_path / "ledger.db")
    try:
        [(backend_name, quality)] = conn.execute("SELECT backend, quality FROM requests")
    finally:
        conn.close()
    assert backend_name == "twin" and quality == pytest.approx(engine_verdict["value"])


async def test_a_legacy_completion_gets_the_same_score_from_the_engine_and_a_backend(
    engine: LocalEngine,
) -> None:
    body = {"model": "gpt-4o-mini", "prompt": "The capital of France is", "max_tokens": 8}
    own = await engine.chat(
        {**body, "temperature": 0}, deadline=time.monotonic() + 60, kind="complete"
    )
    assert own["object"] == "text_completion" and own["frugal"]["quality"]["value"] is not None
    paths: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        paths.append(request.url.path)
        if request.url.path.endswith("/models"):
            return httpx.Response(200, json={"object": "list", "data": []})
        return httpx.Response(200, text=as_served(own))

    backend = RemoteBackend(
        config.BackendSettings(name="twin", api_base="http://twin.test/v1"),
        timeout_s=30.0,
        default_max_tokens=512,
        prior=lambda: engine.rates,
        transport=httpx.MockTransport(handler),
        gate=await asyncio.to_thread(engine_gate, engine),  # as the pool loads it
    )
    await backend.start()
    try:
        await settle(lambda: backend.state == "up", "the backend up", every_s=0.01)
        answer = await backend.chat(
            {**body, "temperature": 0}, deadline=time.monotonic() + 30, kind="complete"
        )
    finally:
        await backend.close()
    assert paths[-1] == "/v1/completions"
    assert answer["choices"][0]["text"] == own["choices"][0]["text"]
    assert answer["frugal"]["stop_cause"] == own["frugal"]["stop_cause"]
    assert answer["frugal"]["quality"] == own["frugal"]["quality"]
