"""The ``requests`` table's columns, once: :class:`LedgerRow`, and :data:`COLUMNS` in order.

The writer's INSERT and COPY, the spill file, the usage checks and the report's seeding all
take the columns from here. Imports nothing of ``proxy``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

COUNT = {"check": "count"}
"""A count (tokens, attempts): an integer in [0, 2**31), else stored as unknown."""
MONEY = {"check": "money"}
"""Pico-dollars: an integer that fits int64, else stored as unknown."""


@dataclass(frozen=True, kw_only=True, slots=True)
class LedgerRow:
    """One row of the ``requests`` table: the only list of its columns in Python.

    Fields are the columns, in the table's order (``id`` is the database's). A field that is
    ``NOT NULL`` in the schema has a type without ``None``; a schema default is the field's
    default. The request fills the facts (:mod:`proxy.serving.record`); the writer fills the
    rest (the counterfactual tokens, ``token_source`` unless the request set it, the latency
    tax, the costs and ``usage_invalid``: see :func:`proxy.ledger.writing.rows.row_values`).
    A new column is a field here and a migration in each of ``migrations/`` and
    ``migrations/postgres/``; ``tests/ledger/test_ledger_row.py`` holds the three to each
    other. A field marked :data:`COUNT` or :data:`MONEY` is checked before it is stored
    (:mod:`proxy.ledger.writing.usage`).
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
    prompt_tokens: int | None = field(default=None, metadata=COUNT)
    completion_tokens: int | None = field(default=None, metadata=COUNT)
    local_prompt_tokens: int | None = field(default=None, metadata=COUNT)
    local_completion_tokens: int | None = field(default=None, metadata=COUNT)
    latency_ms: float
    local_ms: float = 0.0
    api_ms: float = 0.0
    api_cost_pusd: int | None = field(default=None, metadata=MONEY)  # the writer's
    counterfactual_cost_pusd: int | None = field(default=None, metadata=MONEY)  # the writer's
    error: str | None = None
    # 0002_costs
    api_model: str | None = None
    cached_tokens: int = field(default=0, metadata=COUNT)
    # the writer's: the counterfactual tokens (the provider's usage, or a tokenizer's count)
    counterfactual_prompt_tokens: int | None = field(default=None, metadata=COUNT)
    counterfactual_completion_tokens: int | None = field(default=None, metadata=COUNT)
    token_source: str | None = None  # the writer's, unless the request estimated its usage
    latency_tax_ms: float = 0.0  # the writer's
    # 0003_keys
    key_name: str | None = None
    # 0004_prediction
    predicted_local_ms: float | None = None
    actual_local_ms: float | None = None
    backend: str | None = None
    predicted_completion_tokens: int | None = field(default=None, metadata=COUNT)
    # 0006_attempts
    upstream_attempts: int | None = field(default=None, metadata=COUNT)
    usage_invalid: str | None = None  # the writer's
    # 0013_billed: what the call is billed for besides text at the standard rate
    service_tier: str | None = None  # priority | flex | batch; None: the standard rate
    audio_prompt_tokens: int = field(default=0, metadata=COUNT)
    audio_completion_tokens: int = field(default=0, metadata=COUNT)
    web_searches: int = field(default=0, metadata=COUNT)
    search_context_size: str | None = None  # None: medium
    # 0014_local_model: the model the local attempt ran (an answer names the asked one)
    local_model: str | None = None
    # 0017_deferred: the tier deferred work asked for (flex); None: interactive work
    deferred_tier: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """Every column by name, for the writer, the pricing and the router."""
        return {column: getattr(self, column) for column in COLUMNS}


COLUMNS = tuple(f.name for f in fields(LedgerRow))
COUNT_COLUMNS = tuple(f.name for f in fields(LedgerRow) if f.metadata == COUNT)
MONEY_COLUMNS = tuple(f.name for f in fields(LedgerRow) if f.metadata == MONEY)
NOT_NULL_COUNTS = frozenset(
    f.name for f in fields(LedgerRow) if f.metadata == COUNT and f.default is not None
)
"""Counts that are NOT NULL in the schema (their default is 0): an impossible one is stored as 0."""
