"""One ledger row's values as the writer stores them (its columns are
:class:`~proxy.ledger.writing.ledger_row.LedgerRow`'s, re-exported here).

:func:`row_values` turns what a request handed to :meth:`Ledger.record` into the values of
the ``requests`` columns: the counterfactual tokens (the provider's usage for an API answer,
the requested model's tokenizer for a local one, or the local model's own count while the
tokenizer is still running), the latency tax, the costs in pico-dollars, and the usage figures
that could not be true (stored as NULL and named in ``usage_invalid``). It is pure: the writer
keeps the counts and the log lines.
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

from proxy.ledger.pricing import PriceBook, apply_costs
from proxy.ledger.writing.ledger_row import COLUMNS, LedgerRow
from proxy.ledger.writing.usage import check_money, check_usage, distrust_costs

__all__ = ["COLUMNS", "COUNT_UPDATE", "LedgerRow", "count_update", "result", "row_values"]

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
    given: LedgerRow,
    count: Future[tuple[int, int]] | None,
    prices: PriceBook,
    columns: tuple[str, ...],
) -> tuple[tuple[Any, ...], bool, str]:
    """(values in ``columns`` order, whether they are final, the invalid usage fields).

    Not final: the counterfactual count is still running and the local model's count stands in
    (the writer updates the row when it arrives)."""
    row = given.as_dict()
    invalid = check_usage(row)
    final = True
    if row.get("route") == "api":
        row["latency_tax_ms"] = round(float(row.get("local_ms") or 0.0), 2)
        if row.get("prompt_tokens") is not None:
            row["counterfactual_prompt_tokens"] = row["prompt_tokens"]
            row["counterfactual_completion_tokens"] = row.get("completion_tokens") or 0
            # The provider's usage, or the proxy's estimate of it (``usage_estimated``,
            # ``worst_case``: see proxy/serving/charges.py), as the request said.
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
    given: LedgerRow, counted: tuple[int, int], rowid: int, prices: PriceBook
) -> tuple[Any, ...]:
    """The parameters of :data:`COUNT_UPDATE` for a row whose count arrived after it was written."""
    row = given.as_dict()
    row["counterfactual_prompt_tokens"], row["counterfactual_completion_tokens"] = counted
    apply_costs(row, prices)
    return (*counted, "tokenizer", row["counterfactual_cost_pusd"], rowid)
