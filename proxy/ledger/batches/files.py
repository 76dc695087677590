"""Files, as OpenAI's Files API keeps them: the ``batch_files`` table, bytes and all
(``migrations/0016_batches.sql``).

A file is kept in the ledger database itself, so that every replica on one PostgreSQL reads the
same files and a proxy restarted from its SQLite file finds them. Each key keeps at most
``quota_bytes`` (``[batch] file_quota_bytes``): the key's running tally in
``batch_file_usage`` is read and raised in the transaction that writes the file, after the
check and before a byte is written (on PostgreSQL under a lock per key, so two replicas cannot
both pass it), and :meth:`FileStore.room` is what the upload reads first, to stop reading a
body that cannot fit. Past it, :meth:`FileStore.put` raises a 400 ``file_quota_exceeded``
naming ``file``, and nothing is written. A batch's output and error files count in the tally
but are never refused: the work they hold is done and paid for.

A file may expire (OpenAI's ``expires_after``: ``{"anchor": "created_at", "seconds": N}``,
an hour to 30 days); :meth:`FileStore.sweep` deletes the expired ones and gives their bytes
back. Who may read which file is the HTTP side's business: this module lists by owner (None:
the keyless proxy, stored as ``''``) and reads or deletes by id. A file's bytes are read a
:data:`CHUNK_BYTES` slice at a time (:meth:`FileStore.chunk`), so that serving a batch's
200 MB file holds one slice in memory, not the file. Blocking methods: run them in a thread.
"""

from __future__ import annotations

import secrets
import time
from typing import Any

from proxy.errors import BadRequest, PayloadTooLarge
from proxy.ledger.batches.objects import (
    MAX_BATCH_FILE_BYTES,
    MAX_FILE_BYTES,
    UPLOAD_PURPOSES,
    StoredFile,
)
from proxy.ledger.db.connections import Pool, Tx

EXPIRES_AFTER_S = (3600, 30 * 86_400)  # OpenAI's bounds on expires_after.seconds
MAX_LIST = 10_000  # OpenAI's most files in one page
CHUNK_BYTES = 1 << 20  # what one read of a file's content holds in memory
_COLUMNS = "id, owner, purpose, filename, bytes, created_at, expires_at, status"


def new_id() -> str:
    return f"file-{secrets.token_hex(12)}"


def owner_key(owner: str | None) -> str:
    """The owner as stored: the key's identity, or ``''`` for the keyless proxy."""
    return "" if owner is None else owner


def _file(row: tuple[Any, ...]) -> StoredFile:
    return StoredFile(
        id=row[0],
        owner=row[1] or None,
        purpose=row[2],
        filename=row[3],
        bytes=int(row[4]),
        created_at=int(row[5]),
        expires_at=None if row[6] is None else int(row[6]),
        status=row[7],
    )


def expiry(expires_after: Any, created_at: int) -> int | None:
    """The unix second a file expires at, from OpenAI's ``expires_after`` (None: never)."""
    if expires_after is None:
        return None
    if not isinstance(expires_after, dict) or expires_after.get("anchor") != "created_at":
        raise BadRequest('expires_after.anchor must be "created_at".', param="expires_after.anchor")
    seconds = expires_after.get("seconds")
    low, high = EXPIRES_AFTER_S
    if isinstance(seconds, bool) or not isinstance(seconds, int) or not low <= seconds <= high:
        raise BadRequest(
            f"expires_after.seconds must be an integer from {low} to {high}.",
            param="expires_after.seconds",
        )
    return created_at + seconds


def _tally(tx: Tx, owner: str, change: int) -> None:
    tx.run(
        "INSERT INTO batch_file_usage (owner, bytes) VALUES (?, ?) "
        "ON CONFLICT (owner) DO UPDATE SET bytes = batch_file_usage.bytes + excluded.bytes",
        (owner, change),
    )


def _used(tx: Tx, owner: str) -> int:
    row = tx.rows("SELECT bytes FROM batch_file_usage WHERE owner = ?", (owner,))
    return int(row[0][0]) if row else 0


def write_file(
    tx: Tx,
    *,
    owner: str,
    purpose: str,
    filename: str,
    content: bytes,
    created_at: int,
    expires_at: int | None,
) -> StoredFile:
    """Insert a file and count it, in the caller's transaction, with no quota check (the
    batch's output files)."""
    stored = StoredFile(
        id=new_id(),
        owner=owner or None,
        purpose=purpose,
        filename=filename,
        bytes=len(content),
        created_at=created_at,
        expires_at=expires_at,
    )
    tx.run(
        f"INSERT INTO batch_files ({_COLUMNS}, content) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (
            stored.id,
            owner,
            purpose,
            filename,
            stored.bytes,
            created_at,
            expires_at,
            stored.status,
            content,
        ),
    )
    _tally(tx, owner, stored.bytes)
    return stored


def read_content(tx: Tx, file_id: str) -> bytes | None:
    rows = tx.rows("SELECT content FROM batch_files WHERE id = ?", (file_id,))
    return bytes(rows[0][0]) if rows else None


def read_chunk(tx: Tx, file_id: str, offset: int, size: int) -> bytes | None:
    """Up to ``size`` of the file's bytes from ``offset`` (``b""`` past its end); None when
    there is no such file. Only those bytes reach this process: SQLite's incremental blob I/O
    reads the pages that hold them, PostgreSQL sends the slice ``substr`` cut."""
    if tx.db.is_postgres:
        rows = tx.rows(
            "SELECT substr(content, CAST(? AS integer), CAST(? AS integer)) FROM batch_files "
            "WHERE id = ?",
            (offset + 1, size, file_id),
        )
        return bytes(rows[0][0]) if rows else None
    found = tx.rows("SELECT rowid, bytes FROM batch_files WHERE id = ?", (file_id,))
    if not found:
        return None
    rowid, length = found[0]
    if offset >= int(length):
        return b""
    with tx.raw.blobopen("batch_files", "content", rowid, readonly=True) as blob:
        blob.seek(offset)
        return bytes(blob.read(size))


def read_file(tx: Tx, file_id: str) -> StoredFile | None:
    rows = tx.rows(f"SELECT {_COLUMNS} FROM batch_files WHERE id = ?", (file_id,))
    return _file(rows[0]) if rows else None


class FileStore:
    """A key keeps at most ``quota_bytes`` of files (``[batch] file_quota_bytes``)."""

    def __init__(self, pool: Pool, *, quota_bytes: int) -> None:
        self.pool = pool
        self.quota_bytes = quota_bytes

    def used(self, owner: str | None) -> int:
        """The bytes the key ``owner`` keeps in files."""
        with self.pool.transaction() as tx:
            return _used(tx, owner_key(owner))

    def room(self, owner: str | None) -> int:
        """The bytes the key ``owner`` may still upload (0 when it is at its quota or past it)."""
        return max(0, self.quota_bytes - self.used(owner))

    def put(
        self,
        owner: str | None,
        *,
        purpose: str,
        filename: str,
        content: bytes,
        expires_after: Any = None,
        now: float | None = None,
    ) -> StoredFile:
        """Store an upload. A purpose OpenAI does not have, a bad ``expires_after``: 400. More
        than OpenAI's size for the purpose: 413. Past the key's quota: 400
        ``file_quota_exceeded``. Each names its parameter, and nothing is written."""
        if purpose not in UPLOAD_PURPOSES:
            raise BadRequest(
                f"purpose must be one of {', '.join(UPLOAD_PURPOSES)}.", param="purpose"
            )
        created = int(time.time() if now is None else now)
        expires_at = expiry(expires_after, created)
        limit = MAX_BATCH_FILE_BYTES if purpose == "batch" else MAX_FILE_BYTES
        if len(content) > limit:
            raise PayloadTooLarge(
                f"The file has {len(content)} bytes; a file of purpose {purpose!r} may have "
                f"at most {limit}.",
                param="file",
            )
        key = owner_key(owner)
        with self.pool.transaction() as tx:
            if tx.db.is_postgres:  # replicas: one writer per key at a time (SQLite: the lock)
                tx.rows("SELECT pg_advisory_xact_lock(hashtext(?))", (f"batch-files:{key}",))
            used = _used(tx, key)
            if used + len(content) > self.quota_bytes:
                raise BadRequest(
                    f"This key keeps {used} bytes of files; {len(content)} more would pass its "
                    f"quota of {self.quota_bytes} bytes ([batch] file_quota_bytes). Delete "
                    "files it no longer needs (DELETE /v1/files/{file_id}).",
                    param="file",
                    code="file_quota_exceeded",
                )
            return write_file(
                tx,
                owner=key,
                purpose=purpose,
                filename=filename,
                content=content,
                created_at=created,
                expires_at=expires_at,
            )

    def get(self, file_id: str) -> StoredFile | None:
        with self.pool.transaction() as tx:
            return read_file(tx, file_id)

    def content(self, file_id: str) -> bytes | None:
        """The file's bytes, all at once (a small file, or a test's; ``GET .../content``
        reads a file a :meth:`chunk` at a time)."""
        with self.pool.transaction() as tx:
            return read_content(tx, file_id)

    def chunk(self, file_id: str, offset: int, size: int = CHUNK_BYTES) -> bytes | None:
        """Up to ``size`` of the file's bytes from ``offset``, each call its own short
        transaction (``b""`` past the end; None: the file is not there, or no longer)."""
        with self.pool.transaction() as tx:
            return read_chunk(tx, file_id, offset, size)

    def list_files(
        self,
        owner: str | None,
        *,
        anyone: bool = False,
        purpose: str | None = None,
        after: str | None = None,
        limit: int = MAX_LIST,
        order: str = "desc",
    ) -> tuple[list[StoredFile], bool]:
        """(one page of files, whether more follow), as ``GET /v1/files`` lists them: the key's
        own (every key's with ``anyone``), by ``created_at`` in ``order`` (``asc`` or
        ``desc``), starting after the file ``after``. A bad value is a 400 naming it."""
        if order not in ("asc", "desc"):
            raise BadRequest('order must be "asc" or "desc".', param="order")
        if isinstance(limit, bool) or not 1 <= limit <= MAX_LIST:
            raise BadRequest(f"limit must be from 1 to {MAX_LIST}.", param="limit")
        where, values = (["1 = 1"], []) if anyone else (["owner = ?"], [owner_key(owner)])
        if purpose is not None:
            where.append("purpose = ?")
            values.append(purpose)
        with self.pool.transaction() as tx:
            if after is not None:
                cursor = tx.rows("SELECT created_at, id FROM batch_files WHERE id = ?", (after,))
                if not cursor:
                    raise BadRequest(f"No file {after!r} to list after.", param="after")
                sign = ">" if order == "asc" else "<"
                where.append(f"(created_at, id) {sign} (?, ?)")
                values += [cursor[0][0], cursor[0][1]]
            way = "ASC" if order == "asc" else "DESC"
            rows = tx.rows(
                f"SELECT {_COLUMNS} FROM batch_files WHERE {' AND '.join(where)} "
                f"ORDER BY created_at {way}, id {way} LIMIT ?",
                (*values, limit + 1),
            )
        return [_file(row) for row in rows[:limit]], len(rows) > limit

    def delete(self, file_id: str) -> bool:
        with self.pool.transaction() as tx:
            gone = tx.rows(
                "DELETE FROM batch_files WHERE id = ? RETURNING owner, bytes", (file_id,)
            )
            if not gone:
                return False
            _tally(tx, gone[0][0], -int(gone[0][1]))
            return True

    def sweep(self, *, now: float | None = None) -> int:
        """Delete the files whose ``expires_at`` has passed; how many."""
        at = int(time.time() if now is None else now)
        with self.pool.transaction() as tx:
            gone = tx.rows(
                "DELETE FROM batch_files WHERE expires_at IS NOT NULL AND expires_at <= ? "
                "RETURNING owner, bytes",
                (at,),
            )
            freed: dict[str, int] = {}
            for owner, size in gone:
                freed[owner] = freed.get(owner, 0) + int(size)
            for owner in sorted(freed):  # one order, so that two sweeps lock alike
                _tally(tx, owner, -freed[owner])
            return len(gone)
