"""Model prices as exact integers, counterfactual token counts, and the cost of one ledger row.

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

Counterfactual tokens: a local answer is counted again with the tokenizer of the model the client
asked for, through ``litellm.token_counter`` (for OpenAI models with tiktoken's own encoding of
that model: litellm's default is cl100k for every model, while gpt-4o and later use o200k).
Importing litellm takes seconds and counting costs CPU, so :class:`TokenCounter` does both on a
thread of its own, started with the ledger; the request path only hands it references.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import queue
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from decimal import ROUND_HALF_EVEN, Decimal
from typing import TYPE_CHECKING, Any

import structlog

if TYPE_CHECKING:
    from proxy.config import ModelPrice

log = structlog.get_logger(__name__)

PICO = Decimal(10) ** 12
PRICE_MAP_FILE = "model_prices_and_context_window_backup.json"
LOCAL_ALIAS = "local"
# tiktoken encodings that litellm ships in its package (TIKTOKEN_CACHE_DIR): no download needed.
BUNDLED_ENCODINGS = frozenset({"cl100k_base", "o200k_base"})


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


class PriceBook:
    """Looks up the price of a model name as a client (or the fallback mapping) writes it."""

    def __init__(self, price_map: Mapping[str, Any], overrides: Mapping[str, Price] | None = None):
        self._map = price_map
        self._overrides = dict(overrides or {})
        self._cache: dict[str, Price | None] = {}
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
            found = self._cache[model] = self._lookup(model)
        if found is None and model:
            log.warning(
                "unpriced_model",
                model=model,
                detail="no price in litellm's map nor in [pricing]; its requests are reported "
                f'as unpriced, not $0. Add [pricing."{model}"] to the config to price them',
            )
        return found

    def _lookup(self, model: str) -> Price | None:
        if model in self._overrides:
            return self._overrides[model]
        candidates = [model]
        if "/" in model:
            candidates.append(model.split("/", 1)[1])
        for name in candidates:
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


# -- usage validation ---------------------------------------------------------------------

TOKEN_LIMIT = 2**31
"""Token counts are integers in [0, 2**31): no context window comes near it, and a figure
beyond it (an upstream reporting 2**70) cannot be a real count."""
INT64 = 2**63
TOKEN_FIELDS = (
    "prompt_tokens",
    "completion_tokens",
    "local_prompt_tokens",
    "local_completion_tokens",
    "cached_tokens",
    "counterfactual_prompt_tokens",
    "counterfactual_completion_tokens",
    "predicted_completion_tokens",
    "upstream_attempts",
)
MONEY_FIELDS = ("api_cost_pusd", "counterfactual_cost_pusd")
# NOT NULL in the schema: an impossible figure there is stored as 0 rather than NULL.
_ZERO_WHEN_INVALID = frozenset({"cached_tokens"})


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


def estimate_costs(row: dict[str, Any], book: PriceBook) -> tuple[int | None, int | None]:
    """(paid, counterfactual) of a row as it stands, counting a local answer's tokens with the
    local model's tokenizer; for the log line and metrics, where a recount cannot wait."""
    probe = dict(row)
    if probe.get("prompt_tokens") is not None:
        probe["counterfactual_prompt_tokens"] = probe["prompt_tokens"]
        probe["counterfactual_completion_tokens"] = probe.get("completion_tokens") or 0
    apply_costs(probe, book)
    return probe["api_cost_pusd"], probe["counterfactual_cost_pusd"]


# -- counterfactual tokens --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CountJob:
    """A local answer to count with the requested model's tokenizer. It holds references only:
    the texts are read on the counter's thread, never copied on the request path."""

    model: str
    body: Mapping[str, Any]
    """The chat request: its ``messages`` and ``tools`` are the prompt."""
    completion: Mapping[str, Any]
    """The local ``chat.completion``: every choice's content and tool calls are the answer."""


def completion_texts(completion: Mapping[str, Any]) -> list[str]:
    texts: list[str] = []
    for choice in completion.get("choices") or []:
        message = choice.get("message") or {}
        if isinstance(message.get("content"), str) and message["content"]:
            texts.append(message["content"])
        for call in message.get("tool_calls") or []:
            function = call.get("function") or {}
            texts.append(str(function.get("name") or "") + str(function.get("arguments") or ""))
    return texts


class TokenCounter:
    """Counts tokens with ``litellm.token_counter`` on one daemon thread of its own.

    :meth:`start` imports litellm on that thread; :meth:`submit` queues a :class:`CountJob` and
    returns a :class:`~concurrent.futures.Future` of ``(prompt_tokens, completion_tokens)``. The
    thread is a daemon, so a tokenizer stuck on a download never holds up the process's exit.
    """

    def __init__(self, loader: Callable[[], Any] | None = None) -> None:
        self._loader = loader or _import_litellm
        self._jobs: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]] | None] = (
            queue.SimpleQueue()
        )
        self._thread: threading.Thread | None = None
        self._litellm: Any = None
        self._encodings: dict[str, Any] = {}
        self.ready: Future[None] = Future()
        self.failures = 0

    def start(self) -> Future[None]:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="frugal-tokens", daemon=True)
            self._thread.start()
            self._call(self._load, self.ready)
        return self.ready

    def submit(self, job: CountJob) -> Future[tuple[int, int]]:
        future: Future[tuple[int, int]] = Future()
        if self._thread is None:
            future.set_exception(RuntimeError("TokenCounter.start() was not called"))
            return future
        self._call(lambda: self.count(job), future)
        return future

    def close(self) -> None:
        if self._thread is not None:
            self._jobs.put(None)
            self._thread = None

    def count(self, job: CountJob) -> tuple[int, int]:
        """Count now, on the calling thread: (prompt tokens, completion tokens)."""
        litellm = self._load()
        tokenizer = self._tokenizer(job.model)
        messages = list(job.body.get("messages") or [])
        tools = job.body.get("tools") or None
        prompt = int(
            litellm.token_counter(
                model=job.model, messages=messages, tools=tools, custom_tokenizer=tokenizer
            )
        )
        completion = 0
        for text in completion_texts(job.completion):
            completion += int(
                litellm.token_counter(
                    model=job.model,
                    text=text,
                    count_response_tokens=True,
                    custom_tokenizer=tokenizer,
                )
            )
        return prompt, completion

    def _call(self, fn: Callable[[], Any], future: Future[Any]) -> None:
        self._jobs.put((fn, future))

    def _run(self) -> None:
        while True:
            item = self._jobs.get()
            if item is None:
                return
            fn, future = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn())
            except BaseException as exc:  # noqa: BLE001 - handed to whoever waits on it
                self.failures += 1
                future.set_exception(exc)

    def _load(self) -> Any:
        if self._litellm is None:
            litellm = self._loader()
            # The first count loads litellm's bundled tiktoken files (and points tiktoken there).
            litellm.token_counter(model="gpt-4o-mini", text="warm up", count_response_tokens=True)
            self._litellm = litellm
        return self._litellm

    def _tokenizer(self, model: str) -> dict[str, Any] | None:
        """tiktoken's encoding of an OpenAI model (None: litellm picks the tokenizer)."""
        name = model.removeprefix("openai/")
        if name not in self._encodings:
            encoding = None
            try:
                import tiktoken

                if tiktoken.encoding_name_for_model(name) in BUNDLED_ENCODINGS:
                    encoding = tiktoken.encoding_for_model(name)
            except (ImportError, KeyError, ValueError):
                encoding = None
            self._encodings[name] = (
                None if encoding is None else {"type": "openai_tokenizer", "tokenizer": encoding}
            )
        return self._encodings[name]  # type: ignore[no-any-return]


def _import_litellm() -> Any:
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    litellm: Any = importlib.import_module("litellm")
    litellm.suppress_debug_info = True
    return litellm
