"""Every route is declared once (``proxy/server/routes.py``): the app serves each path of
``/openapi.json`` for the methods it describes, and describes each path it serves, ``/metrics``
and the dashboard included (in-process, with the real engine and the fake API on loopback)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from starlette.routing import Route

from proxy.server.routes import OPERATIONS
from tests.conftest import settings_for
from tests.fake_api import FakeAPI


async def test_every_route_served_has_its_openapi_path_and_every_path_is_served(
    tmp_path: Path, fake_api: FakeAPI, make_client: Any
) -> None:
    async with make_client(settings_for(tmp_path, fake_api)) as client:
        spec = (await client.get("/openapi.json")).json()
        served = {
            (route.path, method)
            for route in client.app.routes
            if isinstance(route, Route)
            for method in (route.methods or set()) - {"HEAD"}  # Starlette adds HEAD to a GET
        }
        metrics = await client.get("/metrics")
        page = await client.get("/dashboard")
    paths = spec["paths"]
    described = {
        (path, key.upper()) for path, item in paths.items() for key in item if key in OPERATIONS
    }
    # A ``/v1`` path is served again without ``/v1``, as OpenAI's clients use both.
    as_described = {(path if path in paths else "/v1" + path, method) for path, method in served}
    print(f"{len(served)} routes served, {len(described)} operations described")
    assert sorted(as_described - described) == [], "served, not in /openapi.json"
    assert sorted(described - as_described) == [], "in /openapi.json, not served"
    assert ("/metrics", "GET") in described and ("/dashboard/{name}", "GET") in described
    # What the new entries say is what those routes send.
    assert metrics.status_code == 200 and page.status_code == 200
    assert (
        metrics.headers["content-type"].split(";")[0]
        in paths["/metrics"]["get"]["responses"]["200"]["content"]
    )
    assert (
        page.headers["content-type"].split(";")[0]
        in paths["/dashboard"]["get"]["responses"]["200"]["content"]
    )
