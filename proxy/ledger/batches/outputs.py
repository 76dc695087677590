"""A batch's end: its output and error files built from its lines, and the move to its last
status, in the transaction that saw its last line finish (or that cancelled or expired it);
and the lines ended without a result: cancelled (``batch_cancelled``), expired
(``batch_expired``) or given up after their workers kept dying (``line_abandoned``). Each
function runs in its caller's transaction, which holds the batch's lock on PostgreSQL.

The files hold each ended line once (finished, or cancelled), in the order of the client's
input file (its ``idx``): a 2xx answer in the output file, any other answer or an error in the
error file, in OpenAI's line shape ``{"id", "custom_id", "response": {"status_code",
"request_id", "body"}, "error"}``. A file with no line is not made (its id stays null), as
OpenAI's are not. The files are the batch key's, and count in its tally
(:mod:`proxy.ledger.batches.files`).
"""

from __future__ import annotations

import json
from typing import Any

from proxy.ledger.batches.files import write_file
from proxy.ledger.batches.objects import output_line
from proxy.ledger.db.connections import Tx

OPEN_STATES = ("pending", "claimed", "deferred")
ENDED_STATES = ("done", "cancelled")  # the lines a batch's files hold
CANCELLED_MESSAGE = "This request was not run: its batch was cancelled first."


def _jsonl(lines: list[dict[str, Any]]) -> bytes:
    text = "".join(
        json.dumps(line, separators=(",", ":"), ensure_ascii=False) + "\n" for line in lines
    )
    return text.encode("utf-8")


def open_lines(tx: Tx, batch_id: str) -> int:
    """How many of the batch's lines are not finished yet (pending, claimed or deferred)."""
    rows = tx.rows(
        "SELECT count(*) FROM batch_lines WHERE batch_id = ? AND state IN (?, ?, ?)",
        (batch_id, *OPEN_STATES),
    )
    return int(rows[0][0])


def build_files(tx: Tx, batch_id: str, owner: str, now: int) -> tuple[str | None, str | None]:
    """Write the batch's output and error files from its finished lines; their ids."""
    rows = tx.rows(
        "SELECT id, custom_id, status_code, request_id, response, error FROM batch_lines "
        "WHERE batch_id = ? AND state IN (?, ?) ORDER BY idx",
        (batch_id, *ENDED_STATES),
    )
    good: list[dict[str, Any]] = []
    bad: list[dict[str, Any]] = []
    for line_id, custom_id, status_code, request_id, response, error in rows:
        body = None if response is None else json.loads(response)
        problem = None if error is None else json.loads(error)
        line = output_line(line_id, custom_id, status_code, request_id, body, problem)
        ok = problem is None and status_code is not None and 200 <= int(status_code) < 300
        (good if ok else bad).append(line)
    ids: list[str | None] = []
    for kind, lines in (("output", good), ("error", bad)):
        if not lines:
            ids.append(None)
            continue
        stored = write_file(
            tx,
            owner=owner,
            purpose="batch_output",
            filename=f"{batch_id}_{kind}.jsonl",
            content=_jsonl(lines),
            created_at=now,
            expires_at=None,
        )
        ids.append(stored.id)
    return ids[0], ids[1]


def settle(tx: Tx, batch_id: str, now: int) -> str | None:
    """End the batch if nothing of it is left to run: an ``in_progress`` batch whose lines are
    all finished goes through ``finalizing`` to ``completed``, a ``cancelling`` one with no line
    running to ``cancelled``, each with its files. Its status after, or None when unchanged."""
    rows = tx.rows(
        "SELECT status, owner, total, completed, failed FROM batches WHERE id = ?", (batch_id,)
    )
    if not rows:
        return None
    status, owner, total, completed, failed = rows[0]
    if status == "in_progress" and int(total) == int(completed) + int(failed):
        ends = "completed"
        moved = ", finalizing_at = ?, completed_at = ?"
    elif status == "cancelling" and open_lines(tx, batch_id) == 0:
        ends = "cancelled"
        moved = ", cancelled_at = ?"
    else:
        return None
    output_id, error_id = build_files(tx, batch_id, owner, now)
    stamps = (now, now) if ends == "completed" else (now,)
    tx.run(
        f"UPDATE batches SET status = ?, output_file_id = ?, error_file_id = ?{moved} "
        "WHERE id = ? AND status = ?",
        (ends, output_id, error_id, *stamps, batch_id, status),
    )
    return ends


def drop_idle_lines(tx: Tx, batch_id: str, at: float) -> str | None:
    """Cancel the lines of a cancelling batch that nobody runs (pending, or claimed by a worker
    whose lease has passed), and end the batch if no line runs on; its new status, if it ended.

    A cancelled line keeps the state ``cancelled`` (never claimed, never finished), and carries
    OpenAI's error ``batch_cancelled``: it goes to the error file with its ``custom_id`` and
    counts as failed, so that once the batch is ``cancelled`` every line is in exactly one of
    its two files and ``completed + failed`` is ``total``."""
    error = json.dumps(
        {"code": "batch_cancelled", "message": CANCELLED_MESSAGE}, separators=(",", ":")
    )
    count = tx.count(
        "UPDATE batch_lines SET state = 'cancelled', error = ?, finished_at = ?, worker = NULL, "
        "lease_until = NULL WHERE batch_id = ? AND (state = 'pending' OR "
        "(state = 'claimed' AND lease_until <= ?))",
        (error, at, batch_id, at),
    )
    if count:
        tx.run("UPDATE batches SET failed = failed + ? WHERE id = ?", (count, batch_id))
    return settle(tx, batch_id, int(at))


def _fail_lines(
    tx: Tx, batch_id: str, code: str, message: str, at: float, where: str, values: tuple[Any, ...]
) -> int:
    """Finish the batch's lines that match ``where`` with the error ``code`` (counted failed);
    how many."""
    error = json.dumps({"code": code, "message": message}, separators=(",", ":"))
    count = tx.count(
        "UPDATE batch_lines SET state = 'done', error = ?, finished_at = ?, worker = NULL, "
        f"lease_until = NULL WHERE batch_id = ? AND {where}",
        (error, at, batch_id, *values),
    )
    tx.run("UPDATE batches SET failed = failed + ? WHERE id = ?", (count, batch_id))
    return count


def end_expired(tx: Tx, batch_id: str, status: str, owner: str, at: float) -> None:
    """End a batch whose window has passed: its unfinished lines in the error file as
    ``batch_expired``, what was done in the output file, ``expired``."""
    message = "This request could not be run before the batch expired."
    _fail_lines(tx, batch_id, "batch_expired", message, at, "state IN (?, ?, ?)", OPEN_STATES)
    output_id, error_id = build_files(tx, batch_id, owner, int(at))
    tx.run(
        "UPDATE batches SET status = 'expired', expired_at = ?, output_file_id = ?, "
        "error_file_id = ? WHERE id = ? AND status = ?",
        (int(at), output_id, error_id, batch_id, status),
    )


def abandon_lines(tx: Tx, batch_id: str, max_claims: int, at: float) -> int:
    """Fail the batch's lines whose lease has passed ``max_claims`` times (``line_abandoned``),
    and end the batch if they were its last; how many."""
    message = (
        f"The worker running this request stopped {max_claims} times before it finished; it "
        "is not run again."
    )
    where = "state = 'claimed' AND lease_until <= ? AND claims >= ?"
    count = _fail_lines(tx, batch_id, "line_abandoned", message, at, where, (at, max_claims))
    settle(tx, batch_id, int(at))
    return count
