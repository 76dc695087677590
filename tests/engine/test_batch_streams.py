"""Prompts that share a prefix share its KV cells in the batch (batch/streams.py), and the answers
are still the ones each request gets alone from an empty context, token for token and logprob for
logprob: held by a free stream, copied from a running sequence, or waited for while another
sequence prefilled it. The real bundled SmolLM2, in-process, as in ``test_batch.py``.
"""

from __future__ import annotations

from typing import Any

import pytest

from proxy.engine.batch.decode import BatchEngine
from proxy.engine.batch.sequence import BatchStats
from proxy.engine.generate import LocalModel
from tests.engine.test_batch import _check_alone, _run_batched

RULE = (
    "Rule {i}: when a customer asks about an order, first confirm the order number, then the "
    "delivery address, and never share the payment details; answer politely and briefly. "
)
QUESTIONS = [
    "Where is my order 1234?",
    "Hello",
    "Can I change my delivery address?",
    "Do you ship to Norway?",
    "I want a refund for order 99.",
]


def _policy(rules: int) -> dict[str, str]:
    text = "Policy. " + "".join(RULE.format(i=i) for i in range(1, rules + 1))
    return {"role": "system", "content": text}


def _shared_prefix_requests() -> list[dict[str, Any]]:
    """12 greedy requests on two system prompts: one of about 170 tokens, one of 513 to 533
    whose last prefill chunk is shorter than 64 rows; the next turn of a chat; a repeat."""
    out: list[dict[str, Any]] = []
    for i, question in enumerate(QUESTIONS):
        for rules in (5, 14):
            out.append(
                {
                    "messages": [_policy(rules), {"role": "user", "content": question}],
                    "max_tokens": 10 + i,
                    "temperature": 0,
                    "logprobs": True,
                    "top_logprobs": 2,
                    **({"stop": ["\n"]} if i % 2 else {}),
                }
            )
    turn = [
        _policy(5),
        {"role": "user", "content": QUESTIONS[3]},
        {"role": "assistant", "content": "Yes, we ship to Norway."},
        {"role": "user", "content": "And to Sweden?"},
    ]
    out.append({"messages": turn, "max_tokens": 12, "temperature": 0, "logprobs": True})
    out.append(dict(out[1]))
    return out


SHARED = _shared_prefix_requests()


def _batched(model: LocalModel, requests: list[dict[str, Any]]) -> tuple[list[Any], BatchStats]:
    """The requests' completions on a new engine four rows wide (closed after), and its stats."""
    engine = BatchEngine(model, 4)
    try:
        return _run_batched(engine, model, requests), engine.stats
    finally:
        engine.close()


@pytest.mark.timeout(900)
def test_answers_sharing_a_system_prompt_reuse_its_cells_and_are_the_answers_run_alone(
    model: LocalModel,
) -> None:
    got, stats = _batched(model, SHARED)
    # Each system prompt was prefilled about once, not once per request: its cells were held
    # by a free stream, copied from a running sequence, or waited for while another
    # sequence prefilled them (the first four join together).
    assert stats.reused >= 8 and stats.copies >= 1 and stats.followed >= 1
    assert sum(g["frugal"]["cached_tokens"] for g in got) > 3000
    _check_alone(model, SHARED, got)


def test_short_prompts_keep_the_chat_templates_opening_held_in_place(model: LocalModel) -> None:
    # Batch lines of one sentence share the chat template's opening and nothing else (24 tokens
    # of SmolLM2's, under the 32 a copy needs): in a full batch each joining prompt takes the
    # id just left and keeps that opening where it is, instead of prefilling it again; and the
    # answers are still the ones each gets alone (issue 41).
    questions = [*QUESTIONS, "Name three colours.", "What is two plus two?", "Say hello."]
    requests = [
        {"messages": [{"role": "user", "content": q}], "max_tokens": 6 + i, "temperature": 0}
        for i, q in enumerate(questions)
    ]
    got, stats = _batched(model, requests)
    print(f"reused {stats.reused} ({stats.reused_tokens} tokens), copies {stats.copies}")
    assert stats.reused == len(requests) - 4  # every prompt after the first four
    assert all(g["frugal"]["cached_tokens"] >= 20 for g in got[4:])
    _check_alone(model, requests, got)
