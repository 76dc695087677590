"""The answers stored responses share (``response_outputs``, ``migrations/0015``): an answer's
output items split from the response that carries them (each item keeping only its id), digested
by the sha256 of their JSON with the ids left blank, and joined back when the response is read.
:mod:`proxy.ledger.responses_store` decides which rows keep an answer inline and which name a
shared one; this module holds the pure steps and the PostgreSQL lock per answer."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from proxy.ledger.db.connections import Tx


def to_json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def hold_output(tx: Tx, digest: str) -> None:
    """On PostgreSQL, the lock on the answer ``digest`` until the transaction ends, taken by
    whoever stores a response that names it and whoever deletes it once unnamed: a replica
    that finds the answer kept (and so writes no copy) cannot have it deleted under it by
    another's delete or prune, whose check would not see the uncommitted response yet.
    SQLite's one writer needs none."""
    tx.rows("SELECT pg_advisory_xact_lock(hashtext(?))", (f"response-output:{digest}",))


def split(response: dict[str, Any]) -> tuple[dict[str, Any], str | None, str | None]:
    """``response`` without its output items' bodies (each item keeps only its ``id``), the
    bodies' JSON (ids blank) and its digest; a response without output is kept whole."""
    output = response.get("output")
    if not isinstance(output, list) or not output:
        return response, None, None
    bodies = [{**item, "id": ""} if has_id(item) else item for item in output]
    ids = [{"id": item["id"]} if has_id(item) else {} for item in output]
    text = to_json(bodies)
    return {**response, "output": ids}, text, hashlib.sha256(text.encode("utf-8")).hexdigest()


def named(response: dict[str, Any]) -> tuple[dict[str, Any], None, str | None]:
    """``response`` kept whole (its output inline), and the digest its answer would be kept
    under by :func:`split`, so that a later cache hit of the same answer finds this row."""
    output = response.get("output")
    if not isinstance(output, list) or not output:
        return response, None, None
    bodies = [{**item, "id": ""} if has_id(item) else item for item in output]
    return response, None, hashlib.sha256(to_json(bodies).encode("utf-8")).hexdigest()


def has_id(item: Any) -> bool:
    return isinstance(item, dict) and "id" in item


def joined(response: dict[str, Any], output: str | None) -> dict[str, Any]:
    """A stored ``response`` with its output items' bodies (``output``) back in place."""
    if output is None:
        return response
    ids = response.get("output") or []
    bodies = json.loads(output)
    items = [
        {**body, "id": ids[i]["id"]} if i < len(ids) and has_id(ids[i]) else body
        for i, body in enumerate(bodies)
    ]
    return {**response, "output": items}
