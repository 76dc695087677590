"""The app in process: ``create_app`` with its lifespan running, and an httpx client on it through
``httpx.ASGITransport``, no socket between them. The ``make_client`` fixture, the tests that bring
their own engine, and the benchmarks that time the app without HTTP all open it here.
:func:`http_scope` is the scope of one request for a test that drives ``client.app`` itself, with
its own ``receive`` and ``send``."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import httpx
import openai

from proxy.server.app import create_app


@asynccontextmanager
async def in_process(
    settings: Any, engine: Any = None, *, timeout_s: float = 60.0
) -> AsyncIterator[httpx.AsyncClient]:
    """A client on ``create_app(settings, engine=engine)`` for the block (no ``engine``: the app
    starts its own); ``client.app`` is the app."""
    app = create_app(settings, engine=engine)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(
            transport=transport, base_url="http://localhost", timeout=timeout_s
        ) as client:
            client.app = app  # type: ignore[attr-defined]
            yield client


def openai_on(http: httpx.AsyncClient) -> openai.AsyncOpenAI:
    """The official SDK on an :func:`in_process` client (no retries: a test sees each answer)."""
    return openai.AsyncOpenAI(
        api_key="sk-unused", base_url="http://localhost/v1", http_client=http, max_retries=0
    )


def http_scope(
    method: str,
    path: str,
    headers: Mapping[str, str],
    *,
    server: tuple[str, int] = ("127.0.0.1", 80),
) -> dict[str, Any]:
    """The ASGI scope of one HTTP/1.1 request, ``method`` ``path`` (no query) with ``headers``,
    from a loopback client to ``server``."""
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(k.encode(), v.encode()) for k, v in headers.items()],
        "client": ("127.0.0.1", 50000),
        "server": server,
        "state": {},
    }
