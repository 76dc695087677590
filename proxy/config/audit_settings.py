"""``[audit]``: the settings of shadow audits, validated when they are made.

The config loader coerces each TOML value to the field's type and builds
:class:`AuditSettings`; the ranges are checked here, so that a dataclass made in code is held to
the same rules. A bad value raises :class:`~proxy.errors.ConfigError` naming the key.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import ROUND_HALF_EVEN, Decimal

from proxy.errors import ConfigError

CORRECTNESS = ("strict", "content")
"""``strict``: the right content and every explicit format instruction of the request (what a
parsing pipeline needs). ``content``: the right content in any form (what a reader needs)."""

# The ledger's unit (proxy.ledger.pricing.PUSD_PER_USD); these settings sit below the ledger in
# the import layers (they are built by the config loader), so they cannot import it from there.
PICO_PER_USD = 10**12


@dataclass(frozen=True, kw_only=True)
class AuditSettings:
    rate: float = 0.02  # share of local attempts audited (0 = off, 1 = all)
    monthly_budget_usd: float = 5.0  # audits stop for the month when their spend reaches this
    judge_model: str = ""  # "" = the requested model
    correctness: str = "strict"  # "strict" | "content"
    max_pending: int = 64  # a full audit queue skips audits; it never slows a client

    def __post_init__(self) -> None:
        _number("rate", self.rate)
        if not 0.0 <= self.rate <= 1.0:
            raise ConfigError(f"[audit] rate = {self.rate!r}: expected a share from 0 to 1")
        _number("monthly_budget_usd", self.monthly_budget_usd)
        if self.monthly_budget_usd < 0:
            raise ConfigError(
                f"[audit] monthly_budget_usd = {self.monthly_budget_usd!r}: "
                "expected a number of dollars, 0 or more"
            )
        if not isinstance(self.judge_model, str):
            raise ConfigError(f"[audit] judge_model = {self.judge_model!r}: expected a string")
        if self.correctness not in CORRECTNESS:
            raise ConfigError(
                f"[audit] correctness = {self.correctness!r}: expected one of "
                + ", ".join(f'"{c}"' for c in CORRECTNESS)
            )
        if not isinstance(self.max_pending, int) or isinstance(self.max_pending, bool):
            raise ConfigError(f"[audit] max_pending = {self.max_pending!r}: expected an integer")
        if self.max_pending < 1:
            raise ConfigError(
                f"[audit] max_pending = {self.max_pending!r}: expected 1 or more "
                "(set rate = 0 to turn audits off)"
            )

    @property
    def enabled(self) -> bool:
        """Audits can happen at all: a positive rate and a positive budget."""
        return self.rate > 0 and self.monthly_budget_usd > 0

    @property
    def monthly_budget_pusd(self) -> int:
        """The monthly budget in integer pico-dollars (exact, never a float sum)."""
        usd = Decimal(str(self.monthly_budget_usd))
        return int((usd * PICO_PER_USD).to_integral_value(rounding=ROUND_HALF_EVEN))

    def judge_for(self, requested_model: str) -> str:
        """The model that judges an audit of a request for ``requested_model``."""
        return self.judge_model or requested_model


def _number(key: str, value: object) -> None:
    if (
        not isinstance(value, int | float)
        or isinstance(value, bool)
        or not math.isfinite(float(value))
    ):
        raise ConfigError(f"[audit] {key} = {value!r}: expected a number")
