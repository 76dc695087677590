"""One ledger row: its columns (:class:`LedgerRow`), and its values as the writer stores them.

:class:`LedgerRow` is the one list of the ``requests`` table's columns in Python: the writer's
INSERT, the spill file and the report's seeding all take :data:`COLUMNS` from it.
:func:`row_values` turns what a request handed to :meth:`Ledger.record` into the values of
the ``requests`` columns: the counterfactual tokens (the provider's usage for an API answer,
the requested model's tokenizer for a local one, or the local model's own count while the
tokenizer is still running), the latency tax, the costs in pico-dollars, and the usage figures
that could not be true (stored as NULL and named in ``usage_invalid``). It is pure: the writer
keeps the counts and the log lines.
"""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass, fields
from typing import Any

from proxy.ledger.pricing import PriceBook, apply_costs
from proxy.ledger.writing.usage import check_money, check_usage, distrust_costs


@dataclass(frozen=True, kw_only=True, slots=True)
class LedgerRow:
    """One row of the ``requests`` table: the only list of its columns in Python.

    Fields are the columns, in the table's order (``id`` is the database's). A field that is
    ``NOT NULL`` in the schema has a type without ``None``; a schema default is the field's
    default. The request fills the facts (:mod:`proxy.http.record`); the writer fills the
    rest (the counterfactual tokens, ``token_source`` unless the request set it, the latency
    tax, the costs and ``usage_invalid``: see :func:`row_values`). A new column is a field
    here and a migration in each of ``migrations/`` and ``migrations/postgres/``;
    ``tests/ledger/test_ledger_row.py`` holds the three to each other.
    """

    request_id: str
    ts: float  # unix time the request arrived
    endpoint: str = "chat.completions"
    requested_model: str | None = None
    route: str  # local | api | cache | none
    reason: str  # a proxy.routing.reasons.Reason
    status: int
    stream: int = 0
    quality: float | None = None
    quality_reasons: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    local_prompt_tokens: int | None = None
    local_completion_tokens: int | None = None
    latency_ms: float
    local_ms: float = 0.0
    api_ms: float = 0.0
    api_cost_pusd: int | None = None  # the writer's
    counterfactual_cost_pusd: int | None = None  # the writer's
    error: str | None = None
    # 0002_costs
    api_model: str | None = None
    cached_tokens: int = 0
    counterfactual_prompt_tokens: int | None = None  # the writer's
    counterfactual_completion_tokens: int | None = None  # the writer's
    token_source: str | None = None  # the writer's, unless the request estimated its usage
    latency_tax_ms: float = 0.0  # the writer's
    # 0003_keys
    key_name: str | None = None
    # 0004_prediction
    predicted_local_ms: float | None = None
    actual_local_ms: float | None = None
    backend: str | None = None
    predicted_completion_tokens: int | None = None
    # 0006_attempts
    upstream_attempts: int | None = None
    usage_invalid: str | None = None  # the writer's

    def as_dict(self) -> dict[str, Any]:
        """Every column by name, for the writer, the pricing and the router."""
        return {column: getattr(self, column) for column in COLUMNS}


COLUMNS = tuple(f.name for f in fields(LedgerRow))
COUNT_UPDATE = (
    "UPDATE requests SET counterfactual_prompt_tokens = ?, counterfactual_completion_tokens = ?, "
    "token_source = ?, counterfactual_cost_pusd = ? WHERE id = ?"
)


def result(future: Future[tuple[int, int]] | None) -> tuple[int, int] | None:
    """A finished count, or None (none asked, still running, failed or cancelled)."""
    if future is None or not future.done() or future.cancelled() or future.exception():
        return None
    return future.result()


def row_values(
    given: dict[str, Any],
    count: Future[tuple[int, int]] | None,
    prices: PriceBook,
    columns: tuple[str, ...],
) -> tuple[tuple[Any, ...], bool, str]:
    """(values in ``columns`` order, whether they are final, the invalid usage fields).

    Not final: the counterfactual count is still running and the local model's count stands in
    (the writer updates the row when it arrives)."""
    row = dict(given)
    invalid = check_usage(row)
    final = True
    if row.get("route") == "api":
        row["latency_tax_ms"] = round(float(row.get("local_ms") or 0.0), 2)
        if row.get("prompt_tokens") is not None:
            row["counterfactual_prompt_tokens"] = row["prompt_tokens"]
            row["counterfactual_completion_tokens"] = row.get("completion_tokens") or 0
            # The provider's usage, or the proxy's estimate of it (``usage_estimated``,
            # ``worst_case``: see proxy/http/charges.py), as the request said.
            row["token_source"] = row.get("token_source") or "usage"
    else:
        row["latency_tax_ms"] = 0.0
        counted = result(count)
        if counted is not None:
            row["counterfactual_prompt_tokens"], row["counterfactual_completion_tokens"] = counted
            row["token_source"] = "tokenizer"
        elif row.get("prompt_tokens") is not None:
            row["counterfactual_prompt_tokens"] = row["prompt_tokens"]
            row["counterfactual_completion_tokens"] = row.get("completion_tokens") or 0
            row["token_source"] = "local"
            final = count is None or count.done()
    apply_costs(row, prices)
    distrust_costs(row, invalid)
    invalid += check_money(row)
    if invalid:
        row["usage_invalid"] = ",".join(invalid)
    return tuple(row.get(column) for column in columns), final, ",".join(invalid)


def count_update(
    given: dict[str, Any], counted: tuple[int, int], rowid: int, prices: PriceBook
) -> tuple[Any, ...]:
    """The parameters of :data:`COUNT_UPDATE` for a row whose count arrived after it was written."""
    row = dict(given)
    row["counterfactual_prompt_tokens"], row["counterfactual_completion_tokens"] = counted
    apply_costs(row, prices)
    return (*counted, "tokenizer", row["counterfactual_cost_pusd"], rowid)
