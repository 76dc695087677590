"""One audit as a row of the ``audits`` table (``migrations/0007_audits.sql``), and back.

The prompt, both answers and the judge's reason are content: :meth:`AuditRecord.row` leaves
them NULL unless content logging is on, whatever the record holds. Writing goes through the
ledger's one writer; :func:`insert` is the statement it runs, on a connection it owns.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

CONTENT_COLUMNS = ("prompt", "reference", "candidate", "judge_reason")


@dataclass(frozen=True, kw_only=True)
class AuditRecord:
    accepted: bool
    verdict: bool | None  # None: the audit failed (no reference, or the judge gave no verdict)
    weight: float = 1.0
    request_id: str = ""
    ts: float = 0.0
    requested_model: str = ""
    task_kind: str = "other"
    local_model: str = ""
    features: Mapping[str, float] = field(default_factory=dict)
    score: float | None = None
    threshold: float | None = None
    method: str | None = None  # "exact" | "judge" | None
    error: str | None = None
    correctness: str = "strict"
    judge_model: str | None = None
    cost_pusd: int = 0
    prompt: str | None = None
    reference: str | None = None
    candidate: str | None = None
    judge_reason: str | None = None

    def row(self, *, log_content: bool) -> dict[str, Any]:
        """The columns of this audit; the text columns only when ``log_content``."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in CONTENT_COLUMNS and not log_content:
                value = None
            elif f.name == "features":
                value = json.dumps(dict(value), sort_keys=True)
            elif isinstance(value, bool):
                value = int(value)
            out[f.name] = value
        return out


COLUMNS = tuple(f.name for f in fields(AuditRecord))
INSERT_SQL = (
    f"INSERT INTO audits ({', '.join(COLUMNS)}) VALUES ({', '.join(':' + c for c in COLUMNS)})"
)


def insert(conn: sqlite3.Connection, records: Iterable[AuditRecord], *, log_content: bool) -> int:
    """Insert ``records`` (in the caller's transaction); returns how many."""
    rows = [r.row(log_content=log_content) for r in records]
    conn.executemany(INSERT_SQL, rows)
    return len(rows)


def read(
    conn: sqlite3.Connection,
    *,
    since: float,
    until: float,
    local_model: str | None = None,
) -> list[AuditRecord]:
    """The audits with ``since <= ts < until`` (of one local model, if given), oldest first."""
    sql = f"SELECT {', '.join(COLUMNS)} FROM audits WHERE ts >= ? AND ts < ?"
    params: list[Any] = [since, until]
    if local_model is not None:
        sql += " AND local_model = ?"
        params.append(local_model)
    records = []
    for values in conn.execute(sql + " ORDER BY ts, id", params):
        raw = dict(zip(COLUMNS, values, strict=True))
        raw["accepted"] = bool(raw["accepted"])
        raw["verdict"] = None if raw["verdict"] is None else bool(raw["verdict"])
        raw["features"] = json.loads(raw["features"]) if raw["features"] else {}
        for name in ("requested_model", "task_kind", "local_model"):
            raw[name] = raw[name] or ""
        records.append(AuditRecord(**raw))
    return records


def month_spend_pusd(conn: sqlite3.Connection, *, since: float, until: float) -> int:
    """What audits cost between ``since`` and ``until``: the sampler's budget at start-up."""
    (spent,) = conn.execute(
        "SELECT COALESCE(SUM(cost_pusd), 0) FROM audits WHERE ts >= ? AND ts < ?", (since, until)
    ).fetchone()
    return int(spent)
