"""A batch's input file read into its lines, or the list of what is wrong with it.

OpenAI's input file is JSON Lines, one request a line: ``{"custom_id", "method", "url",
"body"}``. :func:`read_lines` checks each line as OpenAI's Batch API does before a batch starts:
a JSON object, a non-empty string ``custom_id`` unique in the file, ``method`` ``POST``, the
batch's own endpoint as ``url`` (one url per batch), a JSON object as ``body``; the file within
:data:`~proxy.ledger.batches.objects.MAX_LINES` lines and ``max_bytes``, and not empty. Blank
lines are skipped. Each error names its line (counted from 1, as an editor does), the
parameter and a code; a batch made from such a file is ``failed`` with them as its ``errors``,
at most :data:`MAX_ERRORS` of them, so that a file of a million bad lines makes a small row.

Whether a body is a request the endpoint accepts is checked when the line runs, as for any
request: a bad body is that line's 400 in the error file, not the batch's failure.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from proxy.ledger.batches.objects import MAX_LINES

MAX_ERRORS = 100
MAX_CUSTOM_ID = 512  # characters


@dataclass(frozen=True, slots=True)
class InputLine:
    custom_id: str
    method: str
    url: str
    body: dict[str, Any]


def _error(code: str, message: str, line: int | None, param: str | None) -> dict[str, Any]:
    return {"code": code, "message": message, "param": param, "line": line}


def read_lines(
    content: bytes,
    endpoint: str,
    *,
    max_lines: int = MAX_LINES,
    max_bytes: int,
) -> tuple[list[InputLine], list[dict[str, Any]]]:
    """(the lines, []) for a good file; ([], errors) for a bad one."""
    if len(content) > max_bytes:
        message = f"The input file has {len(content)} bytes; a batch takes at most {max_bytes}."
        return [], [_error("file_too_large", message, None, "input_file_id")]
    lines: list[InputLine] = []
    errors: list[dict[str, Any]] = []
    seen: set[str] = set()
    for number, raw in enumerate(content.split(b"\n"), start=1):
        if not raw.strip():
            continue
        if len(lines) + len(errors) >= max_lines:
            message = f"The input file has more than {max_lines} requests, the most a batch takes."
            errors.append(_error("too_many_requests", message, number, None))
            break
        line, problem = _read(raw, number, endpoint, seen)
        if problem is not None:
            errors.append(problem)
            if len(errors) >= MAX_ERRORS:
                break
        elif line is not None:
            lines.append(line)  # kept while errors are found too: it counts towards the bound
    if not lines and not errors:
        errors.append(_error("empty_file", "The input file holds no requests.", None, None))
    return ([], errors) if errors else (lines, [])


def _read(
    raw: bytes, number: int, endpoint: str, seen: set[str]
) -> tuple[InputLine | None, dict[str, Any] | None]:
    try:
        value = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None, _error("invalid_json_line", "This line is not valid JSON.", number, None)
    if not isinstance(value, dict):
        return None, _error("invalid_json_line", "This line is not a JSON object.", number, None)
    custom_id = value.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        message = "custom_id is missing or is not a non-empty string."
        return None, _error("missing_required_parameter", message, number, "custom_id")
    if len(custom_id) > MAX_CUSTOM_ID:
        message = f"custom_id is longer than {MAX_CUSTOM_ID} characters."
        return None, _error("invalid_value", message, number, "custom_id")
    if custom_id in seen:
        message = "This custom_id is used by an earlier line; each must be unique."
        return None, _error("duplicate_custom_id", message, number, "custom_id")
    seen.add(custom_id)
    method = value.get("method")
    if method != "POST":
        return None, _error("invalid_value", "method must be POST.", number, "method")
    url = value.get("url")
    if url != endpoint:
        message = f"url must be the batch's endpoint, {endpoint}: a batch has one url."
        return None, _error("mismatched_url", message, number, "url")
    body = value.get("body")
    if not isinstance(body, dict):
        message = "body is missing or is not a JSON object."
        return None, _error("missing_required_parameter", message, number, "body")
    return InputLine(custom_id, method, url, body), None
