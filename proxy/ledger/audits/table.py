"""The ``audits`` table (``migrations/0007_audits.sql``): its columns, its insert, its readers.

Rows arrive as plain dicts (what :meth:`proxy.ledger.audits.audit_record.AuditRecord.row` makes:
text columns already NULL unless content logging is on) and are written by the ledger's one writer
thread (:meth:`proxy.ledger.writing.writer.Ledger.record_audit`), on SQLite or PostgreSQL. The
readers run on a short :mod:`proxy.ledger.db.access` connection, the same statements on both
backends: the month's audit spend (the audit budget at start-up), the audits of a period (the
report's quality section, the threshold a target precision needs).
"""

from __future__ import annotations

from typing import Any

from proxy.ledger.db import access

AUDIT_COLUMNS = (
    "accepted",
    "verdict",
    "weight",
    "request_id",
    "ts",
    "requested_model",
    "task_kind",
    "local_model",
    "features",
    "score",
    "threshold",
    "method",
    "error",
    "correctness",
    "judge_model",
    "cost_pusd",
    "prompt",
    "reference",
    "candidate",
    "judge_reason",
)
AUDIT_INSERT = (
    f"INSERT INTO audits ({', '.join(AUDIT_COLUMNS)}) "
    f"VALUES ({', '.join('?' for _ in AUDIT_COLUMNS)})"
)


def audit_values(row: dict[str, Any]) -> tuple[Any, ...]:
    """A row's values in :data:`AUDIT_COLUMNS` order (booleans as the 0/1 the table holds)."""
    return tuple(int(v) if isinstance(v, bool) else v for v in map(row.get, AUDIT_COLUMNS))


def spend_pusd(conn: access.Connection, *, since: float, until: float) -> int:
    """What audits cost between ``since`` and ``until``, in pico-dollars."""
    if "cost_pusd" not in conn.columns("audits"):
        return 0
    rows = conn.query(
        "SELECT COALESCE(SUM(cost_pusd), 0) FROM audits WHERE ts >= ? AND ts < ?", (since, until)
    )
    return int(rows[0][0]) if rows else 0


def read_rows(
    conn: access.Connection,
    *,
    since: float,
    until: float,
    local_model: str | None = None,
    limit: int | None = None,
) -> list[dict[str, Any]]:
    """The audits with ``since <= ts < until`` (of one local model, if given), oldest first;
    with ``limit``, only the newest ``limit`` of them. The text columns are not read."""
    if not conn.columns("audits"):
        return []
    wanted = [c for c in AUDIT_COLUMNS if c not in ("prompt", "reference", "candidate")]
    sql = f"SELECT {', '.join(wanted)} FROM audits WHERE ts >= ? AND ts < ?"
    params: list[Any] = [since, until]
    if local_model is not None:
        sql += " AND local_model = ?"
        params.append(local_model)
    if limit is None:
        sql += " ORDER BY ts, id"
    else:
        sql += " ORDER BY ts DESC, id DESC LIMIT ?"
        params.append(int(limit))
    rows = [dict(zip(wanted, values, strict=True)) for values in conn.query(sql, params)]
    return rows if limit is None else rows[::-1]
