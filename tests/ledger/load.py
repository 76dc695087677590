"""Clients that load a real ``frugal serve`` with forced-API chat requests, each with its own id
(the ledger tests under load, ``bench/ledger_load.py`` and ``bench/ledger_kill9.py``).

A test that needs so many answers waits for them (:meth:`Load.answered`) rather than for a fixed
time: on a busy machine the same seconds hold fewer answers."""

from __future__ import annotations

import asyncio
import time

import httpx

from tests.load_factor import CEILING_S, scaled

QUESTION = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]


class Load:
    """``clients`` clients sending back-to-back requests with ``x-frugal-route: api``;
    ``completed`` holds (id, wall time the whole response had arrived), ``sent`` every id a
    request went out with, ``errors`` the requests that failed or were not a 200."""

    def __init__(self, base: str, clients: int = 32) -> None:
        self.base = base
        self.clients = clients
        self.sent: list[str] = []
        self.completed: list[tuple[str, float]] = []
        self.errors = 0
        self.stop = asyncio.Event()

    async def run(self, seconds: float | None) -> None:
        """Run until ``seconds`` have passed, or (``None``) until :attr:`stop` is set."""
        limits = httpx.Limits(max_connections=self.clients)
        timeout = scaled(60)
        async with httpx.AsyncClient(base_url=self.base, limits=limits, timeout=timeout) as http:
            workers = [asyncio.create_task(self._client(http, n)) for n in range(self.clients)]
            if seconds is not None:
                await asyncio.sleep(seconds)
                self.stop.set()
            await asyncio.gather(*workers)

    async def answered(self, count: int, ceiling_s: float = CEILING_S) -> None:
        """Wait (while :meth:`run` runs) until ``count`` responses have arrived; an
        AssertionError if ``ceiling_s`` passes first."""
        deadline = time.monotonic() + ceiling_s
        while len(self.completed) < count:
            if time.monotonic() > deadline:
                raise AssertionError(f"{len(self.completed)} of {count} answers in {ceiling_s:g} s")
            await asyncio.sleep(0.05)

    async def _client(self, http: httpx.AsyncClient, n: int) -> None:
        i = 0
        while not self.stop.is_set():
            request_id = f"c{n:02d}-{i:07d}"
            i += 1
            self.sent.append(request_id)
            try:
                r = await http.post(
                    "/v1/chat/completions",
                    json={"model": "gpt-4o-mini", "messages": QUESTION, "max_tokens": 8},
                    headers={"x-frugal-route": "api", "x-request-id": request_id},
                )
                await r.aread()
            except httpx.HTTPError:
                self.errors += 1
                if self.stop.is_set():
                    return
                continue
            if r.status_code != 200:
                self.errors += 1
            self.completed.append((request_id, time.time()))
