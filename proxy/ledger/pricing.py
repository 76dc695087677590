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

What a call is billed beyond its text tokens (:class:`Billed`) is priced from the map too:

- The service tier (``service_tier``: ``priority``, ``flex``; ``batch`` for deferred work) has
  its own rates, the map's ``*_cost_per_token_priority`` / ``_flex`` / ``_batches`` (cached
  prompt tokens: ``cache_read_input_token_cost_*``). Where the map has none, ``flex`` and
  ``batch`` cost half the standard rate (:data:`DISCOUNT_DIVISOR`, what OpenAI charges them)
  and ``priority`` twice it (:data:`PRIORITY_BOUND`, at or above every priority rate the map
  lists, 1.7 to 2 times): never the standard rate silently. Any other tier (``auto``,
  ``default``) is the standard rate.
- Audio tokens (usage's ``prompt_tokens_details.audio_tokens``,
  ``completion_tokens_details.audio_tokens``, counted inside the prompt and completion
  tokens) cost ``input_cost_per_audio_token`` / ``output_cost_per_audio_token`` (per tier where
  the map says); a model without them is charged :data:`AUDIO_INPUT_BOUND` /
  :data:`AUDIO_OUTPUT_BOUND`, above every audio rate in the map, never the text rate.
- A web search costs the map's ``search_context_cost_per_query`` for the request's
  ``search_context_size`` (``medium`` unless it says), or :data:`SEARCH_BOUND` where the map
  has none.

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

from proxy.protocol.params import LOCAL_ALIAS

if TYPE_CHECKING:
    from proxy.config import ModelPrice

log = structlog.get_logger(__name__)

PUSD_PER_USD = 10**12  # the ledger counts money in integer pico-dollars
PICO = Decimal(PUSD_PER_USD)  # the same, for exact division
PRICE_MAP_FILE = "model_prices_and_context_window_backup.json"

TIER_SUFFIXES = {"priority": "_priority", "flex": "_flex", "batch": "_batches"}
"""The service tiers with rates of their own, and the suffix of their fields in the map."""
DISCOUNT_DIVISOR = 2
"""``flex`` and ``batch`` where the map has no rate of theirs: the standard rate halved."""
PRIORITY_BOUND = 2
"""``priority`` where the map has no rate of its own: twice the standard rate (the map's
priority rates are 1.7 to 2 times the standard ones, e.g. gpt-4o-mini $0.25/M against $0.15/M)."""
AUDIO_INPUT_BOUND = 100_000_000
"""Pico-dollars per prompt audio token of a model the map gives no audio rate: $100/M, above
every ``input_cost_per_audio_token`` in the map (the highest is $44/M)."""
AUDIO_OUTPUT_BOUND = 200_000_000
"""Per completion audio token likewise: $200/M (the map's highest is $88/M)."""
SEARCH_BOUND = 50_000_000_000
"""Pico-dollars per web search of a model without ``search_context_cost_per_query``: $0.05,
above OpenAI's ($0.01 to $0.035 a call) and Gemini's grounding fees."""
SEARCH_SIZES = ("low", "medium", "high")
"""``search_context_size``'s values; ``medium`` is OpenAI's default."""


def service_tier(value: object) -> str | None:
    """The tier a ``service_tier`` value is priced at: ``priority``, ``flex``, ``batch``, or
    None for the standard rate (``auto``, ``default``, none given)."""
    return value if isinstance(value, str) and value in TIER_SUFFIXES else None


@dataclass(frozen=True, kw_only=True)
class Billed:
    """What one call is billed for besides its text tokens' standard rate."""

    tier: str | None = None  # a key of TIER_SUFFIXES, or None: the standard rate
    audio_prompt_tokens: int = 0  # of the prompt tokens, those that were audio
    audio_completion_tokens: int = 0  # of the completion tokens, those that were audio
    web_searches: int = 0
    search_context_size: str = "medium"


STANDARD = Billed()


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
        self._tiers: dict[str, dict[str, Price | None]] = {t: {} for t in TIER_SUFFIXES}
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

    def price(self, model: str, tier: str | None = None) -> Price | None:
        """The per-token price of ``model`` (None: unpriced) at ``tier`` (None: standard)."""
        if tier in self._tiers:
            cache = self._tiers[tier]
            if model in cache:
                return cache[model]
            standard = self.price(model)
            with self._lock:
                return _remember(cache, model, self._tiered(model, tier, standard))
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

    def _entry(self, model: str) -> dict[str, Any] | None:
        """The map's entry for ``model`` (as written, or without its provider prefix)."""
        for name in _candidates(model):
            entry = self._map.get(name)
            if name != "sample_spec" and isinstance(entry, dict):
                return entry
        return None

    def _tiered(self, model: str, tier: str, standard: Price | None) -> Price | None:
        """``standard`` at ``tier``: the map's rates of the tier where it has them, else the
        rule of the module's docstring (a ``[pricing]`` entry has no tier rates)."""
        if standard is None:
            return None
        entry = None if _overridden(model, self._overrides) else self._entry(model)
        suffix = TIER_SUFFIXES[tier]

        def rate(field: str, base: int | None) -> int | None:
            given = (entry or {}).get(field + suffix)
            if isinstance(given, int | float | str) and not isinstance(given, bool):
                return _pico(given)
            if base is None:
                return None
            return base * PRIORITY_BOUND if tier == "priority" else base // DISCOUNT_DIVISOR

        return Price(
            input=rate("input_cost_per_token", standard.input) or 0,
            output=rate("output_cost_per_token", standard.output) or 0,
            cached_input=rate("cache_read_input_token_cost", standard.cached_input),
        )

    def audio_rates(self, model: str, tier: str | None = None) -> tuple[int, int]:
        """(prompt, completion) pico-dollars per audio token of ``model`` at ``tier``: the
        map's, else :data:`AUDIO_INPUT_BOUND` / :data:`AUDIO_OUTPUT_BOUND`."""
        entry = self._entry(model) or {}
        suffix = TIER_SUFFIXES.get(tier or "", "")
        rates = []
        for field, bound in (
            ("input_cost_per_audio_token", AUDIO_INPUT_BOUND),
            ("output_cost_per_audio_token", AUDIO_OUTPUT_BOUND),
        ):
            given = entry.get(field + suffix, entry.get(field))
            ok = isinstance(given, int | float) and not isinstance(given, bool) and given > 0
            rates.append(_pico(given) if ok else bound)
        return rates[0], rates[1]

    def search_fee(self, model: str, size: str = "medium") -> int:
        """Pico-dollars of one web search by ``model`` with ``search_context_size`` ``size``:
        the map's ``search_context_cost_per_query``, else :data:`SEARCH_BOUND`."""
        fees = (self._entry(model) or {}).get("search_context_cost_per_query")
        if isinstance(fees, dict):
            fee = fees.get(f"search_context_size_{size if size in SEARCH_SIZES else 'medium'}")
            if isinstance(fee, int | float) and not isinstance(fee, bool) and fee >= 0:
                return _pico(fee)
        return SEARCH_BOUND

    def cost(
        self,
        model: str,
        prompt_tokens: int,
        completion_tokens: int,
        cached_tokens: int = 0,
        billed: Billed = STANDARD,
    ) -> int | None:
        """Cost in pico-dollars, or None when the model has no known price. ``billed``: its
        tier, its audio tokens (inside the prompt and completion counts) and web searches."""
        price = self.price(model, billed.tier)
        if price is None:
            return None
        audio_in = min(max(0, billed.audio_prompt_tokens), prompt_tokens)
        audio_out = min(max(0, billed.audio_completion_tokens), completion_tokens)
        total = price.cost(
            prompt_tokens - audio_in,
            completion_tokens - audio_out,
            min(cached_tokens, prompt_tokens - audio_in),
        )
        if audio_in or audio_out:
            rate_in, rate_out = self.audio_rates(model, billed.tier)
            total += audio_in * rate_in + audio_out * rate_out
        if billed.web_searches > 0:
            total += billed.web_searches * self.search_fee(model, billed.search_context_size)
        return total

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


def _overridden(model: str, overrides: Mapping[str, Price]) -> bool:
    """Whether a ``[pricing]`` entry, not the map, prices ``model``."""
    return any(name in overrides for name in _candidates(model))


def _candidates(model: str) -> list[str]:
    """The names a model is looked up by: as written, then without a ``provider/`` prefix."""
    if "/" in model:
        return [model, model.split("/", 1)[1]]
    return [model]


def billed_of(row: Mapping[str, Any]) -> Billed:
    """What a ledger row says its call was billed for besides text at the standard rate."""
    return Billed(
        tier=service_tier(row.get("service_tier")),
        audio_prompt_tokens=int(row.get("audio_prompt_tokens") or 0),
        audio_completion_tokens=int(row.get("audio_completion_tokens") or 0),
        web_searches=int(row.get("web_searches") or 0),
        search_context_size=str(row.get("search_context_size") or "medium"),
    )


def requested_billing(
    body: Mapping[str, Any], completion_tokens: int, window: int | None = None
) -> Billed:
    """The most a request's call can be billed for besides text at the standard rate, for its
    reservation: the ``service_tier`` it asks for; a whole input ``window`` of audio tokens per
    ``input_audio`` part (what the reservation counts it as); all ``completion_tokens`` as
    audio when its ``modalities`` include audio; one web search for chat's
    ``web_search_options``, and for a Responses call's web search tools ``max_tool_calls``
    searches, else one per such tool."""
    size = None
    options = body.get("web_search_options")
    searches = 1 if isinstance(options, dict) else 0
    if isinstance(options, dict):
        size = options.get("search_context_size")
    tools = body.get("tools")
    searching = [
        t
        for t in (tools if isinstance(tools, list) else [])
        if isinstance(t, dict) and str(t.get("type", "")).startswith("web_search")
    ]
    if searching:
        calls = body.get("max_tool_calls")
        many = calls if isinstance(calls, int) and calls > 0 else len(searching)
        searches += many
        sizes = [t.get("search_context_size") for t in searching]
        size = "high" if "high" in sizes else size or next((z for z in sizes if z), None)
    modalities = body.get("modalities")
    audio = isinstance(modalities, list) and "audio" in modalities
    return Billed(
        tier=service_tier(body.get("service_tier")),
        audio_prompt_tokens=_audio_parts(body) * (window or 0),
        audio_completion_tokens=completion_tokens if audio else 0,
        web_searches=searches,
        search_context_size=size if size in SEARCH_SIZES else "medium",
    )


def _audio_parts(body: Mapping[str, Any]) -> int:
    """The ``input_audio`` content parts of a chat or Responses body's messages."""
    count = 0
    for field in ("messages", "input"):
        items = body.get(field)
        for item in items if isinstance(items, list) else []:
            parts = item.get("content") if isinstance(item, dict) else None
            for part in parts if isinstance(parts, list) else []:
                count += isinstance(part, dict) and part.get("type") == "input_audio"
    return count


def apply_costs(row: dict[str, Any], book: PriceBook) -> None:
    """Fill ``api_cost_pusd`` and ``counterfactual_cost_pusd`` of a ledger row.

    - paid: the provider's usage of an API call priced at the API model (cached prompt tokens at
      the cached rate), at the row's ``service_tier``, its audio tokens at the audio rates and
      its ``web_searches`` at the search fee (:func:`billed_of`); 0 when no API call was made;
      None when the API model is unpriced or the provider reported no usage.
    - counterfactual: the counterfactual tokens priced at the requested model, at the same tier
      (and, for an API answer, with the same audio and searches); 0 for the model ``local`` (it
      never had an API counterpart); None for a failed request, an unpriced model, or an API
      call whose own cost is unknown (its saving cannot be computed).
    """
    route, ok = row.get("route"), int(row.get("status") or 0) < 400
    requested = row.get("requested_model") or ""
    api_model = row.get("api_model") or requested
    cached = int(row.get("cached_tokens") or 0)
    billed = billed_of(row)
    paid: int | None = 0
    if route == "api":
        prompt, completion = row.get("prompt_tokens"), row.get("completion_tokens")
        paid = None
        if prompt is not None:
            paid = book.cost(api_model, prompt, completion or 0, cached, billed)
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
            billed if route == "api" else Billed(tier=billed.tier),
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
