"""Model prices as exact integers and the cost of one ledger row.

Prices come from the price map that ships inside the litellm package
(``model_prices_and_context_window_backup.json``), read from disk once at start-up. It is the
same data ``litellm.model_cost`` holds with ``LITELLM_LOCAL_MODEL_COST_MAP=True`` (nothing is
fetched), without the seconds it takes to import litellm on the request path's process start.
``[pricing."<model>"]`` entries of the config win over the map.

Costs are integer pico-dollars (1e-12 USD): $0.15 per million tokens is exactly 150,000
pico-dollars per token, so every sum is exact. (A few map entries carry float noise below a
pico-dollar, e.g. 2.9999900000000002e-06; they are rounded to the nearest pico-dollar.)

A model with no known price is *unpriced*: its costs stay NULL in the ledger, never $0. The first
time a model is found unpriced a warning is logged, and ``frugal report`` lists it.

The usage figures a row is priced on are checked in :mod:`proxy.ledger.writing.usage`; the
counterfactual token counts come from :mod:`proxy.ledger.writing.tokens`.
"""

from __future__ import annotations

import importlib.util
import json
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import ROUND_HALF_EVEN, Decimal
from typing import TYPE_CHECKING, Any, TypeVar

import structlog

from proxy.params import LOCAL_ALIAS

if TYPE_CHECKING:
    from proxy.config import ModelPrice

log = structlog.get_logger(__name__)

PUSD_PER_USD = 10**12  # the ledger counts money in integer pico-dollars
PICO = Decimal(PUSD_PER_USD)  # the same, for exact division
PRICE_MAP_FILE = "model_prices_and_context_window_backup.json"


@dataclass(frozen=True, kw_only=True)
class Price:
    """Per-token prices in integer pico-dollars."""

    input: int
    output: int
    cached_input: int | None = None
    """Price of a prompt token served from the provider's cache; None: the input price."""

    def cost(self, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> int:
        cached = min(cached_tokens, prompt_tokens) if self.cached_input is not None else 0
        fresh = prompt_tokens - cached
        return (
            fresh * self.input + cached * (self.cached_input or 0) + completion_tokens * self.output
        )


def _pico(usd: Any) -> int:
    """USD (a float or a string from the map) as the nearest whole number of pico-dollars."""
    return int((Decimal(str(usd)) * PICO).to_integral_value(rounding=ROUND_HALF_EVEN))


def pico_per_token(usd_per_mtok: float) -> int:
    """USD per million tokens (as written in the config) as pico-dollars per token."""
    return int((Decimal(str(usd_per_mtok)) * 10**6).to_integral_value(rounding=ROUND_HALF_EVEN))


def usd(pico: int | None) -> Decimal | None:
    return None if pico is None else Decimal(pico) / PICO


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


_V = TypeVar("_V")
MAX_CACHED_PRICES = 1024
"""Model names whose lookup is kept; past it the oldest is dropped (clients choose the names)."""


class PriceBook:
    """Looks up the price of a model name as a client (or the fallback mapping) writes it.

    The lookups are cached, at most :data:`MAX_CACHED_PRICES` names: a client that sends a new
    model name with each request grows nothing without bound. A dropped unpriced name is warned
    about again when it returns.
    """

    def __init__(self, price_map: Mapping[str, Any], overrides: Mapping[str, Price] | None = None):
        self._map = price_map
        self._overrides = dict(overrides or {})
        self._cache: dict[str, Price | None] = {}
        # The output limits looked up, kept as the prices are (the reservation asks each time).
        self._limits: dict[str, int | None] = {}
        self._windows: dict[str, int | None] = {}
        self._lock = threading.Lock()  # the request path and the ledger's writer both ask

    @classmethod
    def from_settings(
        cls, price_map: Mapping[str, Any], pricing: Mapping[str, ModelPrice]
    ) -> PriceBook:
        overrides = {
            model: Price(
                input=pico_per_token(p.input_per_mtok),
                output=pico_per_token(p.output_per_mtok),
                cached_input=(
                    None
                    if p.cached_input_per_mtok is None
                    else pico_per_token(p.cached_input_per_mtok)
                ),
            )
            for model, p in pricing.items()
        }
        return cls(price_map, overrides)

    def price(self, model: str) -> Price | None:
        if model in self._cache:
            return self._cache[model]
        with self._lock:
            if model in self._cache:
                return self._cache[model]
            found = _remember(self._cache, model, self._lookup(model))
        if found is None and model:
            log.warning(
                "unpriced_model",
                model=model,
                detail="no price in litellm's map nor in [pricing]; its requests are reported "
                f'as unpriced, not $0. Add [pricing."{model}"] to the config to price them',
            )
        return found

    def max_output_tokens(self, model: str) -> int | None:
        """The most tokens one answer of ``model`` can hold, from the map's
        ``max_output_tokens``; None when the map does not say (a model priced only in
        ``[pricing]``, which has no such field, or a name the map does not know).

        A budget reserves this for a request that names no ``max_tokens``: the provider stops
        the answer there, so no answer can cost more."""
        return self._limit(self._limits, model, "max_output_tokens")

    def max_input_tokens(self, model: str) -> int | None:
        """The most tokens ``model`` reads in one call (its context window), from the map's
        ``max_input_tokens``; None when the map does not say.

        A budget reserves it for what a request's bytes cannot measure (a file, a built-in
        tool's results): none of it can pass the window."""
        return self._limit(self._windows, model, "max_input_tokens")

    def _limit(self, cache: dict[str, int | None], model: str, field: str) -> int | None:
        """The map's ``field`` for ``model``, looked up once and kept in ``cache``."""
        if model in cache:
            return cache[model]
        with self._lock:
            if model not in cache:
                _remember(cache, model, self._lookup_limit(model, field))
            return cache[model]

    def _lookup_limit(self, model: str, field: str) -> int | None:
        for name in _candidates(model):
            entry = self._map.get(name)
            if name == "sample_spec" or not isinstance(entry, dict):
                continue
            limit = entry.get(field)
            # bool is an int too; a limit must be a positive whole number to be believed
            if isinstance(limit, int) and not isinstance(limit, bool) and limit > 0:
                return limit
        return None

    def _lookup(self, model: str) -> Price | None:
        if model in self._overrides:
            return self._overrides[model]
        for name in _candidates(model):
            if name in self._overrides:
                return self._overrides[name]
            entry = self._map.get(name)
            if (
                name != "sample_spec"
                and isinstance(entry, dict)
                and "input_cost_per_token" in entry
            ):
                cached = entry.get("cache_read_input_token_cost")
                return Price(
                    input=_pico(entry.get("input_cost_per_token") or 0),
                    output=_pico(entry.get("output_cost_per_token") or 0),
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

    def counterfactual_model(self, requested: str, api_model: str | None) -> str:
        """The model whose price the counterfactual uses: the one the client asked for, or, when
        that name is only an alias of the ``[fallback] models`` mapping, the mapped target."""
        if api_model and api_model != requested and self.price(requested) is None:
            return api_model
        return requested


def _remember(cache: dict[str, _V], model: str, value: _V) -> _V:
    """Keep ``value`` for ``model`` in ``cache``, the oldest name dropped past
    :data:`MAX_CACHED_PRICES`; returns it."""
    if len(cache) >= MAX_CACHED_PRICES:
        del cache[next(iter(cache))]
    cache[model] = value
    return value


def _candidates(model: str) -> list[str]:
    """The names a model is looked up by: as written, then without a ``provider/`` prefix."""
    if "/" in model:
        return [model, model.split("/", 1)[1]]
    return [model]


def apply_costs(row: dict[str, Any], book: PriceBook) -> None:
    """Fill ``api_cost_pusd`` and ``counterfactual_cost_pusd`` of a ledger row.

    - paid: the provider's usage of an API call priced at the API model (cached prompt tokens at
      the cached rate); 0 when no API call was made; None when the API model is unpriced or the
      provider reported no usage.
    - counterfactual: the counterfactual tokens priced at the requested model; 0 for the model
      ``local`` (it never had an API counterpart); None for a failed request, an unpriced model,
      or an API call whose own cost is unknown (its saving cannot be computed).
    """
    route, ok = row.get("route"), int(row.get("status") or 0) < 400
    requested = row.get("requested_model") or ""
    api_model = row.get("api_model") or requested
    cached = int(row.get("cached_tokens") or 0)
    paid: int | None = 0
    if route == "api":
        prompt, completion = row.get("prompt_tokens"), row.get("completion_tokens")
        paid = None
        if prompt is not None:
            paid = book.cost(api_model, prompt, completion or 0, cached)
    counterfactual: int | None = None
    cf_prompt = row.get("counterfactual_prompt_tokens")
    if not ok:
        counterfactual = None
    elif requested == LOCAL_ALIAS:
        counterfactual = 0
    elif cf_prompt is not None and not (route == "api" and paid is None):
        model = book.counterfactual_model(requested, row.get("api_model"))
        counterfactual = book.cost(
            model,
            cf_prompt,
            row.get("counterfactual_completion_tokens") or 0,
            cached if route == "api" else 0,
        )
    row["api_cost_pusd"] = paid
    row["counterfactual_cost_pusd"] = counterfactual


def estimate_costs(row: dict[str, Any], book: PriceBook) -> tuple[int | None, int | None]:
    """(paid, counterfactual) of a row as it stands, counting a local answer's tokens with the
    local model's tokenizer; for the log line and metrics, where a recount cannot wait."""
    probe = dict(row)
    if probe.get("prompt_tokens") is not None:
        probe["counterfactual_prompt_tokens"] = probe["prompt_tokens"]
        probe["counterfactual_completion_tokens"] = probe.get("completion_tokens") or 0
    apply_costs(probe, book)
    return probe["api_cost_pusd"], probe["counterfactual_cost_pusd"]
