"""Usage validation: the token counts and costs of a ledger row that cannot be real are blanked.

An upstream (or a bug) can report a count no context window comes near, a float, a string or a
negative number. Such a figure is stored as NULL (unknown), never clamped, and the costs priced
on it become unknown too.
"""

from __future__ import annotations

from typing import Any

from proxy.ledger.writing.ledger_row import COUNT_COLUMNS, MONEY_COLUMNS, NOT_NULL_COUNTS

TOKEN_LIMIT = 2**31
"""Token counts are integers in [0, 2**31): no context window comes near it, and a figure
beyond it (an upstream reporting 2**70) cannot be a real count."""
INT64 = 2**63
TOKEN_FIELDS = COUNT_COLUMNS
MONEY_FIELDS = MONEY_COLUMNS
# NOT NULL in the schema: an impossible figure there is stored as 0 rather than NULL.
_ZERO_WHEN_INVALID = NOT_NULL_COUNTS


def check_usage(row: dict[str, Any]) -> list[str]:
    """Blank the impossible usage figures of a row, in place; returns the fields blanked.

    A figure is possible when it is an integer (an integral float is taken as one; bool is not)
    in [0, 2**31). An impossible one says the figures around it cannot be trusted either, so it
    is not clamped but stored as NULL (``cached_tokens``, NOT NULL, as 0): costs priced on it
    become unknown. Call :func:`check_money` once the costs are applied.
    """
    invalid: list[str] = []
    for field_name in TOKEN_FIELDS:
        value = row.get(field_name)
        if value is None:
            continue
        number = _whole(value)
        if number is None or not 0 <= number < TOKEN_LIMIT:
            invalid.append(field_name)
            row[field_name] = 0 if field_name in _ZERO_WHEN_INVALID else None
        else:
            row[field_name] = number
    return invalid


def distrust_costs(row: dict[str, Any], invalid: list[str]) -> None:
    """After :func:`apply_costs`: a cost priced on a figure :func:`check_usage` blanked is not
    known (a blank completion count would otherwise be priced as 0 tokens)."""
    bad = set(invalid)
    if row.get("route") == "api":
        if bad & {"prompt_tokens", "completion_tokens", "cached_tokens"}:
            row["api_cost_pusd"] = row["counterfactual_cost_pusd"] = None
    elif row.get("token_source") == "local" and bad & {"prompt_tokens", "completion_tokens"}:
        row["counterfactual_cost_pusd"] = None


def check_money(row: dict[str, Any]) -> list[str]:
    """Blank (to NULL, unknown) the costs of a row that do not fit SQLite's int64."""
    invalid = []
    for field_name in MONEY_FIELDS:
        value = row.get(field_name)
        if value is not None and not (isinstance(value, int) and -INT64 <= value < INT64):
            invalid.append(field_name)
            row[field_name] = None
    return invalid


def _whole(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None
