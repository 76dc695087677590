"""The batch store's rows and statements: a ``batches`` or ``batch_lines`` row read back as
its object, the columns read, OpenAI's metadata checked, and the few helpers every statement of
:mod:`proxy.ledger.batches.store` shares (many rows in one call, a list of placeholders, the
batch's lock taken before its lines', a finished line's ledger row written in the transaction
that finishes it).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any

from proxy.errors import BadRequest
from proxy.ledger.batches.objects import TIMESTAMPS, Batch, Line
from proxy.ledger.db import postgres
from proxy.ledger.db.connections import Tx
from proxy.ledger.pricing import PriceBook
from proxy.ledger.writing.ledger_row import COLUMNS, LedgerRow
from proxy.ledger.writing.rows import row_values

MAX_METADATA = (16, 64, 512)  # pairs, characters of a key, characters of a value
BATCH_COLUMNS = (
    "id, owner, endpoint, input_file_id, completion_window, status, "
    + ", ".join(TIMESTAMPS)
    + ", total, completed, failed, output_file_id, error_file_id, errors, metadata"
)
LINE_COLUMNS = (
    "l.id, l.batch_id, b.owner, l.idx, l.custom_id, l.method, l.url, l.body, l.claims, "
    "l.upstream_batch_id"
)

INSERT_ROW = f"INSERT INTO requests ({', '.join(COLUMNS)}) VALUES ({', '.join('?' * len(COLUMNS))})"


def to_json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def batch_of(row: tuple[Any, ...]) -> Batch:
    stamps = row[6 : 6 + len(TIMESTAMPS)]
    rest = row[6 + len(TIMESTAMPS) :]
    return Batch(
        id=row[0],
        owner=row[1] or None,
        endpoint=row[2],
        input_file_id=row[3],
        completion_window=row[4],
        status=row[5],
        times={
            name: None if v is None else int(v) for name, v in zip(TIMESTAMPS, stamps, strict=True)
        },
        total=int(rest[0]),
        completed=int(rest[1]),
        failed=int(rest[2]),
        output_file_id=rest[3],
        error_file_id=rest[4],
        errors=None if rest[5] is None else json.loads(rest[5]),
        metadata=None if rest[6] is None else json.loads(rest[6]),
    )


def line_of(row: tuple[Any, ...]) -> Line:
    return Line(
        id=row[0],
        batch_id=row[1],
        owner=row[2] or None,
        index=int(row[3]),
        custom_id=row[4],
        method=row[5],
        url=row[6],
        body=json.loads(row[7]),
        claims=int(row[8]),
        upstream_batch_id=row[9],
    )


def lines_by_upstream(tx: Tx, where: str, values: Sequence[Any]) -> dict[str, list[Line]]:
    """The lines ``where`` picks (it may name the line ``l`` and its batch ``b``), in their
    order, by the upstream batch id (or handle) they wait for."""
    rows = tx.rows(
        f"SELECT {LINE_COLUMNS} FROM batch_lines l JOIN batches b ON b.id = l.batch_id "
        f"WHERE {where} ORDER BY l.seq",
        values,
    )
    found: dict[str, list[Line]] = {}
    for row in rows:
        line = line_of(row)
        found.setdefault(line.upstream_batch_id or "", []).append(line)
    return found


def insert_many(tx: Tx, statement: str, rows: list[tuple[Any, ...]]) -> None:
    if tx.db.is_postgres:
        with tx.raw.cursor() as cursor:
            cursor.executemany(postgres.sql(statement), rows)
    else:
        tx.raw.executemany(statement, rows)


def lock_batch_of(tx: Tx, line_id: str) -> None:
    """On PostgreSQL, lock the batch of the line ``line_id`` before the line itself: every
    transaction that writes both (finish, cancel, expire) takes the batch first, so that two of
    them can never each hold what the other waits for."""
    tx.rows(
        "SELECT 1 FROM batches WHERE id = (SELECT batch_id FROM batch_lines WHERE id = ?) "
        "FOR UPDATE",
        (line_id,),
    )


def marks(values: list[Any]) -> str:
    return ", ".join("?" * len(values))


def check_metadata(metadata: Any) -> dict[str, str] | None:
    """OpenAI's metadata: at most 16 pairs of strings, keys of 64 characters and values of 512
    at most; anything else is a 400 naming ``metadata``."""
    if metadata is None:
        return None
    pairs, key_len, value_len = MAX_METADATA
    if (
        not isinstance(metadata, dict)
        or len(metadata) > pairs
        or not all(isinstance(k, str) and len(k) <= key_len for k in metadata)
        or not all(isinstance(v, str) and len(v) <= value_len for v in metadata.values())
    ):
        raise BadRequest(
            f"metadata must be an object of at most {pairs} string pairs, keys of at most "
            f"{key_len} characters and values of at most {value_len}.",
            param="metadata",
        )
    return dict(metadata)


def insert_row(tx: Tx, row: LedgerRow, counted: tuple[int, int] | None, prices: PriceBook) -> None:
    """``row`` written in ``tx``, its costs computed as the batched writer computes them
    (``counted``: a local answer's counterfactual tokens, when known)."""
    count: Future[tuple[int, int]] | None = None
    if counted is not None:
        count = Future()
        count.set_result(counted)
    values, _, _ = row_values(row, count, prices, COLUMNS)
    tx.run(INSERT_ROW, values)
