"""Health probes of a remote backend: when it is used, when it is marked down, and when again.

A backend is used only after a health probe (``GET {api_base}/models``) has answered. A call
that fails to connect marks it down at once; a call that runs past twice its predicted time
(and at least 2 s more) or past its deadline triggers a probe, and a failed probe marks it down.
Marking a backend down fails its queued and running calls with
:class:`~proxy.routing.base.BackendDown`, which the pool turns into a move to another backend
that can still make the request's deadline, or into a local failure the router sends to the
API. A down backend is probed again with backoff (0.5 s doubling to 30 s) and used again once a
probe answers. No wait ever outlives the request's deadline. A server that answers wrongly (an
answer that is not JSON, a model list without the configured model, another model's answer:
:mod:`proxy.routing.remote_health`) is marked down too, with the reason in ``/healthz``.

The probes are a part of :class:`~proxy.routing.remote.RemoteBackend` (its base
:class:`Probing`), kept here apart from its calls: the attributes declared on :class:`Probing`
are the backend's, set in its ``__init__`` and ``start``.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import httpx
import structlog

from proxy.config import BackendSettings
from proxy.routing.base import BackendDown
from proxy.routing.remote_health import listing_problem
from proxy.routing.remote_kinds import Kind
from proxy.routing.remote_stream import AnswerTooLarge, read_bounded
from proxy.routing.slots import Slots

log = structlog.get_logger(__name__)

PROBE_BACKOFF_S = (0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0)
WRONG_ANSWER_PAUSE_S = 2.0  # a backend that answered wrongly is probed again after this


@dataclass
class RemoteStats:
    """What a remote backend has done, counted (kept here, beside the probes that count
    ``downs``, so that this module needs nothing of :mod:`proxy.routing.remote`)."""

    completed: int = 0
    failures: int = 0
    timeouts: int = 0
    downs: int = 0
    handed_on: int = 0
    streamed: int = 0  # live streams relayed
    streamed_pieces: int = 0  # their text pieces (about one token each) handed on


class Probing:
    """The health probes of a remote backend and its state (``probing``, ``up``, ``down`` or
    ``closed``); see the module docstring."""

    name: str
    settings: BackendSettings
    server: Kind
    state: str
    error: str | None
    last_down: str | None
    stats: RemoteStats
    _client: httpx.AsyncClient | None
    _slots: Slots
    _calls: set[asyncio.Task[Any]]
    _prober: asyncio.Task[None] | None
    _checks: set[asyncio.Task[None]]
    _hinted: bool

    def _probe_url(self) -> str:
        """``GET {api_base}/models``, or a path from the server's root for a kind whose
        ``/models`` waits behind its model lock (llama-cpp-python: ``/docs``)."""
        path = self.server.probe_path
        if not path.startswith("/"):
            return path
        root = self.settings.api_base.rstrip("/")
        root = root.removesuffix("/v1")
        return root + path

    async def probe(self) -> bool:
        """One health probe: does the kind's probe (``GET {api_base}/models``) answer in time?"""
        if self._client is None:
            return False
        try:
            # asyncio.timeout, not wait_for: on Python 3.11, wait_for can lose a cancellation
            # that arrives just as the probe's answer does, and the caller then never stops.
            async with asyncio.timeout(self.settings.probe_timeout_s):
                response = await self._get(self._probe_url())
        except (httpx.HTTPError, TimeoutError, AnswerTooLarge) as exc:
            self.error = f"health probe: {type(exc).__name__}"
            return False
        if response.status_code >= 500:
            self.error = f"health probe: HTTP {response.status_code}"
            return False
        problem = await self._listing_problem(response)
        if problem is not None:
            self.error = f"health probe: {problem}"
            return False
        self._hint_kind(response)
        return True

    async def _listing_problem(self, probe: httpx.Response) -> str | None:
        """What is wrong with the server's model list (remote_health.py): the probe's answer
        when the probe reads the list, else, for a kind that serves only the models it lists,
        the list read now."""
        if self.server.probe_path == "models":
            if probe.status_code != 200:
                return None
            return listing_problem(self.server, probe, self.settings.model)
        if not self.server.names_model or self._client is None:
            return None
        try:
            async with asyncio.timeout(self.settings.probe_timeout_s):
                response = await self._get("models")
        except (httpx.HTTPError, TimeoutError, AnswerTooLarge) as exc:
            return f"its model list: {type(exc).__name__}"
        if response.status_code != 200:
            return f"its model list: HTTP {response.status_code}"
        return listing_problem(self.server, response, self.settings.model)

    async def _get(self, url: str) -> httpx.Response:
        """``GET url``, its body read up to ``max_answer_bytes`` (else AnswerTooLarge)."""
        assert self._client is not None
        async with self._client.stream("GET", url) as response:
            raw = await read_bounded(response.aiter_bytes(), self.settings.max_answer_bytes)
        return httpx.Response(response.status_code, content=raw)

    def _hint_kind(self, response: httpx.Response) -> None:
        """Once: say so when a backend left as ``openai-compatible`` is llama-cpp-python's server,
        whose model list says ``owned_by: "me"``; its /models probe would cut its streams."""
        if self._hinted or self.settings.kind != "openai-compatible":
            return
        self._hinted = True
        try:
            owners = {m.get("owned_by") for m in response.json().get("data") or ()}
        except (ValueError, AttributeError, TypeError):
            return
        if "me" in owners:
            log.warning(
                "backend_kind_hint",
                backend=self.name,
                hint='this looks like python -m llama_cpp.server: set kind = "llama-cpp-python"',
            )

    def _probe_until_up(self, pause_s: float = 0.0) -> None:
        if self._prober is None or self._prober.done():
            self._prober = asyncio.create_task(self._probe_loop(pause_s), name=f"probe-{self.name}")

    async def _probe_loop(self, pause_s: float = 0.0) -> None:
        if pause_s > 0:
            await asyncio.sleep(pause_s)
        attempt = 0
        while self.state != "closed":
            if await self.probe() and self.state != "closed":
                if self.state in ("down", "probing"):
                    log.info("backend_up", backend=self.name, after_probes=attempt + 1)
                self.state = "up"
                self.error = None
                return
            if self.state == "probing":
                self.state = "down"
                self.last_down = self.error
                log.warning("backend_down", backend=self.name, why=self.error)
            await asyncio.sleep(PROBE_BACKOFF_S[min(attempt, len(PROBE_BACKOFF_S) - 1)])
            attempt += 1

    def mark_down(self, why: str, *, pause_s: float = 0.0) -> None:
        """Stop using the backend: fail what waits for it and what runs on it, probe again
        (after ``pause_s``: a server that answered wrongly may well pass the probe)."""
        if self.state in ("down", "closed"):
            return
        self.state = "down"
        self.error = self.last_down = why
        self.stats.downs += 1
        log.warning("backend_down", backend=self.name, why=why, queued=self._slots.waiting)
        self._slots.fail_all(lambda: BackendDown(f"backend {self.name} is down ({why})"))
        for call in list(self._calls):
            call.cancel()
        self._probe_until_up(pause_s)

    def _check_soon(self, why: str) -> None:
        """Probe now, in the background; mark the backend down if the probe fails."""

        async def check() -> None:
            if self.state == "up" and not await self.probe():
                self.mark_down(f"{why}; {self.error}" if self.error else why)

        task = asyncio.create_task(check(), name=f"check-{self.name}")
        self._checks.add(task)
        task.add_done_callback(self._checks.discard)

    async def _watch(self, expected_s: float, call: asyncio.Task[Any]) -> None:
        """Returns when the backend is found dead while ``call`` runs: after twice the call's
        predicted time (at least 2 s more), then at doubling intervals, a probe must answer.
        It also returns as soon as ``call`` is over, so that a cancellation it never received
        cannot leave it probing."""
        wait = max(2 * expected_s, expected_s + 2.0)
        while not call.done():
            await asyncio.sleep(wait)
            if self.state != "up" or call.done():
                return
            if not await self.probe():
                if not call.done():
                    self.mark_down("no answer to a health probe during a call")
                return
            wait *= 2
