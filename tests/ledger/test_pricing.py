"""Prices as exact integers, the [pricing] overrides, the cost rules of a row, token counting."""

from __future__ import annotations

import re
import tomllib
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest
import structlog
import tiktoken

from proxy import config
from proxy.errors import ConfigError
from proxy.ledger.pricing import (
    AUDIO_INPUT_BOUND,
    AUDIO_OUTPUT_BOUND,
    MAX_CACHED_PRICES,
    SEARCH_BOUND,
    Billed,
    Price,
    PriceBook,
    apply_costs,
    load_price_map,
    pico_per_token,
    requested_billing,
    service_tier,
)
from proxy.ledger.writing.tokens import CountJob, TokenCounter

EXAMPLE = Path(__file__).resolve().parents[2] / "config.example.toml"
QUESTION = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]


@pytest.fixture(scope="module")
def price_map() -> dict[str, Any]:
    return load_price_map()


@pytest.fixture(scope="module")
def counter() -> TokenCounter:
    tokens = TokenCounter()
    tokens.start().result(timeout=120)
    return tokens


def openai_prompt_tokens(encoding: str, messages: list[dict[str, str]]) -> int:
    """OpenAI's documented count: 3 per message, its role and content, and 3 for the reply."""
    enc = tiktoken.get_encoding(encoding)
    per_message = (3 + len(enc.encode(m["role"])) + len(enc.encode(m["content"])) for m in messages)
    return sum(per_message) + 3


# -- prices -------------------------------------------------------------------------------------


def test_litellm_map_prices_are_exact_pico_dollars_per_token(price_map: dict[str, Any]) -> None:
    book = PriceBook(price_map)
    # gpt-4o-mini: $0.15 / $0.60 per million tokens, cached input $0.075.
    assert book.price("gpt-4o-mini") == Price(input=150_000, output=600_000, cached_input=75_000)
    assert book.price("openai/gpt-4o-mini") == book.price("gpt-4o-mini")
    # 1,000,000 prompt and 1,000,000 completion tokens cost exactly $0.75.
    assert book.cost("gpt-4o-mini", 1_000_000, 1_000_000) == 750_000 * 10**6


def test_a_service_tier_is_priced_at_its_own_rates(price_map: dict[str, Any]) -> None:
    book = PriceBook(price_map)
    mini = price_map["gpt-4o-mini"]
    # priority: the map's rates ($0.25/M input against $0.15/M), never the standard ones
    assert book.price("gpt-4o-mini", "priority") == Price(
        input=250_000,
        output=pico_per_token(mini["output_cost_per_token_priority"] * 1e6),
        cached_input=pico_per_token(mini["cache_read_input_token_cost_priority"] * 1e6),
    )
    assert book.cost("gpt-4o-mini", 1000, 100, billed=Billed(tier="priority")) == (
        1000 * 250_000 + 100 * 1_000_000
    )
    # flex where the map has it (gpt-5), batch from the map's "_batches" fields
    gpt5 = price_map["gpt-5"]
    assert book.price("gpt-5", "flex") == Price(
        input=pico_per_token(gpt5["input_cost_per_token_flex"] * 1e6),
        output=pico_per_token(gpt5["output_cost_per_token_flex"] * 1e6),
        cached_input=pico_per_token(gpt5["cache_read_input_token_cost_flex"] * 1e6),
    )
    assert book.price("gpt-4o-mini", "batch") == Price(
        input=75_000, output=300_000, cached_input=75_000 // 2
    )
    # where the map has no rate of the tier: flex half the standard, priority twice it
    assert "input_cost_per_token_flex" not in mini
    assert book.price("gpt-4o-mini", "flex") == Price(
        input=75_000, output=300_000, cached_input=37_500
    )
    custom = PriceBook(price_map, {"my-model": Price(input=1_000, output=4_000)})
    assert custom.price("my-model", "priority") == Price(input=2_000, output=8_000)
    assert custom.price("my-model", "flex") == Price(input=500, output=2_000)
    assert custom.price("unknown-model", "priority") is None  # unpriced stays unpriced
    # the tiers a request can name; the rest is the standard rate
    assert [service_tier(v) for v in ("priority", "flex", "auto", "default", None, 3)] == [
        "priority",
        "flex",
        None,
        None,
        None,
        None,
    ]
    assert book.cost("gpt-4o-mini", 1000, 100, billed=Billed(tier=None)) == book.cost(
        "gpt-4o-mini", 1000, 100
    )


def test_audio_tokens_cost_the_audio_rate_or_a_bound_never_the_text_rate(
    price_map: dict[str, Any],
) -> None:
    book = PriceBook(price_map)
    audio = price_map["gpt-audio"]
    rate_in = pico_per_token(audio["input_cost_per_audio_token"] * 1e6)
    rate_out = pico_per_token(audio["output_cost_per_audio_token"] * 1e6)
    assert rate_out == 64_000_000  # $64/M, not the $10/M of its text
    billed = Billed(audio_prompt_tokens=300, audio_completion_tokens=200)
    text = book.price("gpt-audio")
    assert text is not None
    assert book.cost("gpt-audio", 1000, 500, billed=billed) == (
        700 * text.input + 300 * rate_in + 300 * text.output + 200 * rate_out
    )
    # a model the map gives no audio rate: the bound, above every audio rate in the map
    highest = max(
        (e.get(f) or 0)
        for e in price_map.values()
        if isinstance(e, dict)
        for f in ("input_cost_per_audio_token",)
    )
    assert AUDIO_INPUT_BOUND > pico_per_token(highest * 1e6)
    mini = book.price("gpt-4o-mini")
    assert mini is not None
    assert book.cost("gpt-4o-mini", 1000, 500, billed=billed) == (
        700 * mini.input + 300 * AUDIO_INPUT_BOUND + 300 * mini.output + 200 * AUDIO_OUTPUT_BOUND
    )


def test_web_searches_cost_the_maps_fee_per_context_size_or_a_bound(
    price_map: dict[str, Any],
) -> None:
    book = PriceBook(price_map)
    fees = price_map["gpt-4o-search-preview"]["search_context_cost_per_query"]
    base = book.cost("gpt-4o-search-preview", 100, 10)
    assert base is not None
    for size in ("low", "medium", "high"):
        fee = pico_per_token(fees[f"search_context_size_{size}"] * 1e6)  # USD a call
        two = Billed(web_searches=2, search_context_size=size)
        assert book.cost("gpt-4o-search-preview", 100, 10, billed=two) == base + 2 * fee
    assert book.search_fee("gpt-4o-search-preview", "bogus") == book.search_fee(
        "gpt-4o-search-preview", "medium"
    )
    assert "search_context_cost_per_query" not in price_map["gpt-4o"]
    assert book.search_fee("gpt-4o") == SEARCH_BOUND


def test_cached_prompt_tokens_cost_the_cached_rate_only_where_one_exists() -> None:
    with_cache = Price(input=150_000, output=600_000, cached_input=75_000)
    assert with_cache.cost(1000, 10, cached_tokens=800) == 200 * 150_000 + 800 * 75_000 + 6_000_000
    # More cached tokens than prompt tokens cannot make a prompt cheaper than all-cached.
    assert with_cache.cost(100, 0, cached_tokens=500) == 100 * 75_000
    without = Price(input=150_000, output=600_000)
    assert without.cost(1000, 10, cached_tokens=800) == 1000 * 150_000 + 10 * 600_000


def test_an_unknown_model_is_unpriced_and_warned_about_once(price_map: dict[str, Any]) -> None:
    book = PriceBook(price_map)
    with structlog.testing.capture_logs() as logs:
        assert book.price("my-finetune-v3") is None
        assert book.cost("my-finetune-v3", 100, 100) is None
        assert book.price("my-finetune-v3") is None
    warnings = [e for e in logs if e["event"] == "unpriced_model"]
    assert len(warnings) == 1
    assert warnings[0]["model"] == "my-finetune-v3"
    assert '[pricing."my-finetune-v3"]' in warnings[0]["detail"]


def test_the_price_cache_is_bounded_whatever_names_clients_send(price_map: dict[str, Any]) -> None:
    book = PriceBook(price_map)
    known = book.price("gpt-4o-mini")
    assert known is not None
    with structlog.testing.capture_logs() as logs:
        for i in range(MAX_CACHED_PRICES * 5):
            assert book.price(f"client-chosen-{i}") is None
        assert len(book._cache) == MAX_CACHED_PRICES
        assert book.price("gpt-4o-mini") == known  # dropped long ago, looked up again
        assert book.price("client-chosen-0") is None  # dropped: warned about again
    warned = [e["model"] for e in logs if e["event"] == "unpriced_model"]
    assert len(warned) == MAX_CACHED_PRICES * 5 + 1 and warned[-1] == "client-chosen-0"


def test_config_overrides_win_over_the_map(price_map: dict[str, Any]) -> None:
    settings = config.from_dict(
        {
            "pricing": {
                "gpt-4o-mini": {"input_per_mtok": 0.2, "output_per_mtok": 0.8},
                "my-finetune-v3": {
                    "input_per_mtok": 1.25,
                    "output_per_mtok": 5,
                    "cached_input_per_mtok": 0.125,
                },
            }
        }
    )
    book = PriceBook.from_settings(price_map, settings.pricing)
    assert book.price("gpt-4o-mini") == Price(input=200_000, output=800_000, cached_input=None)
    assert book.price("my-finetune-v3") == Price(
        input=1_250_000, output=5_000_000, cached_input=125_000
    )
    assert book.price("gpt-4o") == PriceBook(price_map).price("gpt-4o")


def test_a_models_output_limit_comes_from_the_map_and_is_none_where_it_is_not_known(
    price_map: dict[str, Any],
) -> None:
    # A [pricing] entry carries no output limit: a name the map knows keeps the map's, one it
    # does not know has none (the reservation then falls back to 4,096 tokens).
    settings = config.from_dict(
        {"pricing": {"my-finetune-v3": {"input_per_mtok": 1, "output_per_mtok": 2}}}
    )
    book = PriceBook.from_settings(price_map, settings.pricing)
    assert book.max_output_tokens("gpt-4o-mini") == price_map["gpt-4o-mini"]["max_output_tokens"]
    assert book.max_output_tokens("openai/gpt-4o-mini") == book.max_output_tokens("gpt-4o-mini")
    assert book.max_output_tokens("my-finetune-v3") is None
    assert book.max_output_tokens("client-chosen") is None
    odd = PriceBook({"a": {"max_output_tokens": True}, "b": {"max_output_tokens": "9"}})
    assert odd.max_output_tokens("a") is None and odd.max_output_tokens("b") is None
    for i in range(MAX_CACHED_PRICES * 2):  # bounded, as the prices are
        book.max_output_tokens(f"client-chosen-{i}")
    assert len(book._limits) == MAX_CACHED_PRICES


def test_a_models_input_window_comes_from_the_map_and_is_none_where_it_is_not_known(
    price_map: dict[str, Any],
) -> None:
    book = PriceBook(price_map)
    assert book.max_input_tokens("gpt-4o-mini") == price_map["gpt-4o-mini"]["max_input_tokens"]
    assert book.max_input_tokens("openai/gpt-4o-mini") == book.max_input_tokens("gpt-4o-mini")
    assert book.max_input_tokens("client-chosen") is None
    odd = PriceBook({"a": {"max_input_tokens": True}, "b": {"max_input_tokens": 0}})
    assert odd.max_input_tokens("a") is None and odd.max_input_tokens("b") is None
    for i in range(MAX_CACHED_PRICES * 2):  # bounded, as the prices are
        book.max_input_tokens(f"client-chosen-{i}")
    assert len(book._windows) == MAX_CACHED_PRICES


@pytest.mark.parametrize(
    ("pricing", "needle"),
    [
        ({"m": {"input_per_mtok": 1}}, '[pricing."m"] output_per_mtok: missing'),
        (
            {"m": {"input_per_mtok": -1, "output_per_mtok": 1}},
            '[pricing."m"] input_per_mtok = -1: expected a number of USD per million tokens',
        ),
        (
            {"m": {"input_per_mtok": "0.1", "output_per_mtok": 1}},
            "input_per_mtok = '0.1': expected a number",
        ),
        (
            {"m": {"input_per_mtok": 0.0000001, "output_per_mtok": 1}},
            "more precise than the ledger can count",
        ),
        (
            {"m": {"input_per_mtok": 1, "output_per_mtok": 1, "input": 2}},
            '[pricing."m"] input: unknown key',
        ),
        ({"m": 0.15}, '[pricing."m"] = 0.15: expected a table'),
    ],
)
def test_bad_pricing_entries_name_the_key_and_the_value(
    pricing: dict[str, Any], needle: str
) -> None:
    with pytest.raises(ConfigError) as info:
        config.from_dict({"pricing": pricing})
    assert needle in str(info.value)


def test_config_prices_convert_exactly() -> None:
    assert pico_per_token(0.15) == 150_000
    assert pico_per_token(0.075) == 75_000
    assert pico_per_token(15) == 15_000_000
    assert pico_per_token(0.000001) == 1


def test_example_config_documents_the_pricing_table() -> None:
    text = EXAMPLE.read_text()
    assert tomllib.loads(text)["pricing"] == {}
    block = text.split("\n[pricing]\n", 1)[1]
    commented = [line for line in block.splitlines() if line.startswith("#")]
    example = "\n".join(re.sub(r"^# ?", "", line) for line in commented)
    loaded = config.from_dict(tomllib.loads(example))
    [(model, price)] = loaded.pricing.items()
    for f in fields(config.ModelPrice):
        assert getattr(price, f.name) is not None, f"the example leaves {f.name} out"
        line = next(line for line in commented if line.startswith(f"# {f.name} ="))
        assert "#" in line[2:], f"{f.name} has no comment"
    assert PriceBook.from_settings({}, loaded.pricing).price(model) is not None


# -- the cost of a row -------------------------------------------------------------------------


def costed(book: PriceBook, **row: Any) -> tuple[int | None, int | None]:
    base = {"status": 200, "requested_model": "gpt-4o-mini", "api_model": "gpt-4o-mini"}
    full = {**base, **row}
    apply_costs(full, book)
    return full["api_cost_pusd"], full["counterfactual_cost_pusd"]


def api_costed(
    book: PriceBook, prompt: int, completion: int, **row: Any
) -> tuple[int | None, int | None]:
    """:func:`costed` for an API answer of ``prompt`` and ``completion`` tokens: its
    counterfactual counts are its own."""
    counts = {"prompt_tokens": prompt, "completion_tokens": completion}
    counterfactual = {f"counterfactual_{k}": v for k, v in counts.items()}
    return costed(book, route="api", **counts, **counterfactual, **row)


def test_row_costs(price_map: dict[str, Any]) -> None:
    book = PriceBook(price_map)
    # A local answer: nothing paid; the counterfactual is its recount, priced.
    assert costed(
        book,
        route="local",
        prompt_tokens=40,
        completion_tokens=9,
        counterfactual_prompt_tokens=19,
        counterfactual_completion_tokens=2,
    ) == (0, 19 * 150_000 + 2 * 600_000)
    # An API answer, part of the prompt cached: both sides priced the same way.
    paid = 800 * 150_000 + 200 * 75_000 + 50 * 600_000
    assert api_costed(book, 1000, 50, cached_tokens=200) == (paid, paid)
    # Sent to a mapped model that costs more: paid at its price, counterfactual at the asked one.
    assert api_costed(book, 10, 10, api_model="gpt-4o") == (
        10 * 2_500_000 + 10 * 10_000_000,
        10 * 150_000 + 10 * 600_000,
    )
    # A name that is only an alias of the mapping is priced as its target.
    assert costed(
        book,
        route="local",
        requested_model="cheap",
        api_model="gpt-4o-mini",
        counterfactual_prompt_tokens=10,
        counterfactual_completion_tokens=0,
    ) == (0, 1_500_000)
    # The model "local" never had an API counterpart.
    assert costed(book, route="local", requested_model="local", api_model=None) == (0, 0)


def test_row_costs_at_the_rows_tier_audio_and_searches(price_map: dict[str, Any]) -> None:
    book = PriceBook(price_map)
    # A local answer to a flex request: its counterfactual at the flex rate (half, here).
    assert costed(
        book,
        route="local",
        service_tier="flex",
        counterfactual_prompt_tokens=20,
        counterfactual_completion_tokens=4,
    ) == (0, 20 * 75_000 + 4 * 300_000)
    # A priority API answer that searched the web twice (gpt-4o-search-preview, high context).
    model = "gpt-4o-search-preview"
    fee = book.search_fee(model, "high")
    price = book.price(model, "priority")
    assert price is not None and fee == 25_000_000_000
    paid = 100 * price.input + 10 * price.output + 2 * fee
    assert api_costed(
        book,
        100,
        10,
        requested_model=model,
        api_model=model,
        service_tier="priority",
        web_searches=2,
        search_context_size="high",
    ) == (paid, paid)
    # Audio tokens of gpt-audio at its audio rates, the rest as text.
    audio = book.price("gpt-audio")
    rate_in, rate_out = book.audio_rates("gpt-audio")
    assert audio is not None and rate_out == 64_000_000
    paid = 60 * audio.input + 40 * rate_in + 5 * audio.output + 20 * rate_out
    assert api_costed(
        book,
        100,
        25,
        requested_model="gpt-audio",
        api_model="gpt-audio",
        audio_prompt_tokens=40,
        audio_completion_tokens=20,
    ) == (paid, paid)


def test_a_reservation_is_billed_for_the_tier_audio_and_searches_a_request_asks_for() -> None:
    chat = {"model": "gpt-4o-mini", "messages": [], "service_tier": "priority"}
    assert requested_billing(chat, 100) == Billed(tier="priority")
    spoken = {**chat, "service_tier": "auto", "modalities": ["text", "audio"]}
    assert requested_billing(spoken, 100) == Billed(audio_completion_tokens=100)
    searching = {**chat, "web_search_options": {"search_context_size": "low"}}
    assert requested_billing(searching, 5) == Billed(
        tier="priority", web_searches=1, search_context_size="low"
    )
    tools = [{"type": "web_search", "search_context_size": "high"}, {"type": "function"}]
    assert requested_billing({"tools": tools}, 5) == Billed(
        web_searches=1, search_context_size="high"
    )
    assert requested_billing({"tools": tools, "max_tool_calls": 6}, 5).web_searches == 6
    said = {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}
    heard = {"messages": [{"role": "user", "content": [said, said]}]}
    assert requested_billing(heard, 5, 1000) == Billed(audio_prompt_tokens=2000)


def test_rows_that_cannot_be_costed_stay_null_never_zero(price_map: dict[str, Any]) -> None:
    book = PriceBook(price_map)
    unpriced = {"requested_model": "my-finetune-v3", "api_model": "my-finetune-v3"}
    tokens = {"counterfactual_prompt_tokens": 10, "counterfactual_completion_tokens": 10}
    assert costed(book, route="local", **unpriced, **tokens) == (0, None)
    assert costed(
        book, route="api", prompt_tokens=10, completion_tokens=10, **unpriced, **tokens
    ) == (None, None)
    # A stream cut before the usage chunk: the call's cost is unknown, so is its saving.
    assert costed(book, route="api") == (None, None)
    # A failed request has no counterfactual (the API would have failed it too).
    assert costed(book, route="none", status=400) == (0, None)
    # Sent to a mapped target nobody prices: what it cost is unknown, so no saving is claimed
    # even though the requested model has a price.
    mapped = costed(book, route="api", api_model="acme/unknown", prompt_tokens=10, **tokens)
    assert mapped == (None, None)


# -- counting tokens as the requested model would -----------------------------------------------


def test_prompt_and_answer_are_counted_with_the_requested_models_tokenizer(
    counter: TokenCounter,
) -> None:
    completion = {"choices": [{"message": {"role": "assistant", "content": "Paris, of course."}}]}
    body = {"messages": QUESTION}
    o200k = tiktoken.get_encoding("o200k_base")
    cl100k = tiktoken.get_encoding("cl100k_base")
    assert counter.count(CountJob(model="gpt-4o-mini", body=body, completion=completion)) == (
        openai_prompt_tokens("o200k_base", QUESTION),
        len(o200k.encode("Paris, of course.")),
    )
    assert counter.count(CountJob(model="gpt-3.5-turbo", body=body, completion=completion)) == (
        openai_prompt_tokens("cl100k_base", QUESTION),
        len(cl100k.encode("Paris, of course.")),
    )


def test_tool_calls_and_every_choice_count_as_answer_tokens(counter: TokenCounter) -> None:
    call = {"type": "function", "function": {"name": "get_weather", "arguments": '{"c":"Oslo"}'}}
    completion = {
        "choices": [
            {"message": {"role": "assistant", "content": None, "tool_calls": [call]}},
            {"message": {"role": "assistant", "content": "Sunny."}},
        ]
    }
    o200k = tiktoken.get_encoding("o200k_base")
    _, answer = counter.count(
        CountJob(model="gpt-4o-mini", body={"messages": QUESTION}, completion=completion)
    )
    assert answer == len(o200k.encode('get_weather{"c":"Oslo"}')) + len(o200k.encode("Sunny."))


def test_counts_run_on_the_counters_thread(counter: TokenCounter) -> None:
    job = CountJob(
        model="gpt-4o-mini",
        body={"messages": QUESTION},
        completion={"choices": [{"message": {"content": "Paris."}}]},
    )
    assert counter.submit(job).result(timeout=30) == counter.count(job)
