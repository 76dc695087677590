"""Batches and their lines in the ledger database: made from an input file, claimed by workers
through the database, finished once each, billed once each.

**A batch's life.** :meth:`BatchStore.create` reads the input file into its lines, then makes
the batch and its lines in one transaction: a good file gives an ``in_progress`` batch with one
``batch_lines`` row per line, a bad one a ``failed`` batch whose ``errors`` name each bad line
(:mod:`proxy.ledger.batches.input_file`) and no line at all. :meth:`BatchStore.cancel` moves it
to ``cancelling`` and its lines not yet running to ``cancelled`` (in its error file as
``batch_cancelled``, counted failed, once the batch is ``cancelled``); :meth:`BatchStore.expire`
ends the batches whose window has passed, their unfinished lines in the error file as
``batch_expired``. The transaction that finishes a batch's last line also ends the batch
(:mod:`proxy.ledger.batches.outputs`). Every move is checked against
:data:`~proxy.ledger.batches.objects.MOVES` and made with ``WHERE status = <the one read>``, so a
move that is not legal, or that another replica made first, is never made twice.
``request_counts`` are the batch row's ``total``, ``completed`` and ``failed``, raised in the
transaction that finishes each line, so they always equal what the lines say.

**Claiming work.** :meth:`BatchStore.claim` hands a worker up to ``n`` lines that are pending,
or whose claim's lease has passed (their worker died: ``kill -9``, a lost replica), oldest
first, and marks them claimed by that worker until ``now + lease_s``. On PostgreSQL the lines are
picked with ``SELECT … FOR UPDATE SKIP LOCKED``, so replicas claiming at once each get other
lines, and none waits for another; on SQLite the pick and the mark are one write transaction.
A worker that runs long keeps its lines with :meth:`BatchStore.renew`; one that yields its slot
to an interactive request gives them back with :meth:`BatchStore.release`. Lines for the
upstream's own Batch API are marked with :meth:`BatchStore.defer_to_api` (no lease: they wait
for that batch, and :mod:`~proxy.ledger.batches.handover` hands them over once their worker is
gone). A deferred or finished line keeps its worker's name: which process ran it, or sent it.

On PostgreSQL every transaction that writes a batch and its lines (finish, cancel, expire)
locks the batch row first, then its lines, so none can wait on another in a cycle; a claim
locks lines only, skipping those locked.

**Exactly once.** :meth:`BatchStore.finish` writes a line's result only while the line is
claimed or deferred, and marks it done in the same statement: a second finish of the line (a
worker whose lease passed and whose line another finished, a result downloaded twice) is
refused with :class:`AlreadyFinished`, and the first result stands. The line's ledger row is
written **in that same transaction**, with the line's id as its request id, instead of being
handed to the batched writer (:class:`~proxy.ledger.writing.writer.Ledger`): a crash either
keeps both the result and the row, or neither, and then the line is claimed again and run once
more (for nothing, when it ran locally). Queuing the row to the writer after the result was
committed could lose it to a ``kill -9`` in between (the writer's window), and writing it
first could bill a line that is then run again; a unique request id would stop the second row,
but only by the writer rejecting it into its spill file. One transaction needs neither. The row's
costs are computed as the writer computes them (:func:`proxy.ledger.writing.rows.row_values`);
a local line's counterfactual count, if the caller has it, is passed in, since no later
update follows.

Blocking methods, like every store of the ledger: run them in a thread. A database that is not
there raises :class:`~proxy.ledger.db.connections.Unavailable`.
"""

from __future__ import annotations

import dataclasses
import secrets
import time
from typing import Any

from proxy.errors import BadRequest, NotFound
from proxy.ledger.batches.files import owner_key, read_content, read_file
from proxy.ledger.batches.input_file import read_lines
from proxy.ledger.batches.objects import (
    ENDPOINTS,
    MAX_BATCH_FILE_BYTES,
    MAX_LINES,
    WINDOW_S,
    Batch,
    Line,
    LineResult,
    may_move,
)
from proxy.ledger.batches.outputs import (
    abandon_lines,
    drop_idle_lines,
    end_expired,
    open_lines,
    settle,
)
from proxy.ledger.batches.records import (
    BATCH_COLUMNS,
    LINE_COLUMNS,
    batch_of,
    check_metadata,
    insert_many,
    insert_row,
    line_of,
    lines_by_upstream,
    lock_batch_of,
    marks,
    to_json,
)
from proxy.ledger.db.connections import Pool, Tx
from proxy.ledger.pricing import PriceBook
from proxy.ledger.writing.ledger_row import LedgerRow

MAX_LIST = 100  # OpenAI's most batches in one page


class AlreadyFinished(Exception):
    """The line has its result already (or was cancelled, or is not claimed): nothing was
    written, and the first result stands."""


@dataclasses.dataclass(eq=False)  # a store is told apart by identity
class BatchStore:
    """``prices`` prices the ledger rows :meth:`finish` writes (the writer's own book);
    ``max_file_bytes``, ``max_lines``: OpenAI's limits on an input file; ``lease_s``: a deferred
    line's lease (:mod:`~proxy.ledger.batches.handover`)."""

    pool: Pool
    _: dataclasses.KW_ONLY
    prices: PriceBook | None = None
    max_file_bytes: int = MAX_BATCH_FILE_BYTES
    max_lines: int = MAX_LINES
    lease_s: float | None = None

    # -- batches ---------------------------------------------------------------------------

    def create(
        self,
        owner: str | None,
        *,
        input_file_id: str,
        endpoint: str,
        completion_window: str = "24h",
        metadata: Any = None,
        now: float | None = None,
    ) -> Batch:
        """Make a batch of the key's input file: ``in_progress`` with its lines, or ``failed``
        with the file's ``errors``. The file is read and checked between two transactions, and
        the batch and its lines written in the second, so that the write lock is held only for
        the inserts. A bad parameter is a 400 naming it; an input file the key
        does not have is a 404 naming ``input_file_id``."""
        if endpoint not in ENDPOINTS:
            raise BadRequest(f"endpoint must be one of {', '.join(ENDPOINTS)}.", param="endpoint")
        if completion_window not in WINDOW_S:
            raise BadRequest(
                f"completion_window must be one of {', '.join(WINDOW_S)}.",
                param="completion_window",
            )
        kept = check_metadata(metadata)
        at = int(time.time() if now is None else now)
        key = owner_key(owner)
        batch_id = f"batch_{secrets.token_hex(12)}"
        with self.pool.transaction() as tx:
            found = read_file(tx, input_file_id)
            content = read_content(tx, input_file_id) or b""
        if found is None or owner_key(found.owner) != key:
            raise NotFound(f"No file {input_file_id!r}.", param="input_file_id")
        if found.purpose != "batch":
            raise BadRequest(
                f"The file {input_file_id!r} has purpose {found.purpose!r}; a batch's input "
                'file must have purpose "batch".',
                param="input_file_id",
            )
        # Read and checked outside the write: on SQLite the write lock is everyone's.
        lines, errors = read_lines(
            content, endpoint, max_lines=self.max_lines, max_bytes=self.max_file_bytes
        )
        rows = [
            (
                f"batch_req_{secrets.token_hex(12)}",
                batch_id,
                i,
                line.custom_id,
                line.method,
                line.url,
                to_json(line.body),
            )
            for i, line in enumerate(lines)
        ]
        with self.pool.transaction() as tx:
            status = "failed" if errors else "in_progress"
            tx.run(
                "INSERT INTO batches (id, owner, endpoint, input_file_id, completion_window, "
                "status, created_at, in_progress_at, failed_at, expires_at, total, errors, "
                "metadata) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    batch_id,
                    key,
                    endpoint,
                    input_file_id,
                    completion_window,
                    status,
                    at,
                    None if errors else at,
                    at if errors else None,
                    at + WINDOW_S[completion_window],
                    len(lines),
                    to_json(errors) if errors else None,
                    None if kept is None else to_json(kept),
                ),
            )
            insert_many(
                tx,
                "INSERT INTO batch_lines (id, batch_id, idx, custom_id, method, url, body) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                rows,
            )
            return self._get(tx, batch_id)

    @staticmethod
    def _get(tx: Tx, batch_id: str, *, lock: bool = False) -> Batch:
        """The batch (a 404 when it is not there); with ``lock``, held until the transaction
        ends (PostgreSQL)."""
        hold = " FOR UPDATE" if lock and tx.db.is_postgres else ""
        rows = tx.rows(f"SELECT {BATCH_COLUMNS} FROM batches WHERE id = ?{hold}", (batch_id,))
        if not rows:
            raise NotFound(f"No batch {batch_id!r}.", param="batch_id")
        return batch_of(rows[0])

    def get(self, batch_id: str) -> Batch | None:
        with self.pool.transaction() as tx:
            rows = tx.rows(f"SELECT {BATCH_COLUMNS} FROM batches WHERE id = ?", (batch_id,))
        return batch_of(rows[0]) if rows else None

    def list_batches(
        self,
        owner: str | None,
        *,
        anyone: bool = False,
        after: str | None = None,
        limit: int = 20,
    ) -> tuple[list[Batch], bool]:
        """(one page of batches, whether more follow), newest first, as ``GET /v1/batches``
        lists them: the key's own (every key's with ``anyone``), after the batch ``after``."""
        if isinstance(limit, bool) or not 1 <= limit <= MAX_LIST:
            raise BadRequest(f"limit must be from 1 to {MAX_LIST}.", param="limit")
        where, values = (["1 = 1"], []) if anyone else (["owner = ?"], [owner_key(owner)])
        with self.pool.transaction() as tx:
            if after is not None:
                cursor = tx.rows("SELECT created_at, id FROM batches WHERE id = ?", (after,))
                if not cursor:
                    raise BadRequest(f"No batch {after!r} to list after.", param="after")
                where.append("(created_at, id) < (?, ?)")
                values += [cursor[0][0], cursor[0][1]]
            rows = tx.rows(
                f"SELECT {BATCH_COLUMNS} FROM batches WHERE {' AND '.join(where)} "
                "ORDER BY created_at DESC, id DESC LIMIT ?",
                (*values, limit + 1),
            )
        return [batch_of(row) for row in rows[:limit]], len(rows) > limit

    def cancel(self, batch_id: str, *, now: float | None = None) -> Batch:
        """Cancel a batch: ``cancelling`` while lines it claimed run on, ``cancelled`` (with
        the files of what was done) once none does. Cancelling one already cancelling or
        cancelled returns it as it is; one that has ended otherwise is a 400 naming
        ``batch_id``, and a batch that is not there a 404."""
        at = time.time() if now is None else now
        with self.pool.transaction() as tx:
            batch = self._get(tx, batch_id, lock=True)
            if batch.status == "cancelling":  # a line whose worker died meanwhile ends now
                drop_idle_lines(tx, batch_id, at)
                return self._get(tx, batch_id)
            if batch.status == "cancelled":
                return batch
            if not may_move(batch.status, "cancelling"):
                raise BadRequest(
                    f"The batch is {batch.status}; only a batch that is validating or in "
                    "progress can be cancelled.",
                    param="batch_id",
                    code="invalid_batch_status",
                )
            moved = tx.count(
                "UPDATE batches SET status = 'cancelling', cancelling_at = ? "
                "WHERE id = ? AND status = ?",
                (int(at), batch_id, batch.status),
            )
            if moved:
                drop_idle_lines(tx, batch_id, at)
            return self._get(tx, batch_id)

    def expire(self, *, now: float | None = None) -> list[str]:
        """End every batch whose window has passed before it completed: its unfinished lines
        go to its error file as ``batch_expired`` (counted failed), what was done to its output
        file, and it is ``expired``. And end every ``cancelling`` batch whose last running
        lines' workers died (their leases passed) or gave them back (:meth:`release`). The ids
        of the batches it ended."""
        at = time.time() if now is None else now
        ended: list[str] = []
        with self.pool.transaction() as tx:
            stuck = tx.rows(
                "SELECT DISTINCT b.id FROM batches b JOIN batch_lines l ON l.batch_id = b.id "
                "WHERE b.status = 'cancelling' AND (l.state = 'pending' OR "
                "(l.state = 'claimed' AND l.lease_until <= ?)) ORDER BY b.id",
                (at,),
            )
        for (batch_id,) in stuck:
            with self.pool.transaction() as tx:
                self._get(tx, batch_id, lock=True)
                if drop_idle_lines(tx, batch_id, at) == "cancelled":
                    ended.append(batch_id)
        with self.pool.transaction() as tx:
            due = tx.rows(
                "SELECT id, status, owner FROM batches WHERE status IN "
                "('validating', 'in_progress', 'finalizing') AND expires_at <= ? ORDER BY id"
                + (" FOR UPDATE" if tx.db.is_postgres else ""),
                (int(at),),
            )
            for batch_id, status, owner in due:
                if may_move(status, "expired"):
                    end_expired(tx, batch_id, status, owner, at)
                    ended.append(batch_id)
        return ended

    # -- lines -----------------------------------------------------------------------------

    def claim(
        self,
        worker: str,
        n: int,
        *,
        lease_s: float,
        batch_id: str | None = None,
        max_claims: int | None = None,
        now: float | None = None,
    ) -> list[Line]:
        """Up to ``n`` lines of in-progress batches (of ``batch_id`` only, if given), oldest
        first: pending ones, or claimed ones whose lease has passed; now claimed by ``worker``
        until ``now + lease_s``. With ``max_claims``, a line whose lease has passed that many
        times (each of its workers died running it) is not handed out again: it is finished
        as failed first (:meth:`give_up`)."""
        at = time.time() if now is None else now
        if max_claims is not None:
            self.give_up(max_claims, now=at)
        limit = 2**31 if max_claims is None else max_claims
        only, values = ("AND l.batch_id = ?", (batch_id,)) if batch_id is not None else ("", ())
        pick = (
            "SELECT l.seq FROM batch_lines l JOIN batches b ON b.id = l.batch_id "
            "WHERE l.state IN ('pending', 'claimed') "
            "AND (l.state = 'pending' OR (l.lease_until <= ? AND l.claims < ?)) "
            f"AND b.status = 'in_progress' {only} ORDER BY l.seq LIMIT ?"
        )
        with self.pool.transaction() as tx:
            if tx.db.is_postgres:
                pick += " FOR UPDATE OF l SKIP LOCKED"
            taken = tx.rows(
                "UPDATE batch_lines SET state = 'claimed', worker = ?, lease_until = ?, "
                f"claims = claims + 1 WHERE seq IN ({pick}) RETURNING seq",
                (worker, at + lease_s, at, limit, *values, n),
            )
            if not taken:
                return []
            seqs = sorted(int(row[0]) for row in taken)
            rows = tx.rows(
                f"SELECT {LINE_COLUMNS} FROM batch_lines l JOIN batches b ON b.id = l.batch_id "
                f"WHERE l.seq IN ({marks(seqs)}) ORDER BY l.seq",
                seqs,
            )
        return [line_of(row) for row in rows]

    def give_up(self, max_claims: int, *, now: float | None = None) -> int:
        """Finish as failed (``line_abandoned``, in the error file) every line whose lease has
        passed ``max_claims`` times: a request that kills whoever runs it is not run forever.
        How many; each batch in its own transaction, locked before its lines."""
        at = time.time() if now is None else now
        with self.pool.transaction() as tx:
            due = tx.rows(
                "SELECT DISTINCT batch_id FROM batch_lines WHERE state = 'claimed' "
                "AND lease_until <= ? AND claims >= ? ORDER BY batch_id",
                (at, max_claims),
            )
        gone = 0
        for (batch_id,) in due:
            with self.pool.transaction() as tx:
                self._get(tx, batch_id, lock=True)
                gone += abandon_lines(tx, batch_id, max_claims, at)
        return gone

    def renew(
        self, worker: str, line_ids: list[str], *, lease_s: float, now: float | None = None
    ) -> list[str]:
        """Extend ``worker``'s claims on ``line_ids`` to ``now + lease_s``; the ids it still
        holds (a line whose lease passed and that another worker claimed is not among them)."""
        if not line_ids:
            return []
        at = time.time() if now is None else now
        with self.pool.transaction() as tx:
            rows = tx.rows(
                "UPDATE batch_lines SET lease_until = ? WHERE state IN ('claimed', 'deferred') "
                f"AND worker = ? AND id IN ({marks(line_ids)}) RETURNING id",
                (at + lease_s, worker, *line_ids),
            )
        return sorted(row[0] for row in rows)

    def release(self, line_ids: list[str]) -> int:
        """Give claimed or deferred lines back, pending, to be claimed again (a worker yielding
        to interactive work; an upstream batch that failed and must be re-sent); how many."""
        return self._unclaim(line_ids, "pending", None)

    def defer_to_api(self, line_ids: list[str], upstream_batch_id: str) -> int:
        """Record claimed lines as sent to the upstream's batch ``upstream_batch_id`` (no worker
        claims them while that batch runs; their worker keeps them under the store's
        ``lease_s``, :mod:`~proxy.ledger.batches.handover`); how many. Lines deferred already
        take the new id, so a runner may record its own handle before it uploads and the
        upstream's id once it has it, and find either with :meth:`deferred` after a crash."""
        return self._unclaim(line_ids, "deferred", upstream_batch_id)

    def _unclaim(self, line_ids: list[str], state: str, upstream_batch_id: str | None) -> int:
        """Move claimed or deferred ``line_ids`` to ``state`` on ``upstream_batch_id``; how many.
        ``pending`` drops worker and lease; ``deferred`` keeps the worker, leased ``lease_s``."""
        if not line_ids:
            return 0
        keep = state == "deferred"
        lease = None if not keep or self.lease_s is None else time.time() + self.lease_s
        worker = "" if keep else "worker = NULL, "
        with self.pool.transaction() as tx:
            return tx.count(
                f"UPDATE batch_lines SET state = ?, upstream_batch_id = ?, {worker}"
                f"lease_until = ? WHERE id IN ({marks(line_ids)}) "
                "AND state IN ('claimed', 'deferred')",
                (state, upstream_batch_id, lease, *line_ids),
            )

    def deferred(self, upstream_batch_id: str | None = None) -> dict[str, list[Line]]:
        """The lines waiting for an upstream batch (that one's only, if given), by its id."""
        only, values = "", tuple[str, ...]()
        if upstream_batch_id is not None:
            only, values = "AND l.upstream_batch_id = ?", (upstream_batch_id,)
        with self.pool.transaction() as tx:
            return lines_by_upstream(tx, f"l.state = 'deferred' {only}", values)

    def finish(
        self,
        line_id: str,
        result: LineResult,
        *,
        route: str,
        row: LedgerRow | None = None,
        counted: tuple[int, int] | None = None,
        now: float | None = None,
    ) -> str | None:
        """Write the line's ``result`` (``route``: ``local`` or ``api``, who answered) and its
        ledger ``row`` (its request id becomes the line's id; ``counted``: the counterfactual
        tokens of a local answer, if known) in one transaction. A line that is not claimed or
        deferred (finished already, cancelled, expired) raises :class:`AlreadyFinished` and
        nothing is written. The batch's new status when this line ended it, else None."""
        at = time.time() if now is None else now
        with self.pool.transaction() as tx:
            if tx.db.is_postgres:
                lock_batch_of(tx, line_id)
            done = tx.rows(
                "UPDATE batch_lines SET state = 'done', route = ?, status_code = ?, "
                "request_id = ?, response = ?, error = ?, finished_at = ?, "
                "lease_until = NULL WHERE id = ? AND state IN ('claimed', 'deferred') "
                "RETURNING batch_id",
                (
                    route,
                    result.status_code,
                    result.request_id,
                    None if result.body is None else to_json(result.body),
                    None if result.error is None else to_json(result.error),
                    at,
                    line_id,
                ),
            )
            if not done:
                raise AlreadyFinished(line_id)
            batch_id = done[0][0]
            tally = "completed = completed + 1" if result.ok else "failed = failed + 1"
            tx.run(f"UPDATE batches SET {tally} WHERE id = ?", (batch_id,))
            if row is not None:
                if self.prices is None:
                    raise ValueError("BatchStore(prices=...) is needed to write ledger rows")
                insert_row(tx, dataclasses.replace(row, request_id=line_id), counted, self.prices)
            return settle(tx, batch_id, int(at))

    def progress(self, batch_id: str) -> dict[str, int]:
        """How many of the batch's lines are in each state, and how many each route answered
        (``frugal batches show``): ``{"pending": …, "done": …, "local": …, "api": …}``."""
        with self.pool.transaction() as tx:
            states = tx.rows(
                "SELECT state, count(*) FROM batch_lines WHERE batch_id = ? GROUP BY state",
                (batch_id,),
            )
            routes = tx.rows(
                "SELECT route, count(*) FROM batch_lines WHERE batch_id = ? AND state = 'done' "
                "AND route IS NOT NULL GROUP BY route",
                (batch_id,),
            )
            left = open_lines(tx, batch_id)
        found = {str(state): int(n) for state, n in states}
        found.update({str(route): int(n) for route, n in routes})
        found["open"] = left
        return found
