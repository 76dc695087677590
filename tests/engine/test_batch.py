"""Continuous batching: every batched greedy answer is the answer of the same request run alone.

The real bundled SmolLM2 is loaded in-process; each request is answered once alone by
``LocalModel.chat`` (from an empty context) and once inside a batch of four sequences that join
and leave at different steps, with prompts of mixed lengths, JSON-mode grammars, stop strings
and logprobs. Prompts are prefilled between the others' decode steps. Prompts that share a
system prompt are in ``test_batch_streams.py``.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from proxy.engine import grammar as grammar_mod
from proxy.engine.batch.decode import BatchEngine, Sequence
from proxy.engine.generate import LocalModel, PromptTooLong
from proxy.engine.tasks import _grammar
from tests.engine.test_batch_speculative import MemoryBound

TOPICS = [
    "the sea",
    "a red bicycle",
    "winter mornings",
    "the moon landing",
    "bread baking",
    "a lost key",
    "city parks",
    "honey bees",
    "old maps",
    "rainy Mondays",
    "mountain trains",
    "a quiet library",
    "tea gardens",
    "a broken clock",
    "desert stars",
    "street music",
    "a village fair",
    "paper boats",
    "an old piano",
    "night buses",
    "apple orchards",
    "a snowy pass",
    "harbour cranes",
    "a first job",
    "a violin lesson",
]
LONG = (
    "The river runs past the old mill, under the stone bridge and into the valley, where "
    "farmers grow wheat and barley. In the spring the water rises and floods the meadows. "
)


def _requests() -> list[dict[str, Any]]:
    """50 greedy requests: short and long prompts, JSON mode, stop strings, logit bias,
    logprobs, several max_tokens."""
    out: list[dict[str, Any]] = []
    for i, topic in enumerate(TOPICS):
        content = f"Write two sentences about {topic}."
        if i % 3 == 1:
            content = LONG * (1 + i % 4) + f"\n\nNow write one sentence about {topic}."
        request: dict[str, Any] = {
            "messages": [{"role": "user", "content": content}],
            "max_tokens": 12 + (i * 5) % 20,
            "temperature": 0,
            "logprobs": True,
            "top_logprobs": 2,
        }
        if i % 4 == 2:
            request["stop"] = [".", "\n"]
        if i % 5 == 3:
            request["logit_bias"] = {"260": -4.0, "30": 1.5}  # " the" and "." in SmolLM2
        out.append(request)
        json_request: dict[str, Any] = {
            "messages": [
                {"role": "user", "content": f"Give a JSON object with a key 'topic': {topic}."}
            ],
            "max_tokens": 16,
            "temperature": 0,
            "response_format": {"type": "json_object"},
        }
        if i % 2:
            json_request["stop"] = ["}"]
        out.append(json_request)
    return out


REQUESTS = _requests()


def _grammar_of(model: LocalModel, request: dict[str, Any]) -> Any:
    gbnf = grammar_mod.gbnf_for(request)
    return _grammar(model, gbnf) if gbnf is not None else None


def _alone(model: LocalModel, request: dict[str, Any]) -> dict[str, Any]:
    model.forget()
    return model.chat(request, grammar=_grammar_of(model, request))


def _tokens(completion: dict[str, Any]) -> list[str]:
    return [e["token"] for e in completion["choices"][0]["logprobs"]["content"]]


def _run_batched(
    engine: BatchEngine, model: LocalModel, requests: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Admit the requests as room frees up, step until all are done; completions in order."""
    waiting = list(enumerate(requests))
    seqs: dict[int, Sequence] = {}
    while waiting or engine.active:
        while waiting:
            index, request = waiting[0]
            seq = engine.add(request, grammar=_grammar_of(model, request))
            if seq is None:
                break
            seqs[index] = seq
            waiting.pop(0)
        engine.step()
    return [engine.completion(seqs[i]) for i in range(len(requests))]


def _check_alone(
    model: LocalModel, requests: list[dict[str, Any]], got: list[dict[str, Any]]
) -> None:
    mismatched = []
    for i, request in enumerate(requests):
        want = _alone(model, request)
        if _tokens(got[i]) != _tokens(want) or got[i]["choices"] != want["choices"]:
            mismatched.append(i)
        assert got[i]["frugal"]["stop_cause"] == want["frugal"]["stop_cause"]
        assert got[i]["usage"]["completion_tokens"] == want["usage"]["completion_tokens"]
    assert mismatched == []


@pytest.mark.timeout(900)  # about 90 s on a quiet machine; this one is shared
def test_batched_greedy_answers_are_the_answers_run_alone(model: LocalModel) -> None:
    engine = BatchEngine(model, 4)
    try:
        got = _run_batched(engine, model, REQUESTS)
    finally:
        engine.close()
    assert len(REQUESTS) >= 50
    assert engine.stats.max_rows > 1
    _check_alone(model, REQUESTS, got)


def test_a_cancelled_sequence_leaves_the_batch_and_the_others_go_on(model: LocalModel) -> None:
    requests = [{**REQUESTS[i], "max_tokens": 24, "stop": []} for i in (0, 2, 4, 6)]
    cancelled = threading.Event()
    engine = BatchEngine(model, 4)
    try:
        seqs = []
        for i, request in enumerate(requests):
            stop = (lambda: "cancelled" if cancelled.is_set() else None) if i == 1 else None
            seq = engine.add(request, should_stop=stop, grammar=_grammar_of(model, request))
            assert seq is not None
            seqs.append(seq)
        for _ in range(6):
            engine.step()
        cancelled.set()
        left = engine.step()
        assert left == [seqs[1]]
        assert len(engine.active) == 3
        engine.run_all()
        got = [engine.completion(s) for s in seqs]
    finally:
        engine.close()
    assert got[1]["frugal"]["stop_cause"] == "cancelled"
    assert 0 < got[1]["usage"]["completion_tokens"] < 24
    for i in (0, 2, 3):
        assert _tokens(got[i]) == _tokens(_alone(model, requests[i]))


def test_a_grammar_that_fails_mid_generation_fails_its_own_sequence_only(
    model: LocalModel,
) -> None:
    from llama_cpp import LlamaGrammar

    # "Hi", then a NUL character: no token of the vocabulary can give one (llama.cpp refuses
    # a piece that starts with NUL), so after two tokens the grammar allows nothing.
    dead_end = LlamaGrammar.from_string('root ::= "Hi" "\\x00"', verbose=False)
    requests = [{**REQUESTS[i], "max_tokens": 20, "stop": []} for i in (0, 2, 4, 6)]
    engine = BatchEngine(model, 4)
    try:
        seqs = [
            engine.add(r, grammar=dead_end if i == 1 else _grammar_of(model, r))
            for i, r in enumerate(requests)
        ]
        assert all(s is not None for s in seqs)
        engine.run_all()
        got = [engine.completion(s) for s in seqs if s is not None]
    finally:
        engine.close()
    assert [s.error for s in seqs if s is not None] == [
        None,
        "the grammar allows no next token",
        None,
        None,
    ]
    assert got[1]["choices"][0]["message"]["content"] == "Hi"
    for i in (0, 2, 3):
        assert _tokens(got[i]) == _tokens(_alone(model, requests[i]))


def test_each_sequence_has_the_whole_context_and_too_long_a_prompt_is_refused(
    model: LocalModel,
) -> None:
    engine = BatchEngine(model, 2)
    try:
        big = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1900}
        assert engine.add(big) is not None
        assert engine.add(big) is not None  # its own KV stream: no room taken from the first
        assert engine.add({**big, "max_tokens": 8}) is None  # both sequence ids taken
        huge = {"messages": [{"role": "user", "content": LONG * 200}], "max_tokens": 8}
        with pytest.raises(PromptTooLong):
            engine.add(huge)
    finally:
        engine.close()


COPY = (
    "Alice Martin met Bob Stone and Carol White in Paris. Dave Brown stayed home with Erin "
    "Black. Frank Green flew to Vienna on Monday and came back on Friday."
)


def test_speculating_sequences_in_the_batch_give_the_answers_run_alone(model: LocalModel) -> None:
    copy = [
        {
            "messages": [
                {"role": "user", "content": f"Copy this text word for word:\n\n{COPY} ({i})"}
            ],
            "max_tokens": 40,
            "temperature": 0,
            "logprobs": True,
            "top_logprobs": 1,
        }
        for i in range(4)
    ]
    requests = copy + [r for r in REQUESTS[:12] if "response_format" not in r]
    engine = BatchEngine(model, 4, speculative=True)
    engine.draft_costs = MemoryBound()  # drafts priced as on a memory-bound model, not this load
    try:
        got = _run_batched(engine, model, requests)
    finally:
        engine.close()
    assert sum(g["frugal"]["speculative"]["accepted"] for g in got[:4]) > 20
    for completion, request in zip(got, requests, strict=True):
        want = _alone(model, request)
        assert _tokens(completion) == _tokens(want)
        assert completion["choices"] == want["choices"]
