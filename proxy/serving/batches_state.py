"""Files and batches as a running app keeps them: the ledger database's
:class:`~proxy.ledger.batches.files.FileStore` and :class:`~proxy.ledger.batches.store.BatchStore`
on a pool of their own, their upkeep, and who may read which.

The stores' methods block; :meth:`BatchesState.call` runs one in a worker thread, and turns a
database that is away into a 503 (:class:`~proxy.errors.StoreUnavailable`) rather than a 500.
Every :data:`SWEEP_S` seconds a background task deletes the files whose ``expires_after`` has
passed (:meth:`FileStore.sweep`) and ends the batches whose window has passed
(:meth:`BatchStore.expire`); a pass that fails is logged and tried again at the next.

Ownership: a file or a batch belongs to the key that made it (its identity; None in keyless
mode). :meth:`BatchesState.visible_file` and :meth:`BatchesState.visible_batch` hand a caller
what it may read: its own, or anything for an admin key and the keyless proxy
(:func:`~proxy.serving.clients.own_key`). Another key's file or batch is a 404 naming the id,
the same answer as one that is not there, so that a key cannot learn which ids exist.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

import structlog

from proxy.config import Settings
from proxy.errors import NotFound, StoreUnavailable
from proxy.ledger.batches.files import FileStore
from proxy.ledger.batches.objects import Batch, StoredFile
from proxy.ledger.batches.store import BatchStore
from proxy.ledger.db.connections import Pool, Unavailable
from proxy.ledger.db.location import Database
from proxy.ledger.pricing import PriceBook
from proxy.serving.background import stop_task
from proxy.serving.clients import Caller, own_key

log = structlog.get_logger("frugal.batches")

SWEEP_S = 60.0  # between two passes of the files' sweep and the batches' expiry
T = TypeVar("T")


def creator(request: Caller) -> str | None:
    """The identity a new file or batch is kept under: the caller's key (an admin key's too),
    or None on a keyless proxy."""
    key = request.scope.get("state", {}).get("client_key")
    return None if key is None else str(key.identity)


def may_read(request: Caller, owner: str | None) -> bool:
    """Whether the caller may read what ``owner`` made: its own, or anything for an admin key
    and the keyless proxy."""
    key = own_key(request.scope)
    return key is None or owner == key.identity


class BatchesState:
    def __init__(self, settings: Settings, db: Database, prices: PriceBook) -> None:
        self.pool = Pool(db, size=2, timeout_s=3.0)
        self.files = FileStore(self.pool, quota_bytes=settings.batch.file_quota_bytes)
        self.batches = BatchStore(self.pool, prices=prices)
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._upkeep(), name="batches-upkeep")

    async def stop(self) -> None:
        await stop_task(self._task)
        self._task = None
        await asyncio.to_thread(self.pool.close)

    async def upkeep_once(self) -> tuple[int, int]:
        """One pass: (files swept, batches expired)."""
        swept = await asyncio.to_thread(self.files.sweep)
        expired = await asyncio.to_thread(self.batches.expire)
        return swept, len(expired)

    async def _upkeep(self) -> None:
        while True:
            try:
                swept, expired = await self.upkeep_once()
            except Unavailable as exc:
                log.warning("batches_upkeep_failed", reason=str(exc))
            else:
                if swept or expired:
                    log.info("batches_upkeep", files_swept=swept, batches_expired=expired)
            await asyncio.sleep(SWEEP_S)

    async def call(self, method: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """A store's blocking ``method`` run in a thread; the database away is a 503."""
        try:
            return await asyncio.to_thread(method, *args, **kwargs)
        except Unavailable as exc:
            raise StoreUnavailable(
                "The files and batches store is unavailable; retry shortly."
            ) from exc

    async def visible_file(self, request: Caller, file_id: str) -> StoredFile:
        found = await self.call(self.files.get, file_id)
        if found is None or not may_read(request, found.owner):
            raise NotFound(f"No such File object: {file_id}", param="file_id")
        return found

    async def visible_batch(self, request: Caller, batch_id: str) -> Batch:
        found = await self.call(self.batches.get, batch_id)
        if found is None or not may_read(request, found.owner):
            raise NotFound(f"No batch found with id '{batch_id}'.", param="batch_id")
        return found
