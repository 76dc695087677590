"""Model prices, as exact integers.

Prices come from the price map that ships inside the litellm package
(``model_prices_and_context_window_backup.json``), read from disk once at start-up: the map is the
same data ``litellm.model_cost`` holds with ``LITELLM_LOCAL_MODEL_COST_MAP=True``, without the
four seconds it takes to import litellm. Costs are integer pico-dollars (1e-12 USD): a price of
$0.15 per million tokens is exactly 150,000 pico-dollars per token, so sums are exact.
"""

from __future__ import annotations

import importlib.util
import json
import os
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

PICO = Decimal(10) ** 12
PRICE_MAP_FILE = "model_prices_and_context_window_backup.json"


@dataclass(frozen=True, kw_only=True)
class Price:
    """Per-token prices in integer pico-dollars."""

    input: int
    output: int
    cached_input: int | None = None

    def cost(self, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> int:
        cached = min(cached_tokens, prompt_tokens) if self.cached_input is not None else 0
        fresh = prompt_tokens - cached
        return (
            fresh * self.input + cached * (self.cached_input or 0) + completion_tokens * self.output
        )


def _pico(value: Any) -> int:
    return int(Decimal(str(value)) * PICO)


def load_price_map() -> dict[str, Any]:
    """The price map from the installed litellm package, without importing litellm."""
    spec = importlib.util.find_spec("litellm")
    if spec is None or not spec.submodule_search_locations:
        return {}
    path = os.path.join(list(spec.submodule_search_locations)[0], PRICE_MAP_FILE)
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


class PriceBook:
    """Looks up the price of a model name as a client would write it."""

    def __init__(self, price_map: dict[str, Any], overrides: dict[str, Price] | None = None):
        self._map = price_map
        self._overrides = overrides or {}
        self._cache: dict[str, Price | None] = {}

    def price(self, model: str) -> Price | None:
        if model in self._cache:
            return self._cache[model]
        found = self._lookup(model)
        self._cache[model] = found
        return found

    def _lookup(self, model: str) -> Price | None:
        if model in self._overrides:
            return self._overrides[model]
        candidates = [model]
        if "/" in model:
            candidates.append(model.split("/", 1)[1])
        for name in candidates:
            entry = self._map.get(name)
            if isinstance(entry, dict) and "input_cost_per_token" in entry:
                cached = entry.get("cache_read_input_token_cost")
                return Price(
                    input=_pico(entry.get("input_cost_per_token", 0)),
                    output=_pico(entry.get("output_cost_per_token", 0)),
                    cached_input=_pico(cached) if cached is not None else None,
                )
        return None

    def cost(
        self, model: str, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0
    ) -> int | None:
        """Cost in pico-dollars, or None when the model has no known price."""
        price = self.price(model)
        if price is None:
            return None
        return price.cost(prompt_tokens, completion_tokens, cached_tokens)


def usd(pico: int | None) -> Decimal | None:
    return None if pico is None else Decimal(pico) / PICO
