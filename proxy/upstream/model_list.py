"""The upstream's own model list, for ``GET /v1/models``: read now and then, and bounded.

Clients such as Codex CLI read ``/v1/models`` to learn what they may ask for, and the proxy
answers for any model the upstream serves, so its list says so. :class:`ModelList` reads
``GET api_base/models`` on the direct route and keeps the ids it lists:

- **cached**: a list that was read is kept :data:`FRESH_S` seconds, a failed read
  :data:`FAILED_S` (an upstream that is down is not asked again by every client that lists);
- **one read at a time**: clients that list together wait for the same read;
- **bounded**: each read takes at most :data:`READ_S` seconds in all and :data:`MAX_BYTES` of
  body; at most :data:`MAX_IDS` ids are kept, each a string of at most :data:`MAX_ID_CHARS`
  characters (longer ones, and anything that is not a string, are left out).

A read that fails (no ``api_base``, no key, a status of 300 or more, a timeout, a body too
large or not the list's JSON) gives no ids: ``/v1/models`` then lists the proxy's own names
only. The failure is logged by kind, never with the key.

Imports aiohttp and structlog only; the direct route hands it its session.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

import aiohttp
import structlog

FRESH_S = 300.0
"""How long a list that was read is served before it is read again."""
FAILED_S = 30.0
"""How long a failed read is remembered (no ids) before the upstream is asked again."""
READ_S = 5.0
"""The whole read, connection to last byte."""
MAX_BYTES = 1 << 20
"""The largest body read (OpenAI's own list is about 20 KB)."""
MAX_IDS = 1000
"""The most ids kept, in the upstream's order."""
MAX_ID_CHARS = 256

log = structlog.get_logger("frugal.upstream")

Session = Callable[[], aiohttp.ClientSession]


class TooLarge(Exception):
    """The list's body passed :data:`MAX_BYTES`."""


class ModelList:
    """The ids ``GET <url>`` lists, read through ``session()`` with ``proxy``; ``clock`` is
    ``time.monotonic`` (tests pass their own)."""

    def __init__(
        self,
        url: str,
        session: Session,
        *,
        proxy: Callable[[], str | None] = lambda: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._url = url
        self._session = session
        self._proxy = proxy
        self._clock = clock
        self._ids: list[str] = []
        self._until = 0.0  # clock time until which _ids is served without reading again
        self._lock = asyncio.Lock()
        self.reads = 0  # reads attempted (for the health and the tests)

    async def ids(self) -> list[str]:
        """The upstream's model ids, at most :data:`FRESH_S` seconds old (or none)."""
        if self._clock() < self._until:
            return list(self._ids)
        async with self._lock:
            if self._clock() >= self._until:  # not read by the client this one waited for
                self._ids, fresh = await self._read()
                self._until = self._clock() + (FRESH_S if fresh else FAILED_S)
            return list(self._ids)

    async def _read(self) -> tuple[list[str], bool]:
        self.reads += 1
        try:
            async with asyncio.timeout(READ_S):
                raw = await self._get()
            return listed_ids(json.loads(raw)), True
        except (aiohttp.ClientError, OSError, TimeoutError, TooLarge, ValueError) as exc:
            log.warning("upstream_models_unread", error=type(exc).__name__)
            return [], False

    async def _get(self) -> bytes:
        session = self._session()
        async with session.get(
            self._url,
            proxy=self._proxy(),
            allow_redirects=False,
            headers={"accept": "application/json"},
        ) as response:
            if response.status >= 300:
                raise ValueError(f"status {response.status}")
            if (response.content_length or 0) > MAX_BYTES:
                raise TooLarge
            body = bytearray()
            async for chunk in response.content.iter_chunked(64 * 1024):
                body += chunk
                if len(body) > MAX_BYTES:
                    raise TooLarge
            return bytes(body)


def listed_ids(data: Any) -> list[str]:
    """The ids of OpenAI's list shape (``{"data": [{"id": ...}, ...]}``), bounded; a body of
    another shape raises :class:`ValueError`."""
    items = data.get("data") if isinstance(data, dict) else None
    if not isinstance(items, list):
        raise ValueError("not a model list")
    ids: list[str] = []
    seen: set[str] = set()
    for item in items:
        name = item.get("id") if isinstance(item, dict) else None
        if isinstance(name, str) and 0 < len(name) <= MAX_ID_CHARS and name not in seen:
            seen.add(name)
            ids.append(name)
            if len(ids) == MAX_IDS:
                break
    return ids
