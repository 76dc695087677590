"""``<path>.rejected.jsonl``: the rows no database took, one JSON line each, to insert again.

Each line is ``{"why", "error", "at", "row"}``: ``why`` is ``rejected`` (the row itself could
not be written) or ``unwritten`` (the database stayed unwritable past the stop's deadline);
``row`` holds the row's ledger columns as the writer got them (no prompt or completion text: a
row has none). Lines are appended and synced; a file that cannot be written is reported to the
caller, which counts the rows lost.
"""

from __future__ import annotations

import json
import math
import os
import time
from typing import Any

from proxy.ledger.writing.ledger_row import COLUMNS

SPILL_SUFFIX = ".rejected.jsonl"


def append(path: str, rows: list[dict[str, Any]], why: str, error: str | None) -> None:
    """Append ``rows`` to the spill file at ``path``; raises :class:`OSError` if it cannot."""
    at = time.time()
    lines = "".join(
        json.dumps({"why": why, "error": error, "at": at, "row": spill_row(row)}) + "\n"
        for row in rows
    )
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, lines.encode("utf-8"))
        os.fsync(fd)
    finally:
        os.close(fd)


def spill_row(row: dict[str, Any]) -> dict[str, Any]:
    """The row's ledger columns, as JSON can hold them; other keys (none carry content today)
    and values of other types (shown by their type's name) are left out."""
    out: dict[str, Any] = {}
    for column in COLUMNS:
        if column not in row:
            continue
        value = row[column]
        if value is None or isinstance(value, str | int | bool):
            out[column] = value
        elif isinstance(value, float):
            out[column] = value if math.isfinite(value) else repr(value)
        else:
            out[column] = f"<{type(value).__name__}>"
    return out
