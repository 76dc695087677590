"""The life cycle every cascade handler shares (proxy/server/handler.py, its row written by
proxy/serving/record.py) and the typed services (proxy/serving/services.py): in-process, with the
real engine and the fake API on loopback."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from starlette.routing import Route

from proxy.server.endpoints import ENDPOINTS, both_paths
from proxy.serving.completions import CompletionsService
from proxy.serving.services import Services
from tests.conftest import settings_for
from tests.fake_api import FakeAPI
from tests.server.test_app import FACT, rows

REQUESTS = {
    "chat.completions": ("/v1/chat/completions", {"model": "gpt-4o-mini", "messages": FACT}),
    "completions": ("/v1/completions", {"model": "gpt-4o-mini", "prompt": "Paris is"}),
    "embeddings": ("/v1/embeddings", {"model": "text-embedding-3-small", "input": "Paris"}),
}


@pytest.mark.parametrize("endpoint", sorted(REQUESTS))
async def test_a_failed_upstream_call_leaves_one_row_with_its_status_code_and_attempts(
    tmp_path: Path, fake_api: FakeAPI, make_client: Any, endpoint: str
) -> None:
    fake_api.set(fail_status=429, retry_after=0)  # every attempt: 1 + max_retries = 2
    path, body = REQUESTS[endpoint]
    settings = settings_for(tmp_path, fake_api, fallback={"max_retries": 1})
    async with make_client(settings) as client:
        r = await client.post(path, json=body, headers={"x-frugal-route": "api"})
    assert r.status_code == 429, r.text
    error = r.json()["error"]
    assert fake_api.count == 2
    [row] = rows(tmp_path / "ledger.db")
    assert (row["endpoint"], row["route"], row["status"]) == (endpoint, "api", 429)
    assert row["error"] == (error["code"] or error["type"])
    assert row["upstream_attempts"] == 2 and row["api_ms"] > 0
    assert r.headers["x-request-id"] == row["request_id"]


async def test_the_services_are_one_frozen_object_the_handlers_share(
    tmp_path: Path, fake_api: FakeAPI, make_client: Any
) -> None:
    async with make_client(settings_for(tmp_path, fake_api)) as client:
        services = client.app.state.services
        assert isinstance(services, Services)
        chat, embeddings = _handler_at(client.app, "chat"), _handler_at(client.app, "embeddings")
        assert chat.services is services and embeddings.services is services
        completions = _handler_at(client.app, "completions")
        assert isinstance(completions, CompletionsService)
        assert completions.services is services
        with pytest.raises(dataclasses.FrozenInstanceError):
            services.router = None
        r = await client.get("/metrics")
    assert r.status_code == 200 and "frugal_in_flight_requests" in r.text


def _handler_at(app: Any, name: str) -> Any:
    """The handler that the route of endpoint ``name`` hands its requests to (both its paths,
    with and without ``/v1``, hand them to the same one)."""
    [endpoint] = [e for e in ENDPOINTS if e.name == name]
    found = {
        route.endpoint.__self__.handler
        for route in app.routes
        if isinstance(route, Route) and route.path in both_paths(endpoint.path)
    }
    assert len(found) == 1, found
    return found.pop()
