"""The response cache: answers to deterministic requests, kept in the ledger database.

A request is cacheable when it asks for a deterministic answer: ``temperature`` 0, or a
``seed``. Its key (:func:`cache_key`) is the SHA-256 of a canonical JSON of every field that can
change the answer (all of them but :data:`IGNORED`, which only say how the answer is delivered
or who asked), plus the model the request is routed to upstream, the local model file's hash,
and the scope: the client key's name, unless ``[cache] shared`` lets keys share answers.

Entries live ``[cache] ttl_s`` seconds; :meth:`ResponseCache.sweep` deletes the expired ones and
then the oldest beyond ``[cache] max_entries``. On PostgreSQL every replica reads the same
table. Blocking methods: run them in a thread; a database that is not there raises
:class:`~proxy.ledger.db.connections.Unavailable` (the request then simply misses).
"""

from __future__ import annotations

import hashlib
import json
import time
from typing import Any

from proxy.ledger.db.connections import Pool

# Fields that do not change the answer: how it is delivered, and who asked for it.
IGNORED = frozenset({"stream", "stream_options", "user", "metadata", "store", "service_tier"})


def cacheable(body: dict[str, Any]) -> bool:
    return body.get("temperature") == 0 or body.get("seed") is not None


def cache_key(body: dict[str, Any], *, route_model: str, model_hash: str, scope: str) -> str:
    fields = {k: v for k, v in body.items() if k not in IGNORED}
    canonical = json.dumps(
        [fields, route_model, model_hash, scope],
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
    )
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


class ResponseCache:
    def __init__(self, pool: Pool, *, ttl_s: float, max_entries: int) -> None:
        self.pool = pool
        self.ttl_s = ttl_s
        self.max_entries = max_entries

    def get(self, key: str, *, now: float | None = None) -> dict[str, Any] | None:
        now = time.time() if now is None else now
        with self.pool.transaction() as tx:
            rows = tx.rows(
                "UPDATE response_cache SET hits = hits + 1 "
                "WHERE cache_key = ? AND expires_at > ? RETURNING answer",
                (key, now),
            )
        if not rows:
            return None
        found: dict[str, Any] = json.loads(rows[0][0])
        return found

    def put(self, key: str, answer: dict[str, Any], *, now: float | None = None) -> None:
        now = time.time() if now is None else now
        text = json.dumps(answer, separators=(",", ":"), ensure_ascii=False)
        with self.pool.transaction() as tx:
            tx.run(
                "INSERT INTO response_cache (cache_key, created_at, expires_at, answer) "
                "VALUES (?, ?, ?, ?) ON CONFLICT (cache_key) DO UPDATE SET "
                "created_at = excluded.created_at, expires_at = excluded.expires_at, "
                "answer = excluded.answer",
                (key, now, now + self.ttl_s, text),
            )

    def sweep(self, *, now: float | None = None) -> int:
        """Delete expired entries, then the oldest beyond ``max_entries``; how many."""
        now = time.time() if now is None else now
        skip = "LIMIT -1 OFFSET ?" if not self.pool.db.is_postgres else "OFFSET ?"
        with self.pool.transaction() as tx:
            gone = tx.count("DELETE FROM response_cache WHERE expires_at <= ?", (now,))
            gone += tx.count(
                "DELETE FROM response_cache WHERE cache_key IN (SELECT cache_key FROM "
                f"response_cache ORDER BY created_at DESC {skip})",  # noqa: S608 - fixed text
                (self.max_entries,),
            )
        return gone

    def entries(self) -> int:
        with self.pool.transaction() as tx:
            return int(tx.rows("SELECT count(*) FROM response_cache")[0][0])
