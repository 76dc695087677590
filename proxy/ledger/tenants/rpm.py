"""Requests per minute per client key: a sliding log of the last minute, shared by replicas.

Each admitted request of a key with an ``rpm`` limit is a row of ``rate_events``. Admission
counts the key's rows of the last 60 s and adds one when there is room, in one transaction
that holds a lock for that key (a transaction-scoped advisory lock on PostgreSQL; SQLite's write
lock), so the count is exact across replicas: no window edge lets twice the limit through, as
fixed one-minute buckets would, and no replica needs its share of the limit guessed.

When the database cannot be reached, :class:`LocalWindow` keeps the same log in memory, per
replica, with the full limit: requests keep flowing (local answers are free), and the limit is
at worst the number of replicas times too loose until the database returns.
"""

from __future__ import annotations

import collections
import threading
import time

from proxy.ledger.db.connections import Pool

WINDOW_S = 60.0


class RateLimits:
    def __init__(self, pool: Pool) -> None:
        self.pool = pool

    def admit(self, key_name: str, rpm: int, *, now: float | None = None) -> float | None:
        """None when the request may go; else the seconds until the oldest request in the
        window leaves it (for ``Retry-After``)."""
        now = time.time() if now is None else now
        with self.pool.transaction() as tx:
            if self.pool.db.is_postgres:
                tx.run("SELECT pg_advisory_xact_lock(hashtext(?))", ("frugal-rpm:" + key_name,))
            (count, oldest), *_ = tx.rows(
                "SELECT count(*), min(ts) FROM rate_events WHERE key_name = ? AND ts > ?",
                (key_name, now - WINDOW_S),
            )
            if int(count) >= rpm:
                return max(0.0, float(oldest) + WINDOW_S - now)
            tx.run("INSERT INTO rate_events (key_name, ts) VALUES (?, ?)", (key_name, now))
        return None

    def sweep(self, *, now: float | None = None) -> int:
        """Forget the requests older than the window."""
        now = time.time() if now is None else now
        with self.pool.transaction() as tx:
            return tx.count("DELETE FROM rate_events WHERE ts <= ?", (now - WINDOW_S,))


class LocalWindow:
    """The same sliding log, in this process only (while the database is away)."""

    def __init__(self) -> None:
        self._log: dict[str, collections.deque[float]] = {}
        self._lock = threading.Lock()

    def admit(self, key_name: str, rpm: int, *, now: float | None = None) -> float | None:
        now = time.monotonic() if now is None else now
        with self._lock:
            log = self._log.setdefault(key_name, collections.deque())
            while log and log[0] <= now - WINDOW_S:
                log.popleft()
            if len(log) >= rpm:
                return max(0.0, log[0] + WINDOW_S - now)
            log.append(now)
        return None
