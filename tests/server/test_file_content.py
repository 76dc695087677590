"""``GET /v1/files/{file_id}/content`` streamed from the ledger database (issue 41): a large file
comes back byte for byte, read a slice at a time, so that serving it holds far less than the
file in memory, on SQLite and on PostgreSQL.

The route is driven through the app's own ASGI callable with a ``send`` that hashes each body
message and drops it (an httpx client would hold the whole answer itself), while ``tracemalloc``
records the peak of what Python allocated meanwhile, every thread included (the slices are read
in worker threads). The bound is a fifth of the file: a slice is
:data:`~proxy.ledger.batches.files.CHUNK_BYTES` (1 MiB), and the file read whole would pass it
five times over."""

from __future__ import annotations

import asyncio
import hashlib
import os
import tracemalloc
from pathlib import Path
from typing import Any

from proxy.ledger.batches.files import CHUNK_BYTES
from proxy.ledger.db.location import Database
from tests.conftest import AppFactory, ledger_settings
from tests.fake_api import FakeAPI
from tests.in_process import http_scope

SIZE = 50 * 2**20
BOUND = SIZE // 5


async def _download(app: Any, path: str) -> tuple[int, dict[str, str], int, int, str]:
    """GET ``path`` through the ASGI app: (status, headers, body messages, bytes, sha256),
    keeping no body message once it is hashed."""
    scope = http_scope("GET", path, {"host": "localhost"}, server=("localhost", 80))
    asked = asyncio.Event()
    got: dict[str, Any] = {"status": 0, "headers": {}, "messages": 0, "bytes": 0}
    digest = hashlib.sha256()

    async def receive() -> dict[str, Any]:
        if not asked.is_set():
            asked.set()
            return {"type": "http.request", "body": b"", "more_body": False}
        await asyncio.Event().wait()  # the client never leaves
        raise AssertionError("unreachable")

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            got["status"] = message["status"]
            got["headers"] = {k.decode(): v.decode() for k, v in message["headers"]}
        elif message["type"] == "http.response.body":
            body = message.get("body", b"")
            got["messages"] += 1
            got["bytes"] += len(body)
            digest.update(body)

    await app(scope, receive, send)
    return got["status"], got["headers"], got["messages"], got["bytes"], digest.hexdigest()


async def test_a_large_file_is_served_whole_with_memory_well_below_its_size(
    tmp_path: Path, fake_api: FakeAPI, make_client: AppFactory, database: Database
) -> None:
    settings = ledger_settings(tmp_path, fake_api, database, batch={"file_quota_bytes": 2 * SIZE})
    async with make_client(settings) as client:
        files = client.app.state.services.batches.files
        content = os.urandom(SIZE)
        want = hashlib.sha256(content).hexdigest()
        stored = await asyncio.to_thread(
            files.put, None, purpose="batch", filename="big.jsonl", content=content
        )
        del content
        tracemalloc.start()
        try:
            tracemalloc.reset_peak()
            status, headers, messages, size, digest = await _download(
                client.app, f"/v1/files/{stored.id}/content"
            )
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    kind = "postgres" if database.is_postgres else "sqlite"
    print(f"{kind}: {size} bytes in {messages} messages, peak {peak} bytes traced")
    assert status == 200 and headers["content-length"] == str(SIZE)
    assert (size, digest) == (SIZE, want)
    assert peak < BOUND, f"reading a {SIZE}-byte file peaked at {peak} bytes"
    assert messages >= SIZE // CHUNK_BYTES
