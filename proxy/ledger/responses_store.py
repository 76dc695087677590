"""Stored Responses: the ``responses`` table (``migrations/0011_responses.sql``).

A response made with ``store`` (the default) is kept here with its own input items, the key
that made it (its identity: :attr:`~proxy.ledger.tenants.keys.ClientKey.identity`) and the
``previous_response_id`` it continued. :meth:`ResponseStore.chain` walks those links back, so
the next turn can be given the whole conversation: every earlier turn's input items, then its
output items, oldest first. A link to a response deleted meanwhile ends the walk there.

:meth:`ResponseStore.prune` deletes the responses older than ``[responses] retention_days``:
the app calls it at start, and the store calls it itself at a write at most once an hour
(:data:`PRUNE_EVERY_S`), so a proxy that stores nothing does no work for it.

Who may read what is the HTTP side's business (``proxy/http/responses_state.py``): this module
reads and writes rows. Blocking methods: run them in a thread; a database that is not there
raises :class:`~proxy.ledger.db.connections.Unavailable`.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from typing import Any

from proxy.ledger.db.connections import Pool

PRUNE_EVERY_S = 3600.0
MAX_CHAIN = 1000  # turns walked back at most: a loop cannot be made, but a bound costs nothing
_DAY_S = 86400.0


@dataclass(frozen=True, slots=True, kw_only=True)
class StoredResponse:
    id: str
    owner: str | None  # the making key's identity; None: the proxy ran without keys
    key_name: str | None
    created_at: float
    previous_id: str | None
    route: str
    response: dict[str, Any]
    input_items: list[dict[str, Any]]


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


_COLUMNS = "id, owner, key_name, created_at, previous_id, route, response, input_items"


def _stored(row: tuple[Any, ...]) -> StoredResponse:
    return StoredResponse(
        id=row[0],
        owner=row[1],
        key_name=row[2],
        created_at=float(row[3]),
        previous_id=row[4],
        route=row[5],
        response=json.loads(row[6]),
        input_items=json.loads(row[7]),
    )


class ResponseStore:
    """``retention_days`` 0 keeps responses until they are deleted."""

    def __init__(self, pool: Pool, *, retention_days: float) -> None:
        self.pool = pool
        self.retention_days = retention_days
        self._pruned_at: float | None = None
        self._lock = threading.Lock()

    def put(self, stored: StoredResponse, *, now: float | None = None) -> None:
        self._prune_if_due(time.time() if now is None else now)
        with self.pool.transaction() as tx:
            tx.run(
                f"INSERT INTO responses ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    stored.id,
                    stored.owner,
                    stored.key_name,
                    stored.created_at,
                    stored.previous_id,
                    stored.route,
                    _json(stored.response),
                    _json(stored.input_items),
                ),
            )

    def get(self, response_id: str) -> StoredResponse | None:
        with self.pool.transaction() as tx:
            rows = tx.rows(f"SELECT {_COLUMNS} FROM responses WHERE id = ?", (response_id,))
        return _stored(rows[0]) if rows else None

    def chain(self, response_id: str) -> list[StoredResponse]:
        """The response ``response_id`` and those it continued, oldest first; empty when it is
        not stored."""
        found: list[StoredResponse] = []
        seen: set[str] = set()
        with self.pool.transaction() as tx:
            at: str | None = response_id
            while at is not None and at not in seen and len(found) < MAX_CHAIN:
                seen.add(at)
                rows = tx.rows(f"SELECT {_COLUMNS} FROM responses WHERE id = ?", (at,))
                if not rows:
                    break
                found.append(_stored(rows[0]))
                at = found[-1].previous_id
        found.reverse()
        return found

    def delete(self, response_id: str) -> bool:
        with self.pool.transaction() as tx:
            return tx.count("DELETE FROM responses WHERE id = ?", (response_id,)) > 0

    def prune(self, *, now: float | None = None) -> int:
        """Delete the responses older than ``retention_days``; how many."""
        now = time.time() if now is None else now
        self._pruned_at = now
        if self.retention_days <= 0:
            return 0
        cutoff = now - self.retention_days * _DAY_S
        with self.pool.transaction() as tx:
            return tx.count("DELETE FROM responses WHERE created_at < ?", (cutoff,))

    def _prune_if_due(self, now: float) -> None:
        with self._lock:
            due = self._pruned_at is None or now - self._pruned_at >= PRUNE_EVERY_S
            if due:
                self._pruned_at = now
        if due:
            self.prune(now=now)

    def count(self) -> int:
        with self.pool.transaction() as tx:
            return int(tx.rows("SELECT count(*) FROM responses")[0][0])
