"""Speculative decoding: same greedy tokens as plain decoding, fewer decode calls when it pays.

The models are loaded in-process (no worker) so that the tests can compare token by token. The
draft model is SmolLM2 itself: no other GGUF on PyPI shares its vocabulary, and a model drafting
for itself still proves the mechanism (drafts, one verify batch, rollback of rejected tokens).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from proxy.engine.generate import LocalModel
from proxy.engine.model_files import bundled_model_path
from proxy.engine.speculative import PromptLookup, SpecStats

PARAGRAPH = (
    "Teh quick brown fox jumpd over the lazzy dog. It was a sunny day in the vilage, and all "
    "the childern were playing near the rivr while their parents watched from the benchs."
)
COPY = [{"role": "user", "content": "Fix the typos in this paragraph:\n\n" + PARAGRAPH}]
EXTRACT = [
    {
        "role": "user",
        "content": "List every person named in this text, one per line.\n\n"
        "Alice Martin met Bob Stone and Carol White in Paris. Dave Brown stayed home with "
        "Erin Black.",
    }
]
CHAT = [{"role": "user", "content": "Write a short poem about the sea."}]


def _greedy(messages: list[dict[str, Any]], max_tokens: int = 48, **extra: Any) -> dict[str, Any]:
    return {
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0,
        "logprobs": True,
        "top_logprobs": 2,
        **extra,
    }


def _load(**kwargs: Any) -> LocalModel:
    return LocalModel.load(bundled_model_path(), n_ctx=1024, n_threads=1, **kwargs)


@pytest.fixture(scope="module")
def plain() -> Iterator[LocalModel]:
    model = _load(calibrate=False)
    yield model
    model.close()


@pytest.fixture(scope="module")
def lookup() -> Iterator[LocalModel]:
    # Not adaptive: draft on every step, so that every path of the verify loop runs.
    model = _load(speculative="prompt-lookup", adaptive=False, calibrate=False)
    yield model
    model.close()


@pytest.fixture(scope="module")
def drafted() -> Iterator[LocalModel]:
    model = _load(
        speculative="draft",
        draft_model_path=bundled_model_path(),
        draft_max_tokens=4,
        adaptive=False,
        calibrate=False,
    )
    yield model
    model.close()


def _cold(model: LocalModel, request: dict[str, Any]) -> dict[str, Any]:
    """Answer from an empty context: llama.cpp's numbers depend slightly on how the prompt was
    split into batches, so outputs are compared from the same starting point."""
    model.forget()
    return model.chat(request)


def _tokens(completion: dict[str, Any]) -> list[str]:
    return [e["token"] for e in completion["choices"][0]["logprobs"]["content"]]


def _logprobs(completion: dict[str, Any]) -> list[float]:
    return [e["logprob"] for e in completion["choices"][0]["logprobs"]["content"]]


@pytest.mark.parametrize("messages", [COPY, EXTRACT, CHAT], ids=["copy", "extract", "chat"])
def test_prompt_lookup_gives_the_same_greedy_tokens_and_logprobs(
    plain: LocalModel, lookup: LocalModel, messages: list[dict[str, Any]]
) -> None:
    want = _cold(plain, _greedy(messages))
    got = _cold(lookup, _greedy(messages))
    assert _tokens(got) == _tokens(want)
    assert got["choices"][0]["message"] == want["choices"][0]["message"]
    assert got["choices"][0]["finish_reason"] == want["choices"][0]["finish_reason"]
    assert np.allclose(_logprobs(got), _logprobs(want), atol=1e-4)
    pairs = zip(
        got["choices"][0]["logprobs"]["content"],
        want["choices"][0]["logprobs"]["content"],
        strict=True,
    )
    for a, b in pairs:
        assert [t["token"] for t in a["top_logprobs"]] == [t["token"] for t in b["top_logprobs"]]
    spec = got["frugal"]["speculative"]
    assert spec["mode"] == "prompt-lookup" and spec["drafted"] > 0
    assert want["frugal"]["speculative"] is None


def test_copy_heavy_work_accepts_most_drafts_in_fewer_decode_calls(lookup: LocalModel) -> None:
    got = lookup.chat(_greedy(COPY, max_tokens=40))
    spec = got["frugal"]["speculative"]
    emitted = got["usage"]["completion_tokens"]
    assert spec["accepted"] > spec["drafted"] / 2
    # Each verify batch emits its accepted drafts plus one token of the model's own.
    assert spec["verify_batches"] < emitted


def test_a_draft_model_gives_the_same_greedy_tokens(plain: LocalModel, drafted: LocalModel) -> None:
    for messages in (COPY, CHAT):
        want = _cold(plain, _greedy(messages, max_tokens=24))
        got = _cold(drafted, _greedy(messages, max_tokens=24))
        assert _tokens(got) == _tokens(want)
        assert np.allclose(_logprobs(got), _logprobs(want), atol=1e-4)
        spec = got["frugal"]["speculative"]
        assert spec["mode"] == "draft"
        # The model drafting for itself is nearly always right (its own context was prefilled
        # in other batches, which moves near-ties a little).
        assert spec["drafted"] > 0 and spec["accepted"] >= 0.8 * spec["drafted"]


def test_max_tokens_is_exact_and_stop_sequences_cut_under_speculation(
    plain: LocalModel, lookup: LocalModel
) -> None:
    for n in (1, 2, 7):
        got = lookup.chat(_greedy(COPY, max_tokens=n))
        assert got["usage"]["completion_tokens"] == n
        assert got["frugal"]["stop_cause"] == "max_tokens"
    full = _cold(plain, _greedy(COPY, max_tokens=40))["choices"][0]["message"]["content"]
    word = "fox"
    assert word in full, full
    cut = _cold(lookup, _greedy(COPY, max_tokens=40, stop=[word]))
    assert cut["choices"][0]["message"]["content"] == full[: full.index(word)]
    assert cut["frugal"]["stop_cause"] == "stop_sequence"


def test_live_pieces_add_up_and_a_stop_request_ends_speculation(lookup: LocalModel) -> None:
    pieces: list[str] = []
    got = lookup.chat(_greedy(COPY, max_tokens=30), on_token=pieces.append)
    assert len(pieces) > 1 and "".join(pieces) == got["choices"][0]["message"]["content"]
    calls = 0

    def stop_after_five() -> str | None:
        nonlocal calls
        calls += 1
        return "deadline" if calls > 5 else None

    stopped = lookup.chat(_greedy(COPY, max_tokens=30), should_stop=stop_after_five)
    assert stopped["frugal"]["stop_cause"] == "deadline"
    assert stopped["choices"][0]["finish_reason"] == "length"
    assert stopped["usage"]["completion_tokens"] <= 6


def test_the_kv_cache_is_left_consistent_for_the_next_request(
    plain: LocalModel, lookup: LocalModel
) -> None:
    # Speculative and plain requests in turn on one model reuse each other's prefix.
    first = _cold(lookup, _greedy(COPY, max_tokens=20))
    again = lookup.chat(_greedy(COPY, max_tokens=20, frequency_penalty=0.0, temperature=None))
    assert again["frugal"]["speculative"] is not None
    assert again["frugal"]["cached_tokens"] == again["usage"]["prompt_tokens"] - 1
    plain_after = lookup.chat(_greedy(COPY, max_tokens=20, presence_penalty=1e-9))
    assert plain_after["frugal"]["speculative"] is None
    assert _tokens(again) == _tokens(first) == _tokens(_cold(plain, _greedy(COPY, max_tokens=20)))
    assert _tokens(plain_after) == _tokens(first)


def test_sampling_and_penalties_do_not_speculate(lookup: LocalModel) -> None:
    sampled = lookup.chat({"messages": CHAT, "max_tokens": 8, "temperature": 0.8, "seed": 3})
    assert sampled["frugal"]["speculative"] is None
    penalised = lookup.chat(_greedy(CHAT, max_tokens=8, frequency_penalty=0.5))
    assert penalised["frugal"]["speculative"] is None


def test_prompt_lookup_copies_what_followed_the_latest_match() -> None:
    seq = np.array([5, 6, 7, 8, 9, 1, 5, 6, 7, 2, 3, 4, 5, 6, 7], dtype=np.intc)
    look = PromptLookup(ngram_max=3)
    assert look.draft(seq, 4) == [2, 3, 4, 5]  # the later of the two earlier "5 6 7"
    assert look.draft(seq, 1) == [2]
    assert look.draft(np.array([1, 2, 3, 4], dtype=np.intc), 4) == []
    # Falls back to shorter n-grams: "9 7" is new, "7" was followed by 8.
    assert look.draft(np.array([6, 7, 8, 9, 7], dtype=np.intc), 2) == [8, 9]


def test_spec_stats_are_reported_with_their_keys_in_order() -> None:
    stats = SpecStats(mode="prompt_lookup", steps=5, drafted=12, accepted=9, verify_batches=4)
    reported = stats.as_dict()
    assert reported == {
        "mode": "prompt_lookup",
        "steps": 5,
        "verify_batches": 4,
        "drafted": 12,
        "accepted": 9,
    }
    assert list(reported) == ["mode", "steps", "verify_batches", "drafted", "accepted"]
