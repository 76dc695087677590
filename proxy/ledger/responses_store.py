"""Stored Responses: the ``responses`` table (``migrations/0011_responses.sql``).

A response made with ``store`` (the default) is kept here with its own input items, the key
that made it (its identity: :attr:`~proxy.ledger.tenants.keys.ClientKey.identity`) and the
``previous_response_id`` it continued. :meth:`ResponseStore.chain` walks those links back, so
the next turn can be given the whole conversation: every earlier turn's input items, then its
output items, oldest first. A link to a response deleted meanwhile ends the walk there.

:meth:`ResponseStore.prune` deletes the responses older than ``[responses] retention_days``:
the app calls it at start, and the store calls it itself at a write at most once an hour
(:data:`PRUNE_EVERY_S`), so a proxy that stores nothing does no work for it.

A bound on what a key keeps (``migrations/0012_responses_quota.sql``): each row records what it
costs its key in ``bytes`` (the UTF-8 bytes of its JSON), and :meth:`ResponseStore.put` refuses
(:class:`QuotaFull`) a row that would take its key past ``max_bytes`` or ``max_count``, in the
transaction that writes it, so two writers cannot both pass. The key's running tally lives in
``response_usage`` (``migrations/0015_responses_usage.sql``), kept in step with its rows by every
write, delete and prune, so the check costs the same however much the key has stored: ``put`` adds
to it and reads it back in one upsert, and rolls back past the quota; :meth:`ResponseStore.usage`
reads it, and ``put`` and ``delete`` return it, for the HTTP side's check before it spends anything
on a request (which keeps it in memory). An answer's output items are kept once, however many
responses carry them (a cache hit is the same answer under new ids). Each row names its answer
by the sha256 of their JSON with the item ids left blank (``output_digest``). A fresh answer is
kept inline, in its own row, which is all most responses ever need: one row, no second table.
The first cache hit of an answer moves it to ``response_outputs``, under that digest, out of the
rows that held it inline, and from then on each response that names it keeps only its own ids.
Only the row that stored an answer first counts its bytes; the last response that names an
answer takes it along when it is deleted or pruned (on PostgreSQL under a lock per answer, so
that a replica storing a response that names it and one deleting it cannot cross). A row's
answer is in ``response_outputs`` when a row there has its digest, else inline: a fresh row
written while the answer was shared already keeps its own copy, and reads the same either way.

:meth:`ResponseStore.item` finds one stored item by its id, for an ``item_reference`` input
item: among the input and output items of the responses one key keeps (its index on ``owner``
narrows the rows; a ``LIKE`` on the item's JSON id picks the few that may hold it, and those are
read to be sure). No index on item ids: what a key keeps is bounded by its quota.

A background response is leased (``migrations/0018_background_lease.sql``): ``lease_until``
says until when the process running it holds it, and ``lease_owner`` which process that is
(``host:pid``), written by :meth:`ResponseStore.put`; the holder extends it with
:meth:`ResponseStore.renew`. :meth:`ResponseStore.unfinished` lists the open ones with their
lease, and a move made with ``lapsed_at`` (a sweep's) happens only while the lease still ends
by then, so that a renewal committed first wins; which leases have lapsed is the sweeper's
judgement (``proxy/serving/background_responses.py``), so that replicas on one PostgreSQL never
fail each other's running work.

Who may read what is the HTTP side's business (``proxy/serving/responses_state.py``): this module
reads and writes rows. Blocking methods: run them in a thread; a database that is not there
raises :class:`~proxy.ledger.db.connections.Unavailable`.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from typing import Any

from proxy.ledger.db.connections import Pool, Tx
from proxy.ledger.response_outputs import hold_output, joined, named, split, to_json

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
    # a background response's lease: unix time until which its process holds it (written by
    # put, kept by renew), and that process (host:pid); None: no lease
    lease_until: float | None = None
    lease_owner: str | None = None


@dataclass(frozen=True, slots=True)
class Usage:
    """What one key keeps: how many responses, and their bytes."""

    count: int
    bytes: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Kept:
    """A response :meth:`ResponseStore.put` stored: the bytes it cost its key, and what the key
    keeps with it (read in the transaction that wrote it)."""

    cost: int
    usage: Usage


@dataclass(frozen=True, slots=True, kw_only=True)
class Freed:
    """A response :meth:`ResponseStore.delete` deleted: its key's identity, and what the key
    keeps without it."""

    owner: str | None
    usage: Usage


class QuotaFull(Exception):
    """Storing the response would take its key past its quota; nothing was written."""

    def __init__(self, usage: Usage, adding: int) -> None:
        super().__init__(f"{usage.count} responses of {usage.bytes} bytes, adding {adding}")
        self.usage = usage
        self.adding = adding


def size(value: Any) -> int:
    """The bytes ``value`` takes stored: its JSON's UTF-8 bytes."""
    return len(to_json(value).encode("utf-8"))


_COLUMNS = "id, owner, key_name, created_at, previous_id, route, response, input_items"
_READ = (
    "SELECT "
    + ", ".join(f"r.{column}" for column in _COLUMNS.split(", "))
    + ", o.output, r.lease_until, r.lease_owner FROM responses r "
    "LEFT JOIN response_outputs o ON o.digest = r.output_digest"
)


OPEN = ("queued", "in_progress")
"""A background response's statuses while it holds a lease."""
_LAPSED = " AND (lease_until IS NULL OR lease_until <= ?)"
"""A background response whose lease ends by the time given (or that has none)."""

_ORPHANS = (
    "DELETE FROM response_outputs WHERE NOT EXISTS "
    "(SELECT 1 FROM responses WHERE output_digest = response_outputs.digest)"
)


def _share(tx: Tx, output: str, digest: str) -> int:
    """Keep the answer ``output`` (``digest``) once in ``response_outputs``, for a cache hit's
    row that names it; the bytes that row pays for it.

    Kept there already: nothing. Not yet: it is written, and every row that holds it inline
    (the fresh answer it was a hit of, and any other fresh answer the same) gives up its copy
    for the shared one. The oldest of them paid for the answer and still does: its ``bytes``
    become what the shared form costs it (its own JSON, now without the answer, plus the
    answer's), the others' only their own JSON, and their keys' tallies take the change, not
    checked against a quota (a few bytes per item: the ids are kept apart from the answer).
    The hit pays nothing then, and the whole answer when no row held it. On PostgreSQL under
    the answer's lock (:func:`hold_output`)."""
    if tx.db.is_postgres:
        hold_output(tx, digest)
    size = len(output.encode("utf-8"))
    if not tx.count(
        "INSERT INTO response_outputs (digest, output, bytes) VALUES (?, ?, ?) "
        "ON CONFLICT (digest) DO NOTHING",
        (digest, output, size),
    ):
        return 0
    inline = tx.rows(
        "SELECT id, owner, response, bytes FROM responses WHERE output_digest = ? "
        "ORDER BY created_at, id",
        (digest,),
    )
    for i, (response_id, owner, text, paid) in enumerate(inline):
        stripped = to_json(split(json.loads(text))[0])
        items = int(paid) - len(str(text).encode("utf-8"))  # what its input items cost
        cost = len(stripped.encode("utf-8")) + items + (size if i == 0 else 0)
        tx.run(
            "UPDATE responses SET response = ?, bytes = ? WHERE id = ?",
            (stripped, cost, response_id),
        )
        _count(tx, owner, 0, cost - int(paid))
    return 0 if inline else size


def _stored(row: tuple[Any, ...]) -> StoredResponse:
    return StoredResponse(
        id=row[0],
        owner=row[1],
        key_name=row[2],
        created_at=float(row[3]),
        previous_id=row[4],
        route=row[5],
        response=joined(json.loads(row[6]), row[8]),
        input_items=json.loads(row[7]),
        lease_until=None if row[9] is None else float(row[9]),
        lease_owner=row[10],
    )


def _owned(owner: str | None) -> tuple[str, tuple[Any, ...]]:
    """The WHERE clause (and its values) of one key's rows; None: the keyless proxy's."""
    return ("owner IS NULL", ()) if owner is None else ("owner = ?", (owner,))


def _tally_owner(owner: str | None) -> str:
    """The key's name in ``response_usage`` (``migrations/0015_responses_usage.sql``): its
    identity, or ``""`` for the keyless proxy."""
    return "" if owner is None else owner


def _count(tx: Tx, owner: str | None, count: int, size: int) -> Usage:
    """Add ``count`` responses of ``size`` bytes (both negative for a delete) to the key's
    tally, in the transaction that writes or deletes them; the tally after it."""
    row = tx.rows(
        "INSERT INTO response_usage (owner, count, bytes) VALUES (?, ?, ?) "
        "ON CONFLICT (owner) DO UPDATE SET count = response_usage.count + excluded.count, "
        "bytes = response_usage.bytes + excluded.bytes RETURNING count, bytes",
        (_tally_owner(owner), count, size),
    )
    return Usage(count=int(row[0][0]), bytes=int(row[0][1]))


class ResponseStore:
    """``retention_days`` 0 keeps responses until they are deleted; a key keeps at most
    ``max_count`` responses of ``max_bytes`` in all (``[responses] max_stored_per_key``,
    ``max_stored_bytes_per_key``)."""

    def __init__(
        self,
        pool: Pool,
        *,
        retention_days: float,
        max_bytes: int = 2**62,
        max_count: int = 2**62,
    ) -> None:
        self.pool = pool
        self.retention_days = retention_days
        self.max_bytes = max_bytes
        self.max_count = max_count
        self._pruned_at: float | None = None
        self.prunes = 0
        """How many prunes have deleted rows: a tally read before one may be too high."""
        self._lock = threading.Lock()

    def fits(self, usage: Usage, adding: int) -> bool:
        """Whether one more response of ``adding`` bytes fits a key that keeps ``usage``."""
        return usage.count < self.max_count and usage.bytes + adding <= self.max_bytes

    def usage(self, owner: str | None) -> Usage:
        """What the key ``owner`` keeps (None: the keyless proxy)."""
        with self.pool.transaction() as tx:
            return self._usage(tx, owner)

    @staticmethod
    def _usage(tx: Tx, owner: str | None) -> Usage:
        row = tx.rows(
            "SELECT count, bytes FROM response_usage WHERE owner = ?", (_tally_owner(owner),)
        )
        return Usage(count=int(row[0][0]), bytes=int(row[0][1])) if row else Usage(0, 0)

    def put(self, stored: StoredResponse, *, now: float | None = None) -> Kept:
        """Store ``stored``; what it cost its key, and what the key keeps now. Past the key's
        quota: :class:`QuotaFull`, and nothing is written.

        A fresh answer (any route but ``cache``) is kept inline, in its own row, which names
        its answer's digest: two statements, the key's tally (added to and read back in one
        upsert; past the quota the transaction is rolled back) and the row. A cache hit's
        answer is kept once, in ``response_outputs`` (:meth:`_share`), and its row holds only
        the item ids."""
        self._prune_if_due(time.time() if now is None else now)
        shared = stored.route == "cache"
        response, output, digest = split(stored.response) if shared else named(stored.response)
        response_json, items_json = to_json(response), to_json(stored.input_items)
        cost = len(response_json.encode("utf-8")) + len(items_json.encode("utf-8"))
        with self.pool.transaction() as tx:
            if tx.db.is_postgres:  # replicas: one writer per key at a time (SQLite: the lock)
                tx.rows("SELECT pg_advisory_xact_lock(hashtext(?))", (f"responses:{stored.owner}",))
            if shared and output is not None and digest is not None:
                cost += _share(tx, output, digest)
            after = _count(tx, stored.owner, 1, cost)
            if after.count > self.max_count or after.bytes > self.max_bytes:
                raise QuotaFull(Usage(after.count - 1, after.bytes - cost), cost)  # rolled back
            tx.run(
                f"INSERT INTO responses ({_COLUMNS}, bytes, output_digest, lease_until, "
                "lease_owner) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    stored.id,
                    stored.owner,
                    stored.key_name,
                    stored.created_at,
                    stored.previous_id,
                    stored.route,
                    response_json,
                    items_json,
                    cost,
                    digest,
                    stored.lease_until,
                    stored.lease_owner,
                ),
            )
        return Kept(cost=cost, usage=after)

    def advance(
        self,
        response_id: str,
        response: dict[str, Any],
        *,
        route: str,
        only_from: tuple[str, ...],
        lapsed_at: float | None = None,
    ) -> bool:
        """A background response's next state: ``response`` (kept whole, its output inline)
        replaces the stored one, and ``route`` its route, only while the stored one's
        ``status`` is one of ``only_from`` (and, with ``lapsed_at``, only while its lease ends
        by then: a sweep's move, which a renewal that commits first stops); whether it did.
        One transaction, so a cancel and the run's own end cannot both win. The key's tally
        takes the change of bytes, not checked against its quota (the queued response was,
        when it was made)."""
        text = to_json({**response, "store": True})
        with self.pool.transaction() as tx:
            if tx.db.is_postgres:
                tx.rows("SELECT pg_advisory_xact_lock(hashtext(?))", (f"response:{response_id}",))
            rows = tx.rows(
                "SELECT response, owner, bytes, output_digest, input_items FROM responses "
                "WHERE id = ?",
                (response_id,),
            )
            if not rows or rows[0][3] is not None:  # gone, or not a background response's row
                return False
            if json.loads(rows[0][0]).get("status") not in only_from:
                return False
            cost = len(text.encode("utf-8")) + len(str(rows[0][4]).encode("utf-8"))
            lapsed, values = ("", ()) if lapsed_at is None else (_LAPSED, (lapsed_at,))
            held = "" if response.get("status") in OPEN else ", lease_until = NULL"  # ended
            moved = tx.count(
                f"UPDATE responses SET response = ?, route = ?, bytes = ?{held} "
                f"WHERE id = ?{lapsed}",
                (text, route, cost, response_id, *values),
            )
            if not moved:  # its lease was renewed meanwhile: its process is alive
                return False
            _count(tx, rows[0][1], 0, cost - int(rows[0][2]))
            return True

    def renew(self, response_ids: list[str], until: float) -> int:
        """Set the lease of the open background responses ``response_ids`` to ``until`` (a
        time past: given up, so that the next sweep fails them); how many rows it set. A
        renewal is one statement: on PostgreSQL a sweep's move of the same row waits for it,
        then finds the lease renewed (:meth:`advance`'s ``lapsed_at``)."""
        if not response_ids:
            return 0
        marks = ", ".join("?" for _ in response_ids)
        with self.pool.transaction() as tx:
            return tx.count(
                f"UPDATE responses SET lease_until = ? WHERE id IN ({marks}) "
                "AND lease_until IS NOT NULL",
                (until, *response_ids),
            )

    def unfinished(self, *, leased: bool = False) -> list[StoredResponse]:
        """The background responses still ``queued`` or ``in_progress``, with their leases:
        those running, and those a proxy that stopped or died left behind. With ``leased``,
        only those that hold a lease (a periodic sweep: the lease's index finds them); without,
        those with none as well (at start: rows older than leases, given up, or never leased)."""
        with self.pool.transaction() as tx:
            if leased:
                rows = tx.rows(f"{_READ} WHERE r.lease_until IS NOT NULL")
            else:
                rows = tx.rows(f"{_READ} WHERE r.response LIKE ?", ('%"background":true%',))
        found = [_stored(row) for row in rows]
        return [
            stored
            for stored in found
            if stored.response.get("background") is True and stored.response.get("status") in OPEN
        ]

    def get(self, response_id: str) -> StoredResponse | None:
        with self.pool.transaction() as tx:
            rows = tx.rows(f"{_READ} WHERE r.id = ?", (response_id,))
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
                rows = tx.rows(f"{_READ} WHERE r.id = ?", (at,))
                if not rows:
                    break
                found.append(_stored(rows[0]))
                at = found[-1].previous_id
        found.reverse()
        return found

    def item(self, item_id: str, owner: str | None, *, anyone: bool) -> dict[str, Any] | None:
        """The newest stored input or output item whose id is ``item_id``, among the responses
        of the key ``owner`` (None: the keyless proxy's), or of every key with ``anyone``."""
        quoted = to_json(item_id).replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        pattern = f'%"id":{quoted}%'
        where, values = ("1 = 1", ()) if anyone else _owned(owner)
        where = where.replace("owner", "r.owner")
        with self.pool.transaction() as tx:
            rows = tx.rows(
                f"{_READ} WHERE {where} AND (r.input_items LIKE ? ESCAPE '\\' "
                "OR r.response LIKE ? ESCAPE '\\') ORDER BY r.created_at DESC",
                (*values, pattern, pattern),
            )
        for row in rows:
            stored = _stored(row)
            for found in [*stored.input_items, *(stored.response.get("output") or [])]:
                if isinstance(found, dict) and found.get("id") == item_id:
                    return found
        return None

    def delete(self, response_id: str) -> Freed | None:
        """Delete the response ``response_id``; its key and what the key keeps now, or None
        when it was not stored."""
        with self.pool.transaction() as tx:
            if tx.db.is_postgres:  # the answer's lock before the row's: a cache hit that
                # moves this row's inline answer out (_share) takes them in that order
                named = tx.rows("SELECT output_digest FROM responses WHERE id = ?", (response_id,))
                if named and named[0][0] is not None:
                    hold_output(tx, str(named[0][0]))
            found = tx.rows(
                "DELETE FROM responses WHERE id = ? RETURNING output_digest, owner, bytes",
                (response_id,),
            )
            if not found:
                return None
            digest, owner, cost = found[0]
            after = _count(tx, owner, -1, -int(cost))
            if digest is not None:
                tx.run(
                    "DELETE FROM response_outputs WHERE digest = ? AND NOT EXISTS "
                    "(SELECT 1 FROM responses WHERE output_digest = ?)",
                    (digest, digest),
                )
            return Freed(owner=owner, usage=after)

    def prune(self, *, now: float | None = None) -> int:
        """Delete the responses older than ``retention_days``; how many."""
        now = time.time() if now is None else now
        self._pruned_at = now
        if self.retention_days <= 0:
            return 0
        cutoff = now - self.retention_days * _DAY_S
        with self.pool.transaction() as tx:
            rows = tx.rows(
                "DELETE FROM responses WHERE created_at < ? RETURNING owner, bytes", (cutoff,)
            )
            gone = len(rows)
            freed: dict[str | None, list[int]] = {}
            for owner, size in rows:
                tally = freed.setdefault(owner, [0, 0])
                tally[0] += 1
                tally[1] += int(size)
            for owner, (count, size) in sorted(freed.items(), key=lambda kv: kv[0] or ""):
                _count(tx, owner, -count, -size)
            if gone:
                self.prunes += 1
            if gone and tx.db.is_postgres:  # each orphan under its lock, in one order
                orphans = tx.rows(_ORPHANS.replace("DELETE", "SELECT digest", 1))
                for (digest,) in sorted(orphans):
                    hold_output(tx, digest)
                    tx.run(_ORPHANS + " AND digest = ?", (digest,))
            elif gone:
                tx.run(_ORPHANS)
            return gone

    def _prune_if_due(self, now: float) -> None:
        last = self._pruned_at
        if last is not None and now - last < PRUNE_EVERY_S:
            return  # the usual case, read without the lock
        with self._lock:
            due = self._pruned_at is None or now - self._pruned_at >= PRUNE_EVERY_S
            if due:
                self._pruned_at = now
        if due:
            self.prune(now=now)

    def count(self) -> int:
        with self.pool.transaction() as tx:
            return int(tx.rows("SELECT count(*) FROM responses")[0][0])
