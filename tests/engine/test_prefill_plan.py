"""A reused prefix never changes an answer: how the rest of the prompt is cut (prefill_plan.py).

The pure part first (where the tiled steps end, how much of a held prefix is usable, the steps
of a prefill), then the fact it rests on, with the real bundled SmolLM2: a prefix reused from
another prompt and the rest prefilled by the plan gives the last token's logits bit for bit
those of a cold prefill, where a plain cut of the rest (fewer than 64 rows) does not.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from proxy.engine.generate import LocalModel
from proxy.engine.model_files import bundled_model_path
from proxy.engine.prefill_plan import (
    DEFERRED_ROWS,
    TILE_ROWS,
    cut_tail,
    plan,
    reusable,
    tiled_until,
)


def test_tiled_steps_end_before_a_short_last_chunk() -> None:
    assert tiled_until(1, 512) == 0
    assert tiled_until(40, 512) == 0  # one short chunk: all row by row
    assert tiled_until(200, 512) == 199  # one chunk of 199 rows: tiled
    assert tiled_until(513, 512) == 512
    assert tiled_until(540, 512) == 512  # 27 rows after the first chunk: row by row
    assert tiled_until(600, 512) == 599


def test_a_held_prefix_is_usable_up_to_where_the_two_were_cut_differently() -> None:
    assert reusable(300, 399, 399) == 300
    assert reusable(530, 512, 512) == 530  # both had the same short tail
    assert reusable(530, 512, 560) == 512
    assert reusable(100, 512, 560) == 100


def test_the_plan_backs_off_into_the_prefix_to_keep_tiled_steps_tiled() -> None:
    assert plan(0, 1200, 512) == (0, [512, 512, 175])  # cold: the single path's cut
    assert plan(0, 530, 512) == (0, [512, 17])
    assert plan(150, 200, 512) == (135, [TILE_ROWS])  # 49 rows left: 64 instead
    assert plan(100, 200, 512) == (100, [99])
    assert plan(520, 530, 512) == (520, [9])  # inside the short tail: row by row anyway
    assert plan(500, 530, 512) == (448, [TILE_ROWS, 17])
    assert plan(1000, 1530, 512) == (1000, [465, TILE_ROWS])  # no tiled step under 64 rows
    assert plan(900, 900, 512) == (899, [])  # all but the last token held


RULES = (
    "Rule {i}: when a customer asks about an order, first confirm the order number, then the "
    "delivery address, and never share the payment details; answer politely and briefly. "
)


@pytest.fixture(scope="module")
def model() -> Iterator[LocalModel]:
    loaded = LocalModel.load(
        bundled_model_path(), n_ctx=2048, n_threads=1, calibrate=False, prefix_cache_mb=64
    )
    yield loaded
    loaded.close()


def _prompt(model: LocalModel, question: str) -> list[int]:
    system = "Policy. " + "".join(RULES.format(i=i) for i in range(1, 6))
    messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
    return model.prompt_tokens({"messages": messages})


def _logits_after(
    model: LocalModel, held: list[int], prompt: list[int], start: int, steps: list[int]
) -> np.ndarray:
    from llama_cpp import llama_get_logits_ith

    llm = model.llm
    model.forget()
    if start:
        for begin in range(0, len(held) - 1, model.n_batch):
            llm.eval(held[begin : min(begin + model.n_batch, len(held) - 1)])
        llm._ctx.kv_cache_seq_rm(-1, start, -1)
        llm.n_tokens = start
    position = start
    for size in steps:
        llm.eval(prompt[position : position + size])
        position += size
    assert position == len(prompt) - 1
    llm.eval(prompt[-1:])
    row = llama_get_logits_ith(llm._ctx.ctx, -1)
    return np.ctypeslib.as_array(row, shape=(llm.n_vocab(),)).copy()


def test_a_prefix_reused_by_the_plan_gives_the_logits_of_a_cold_prefill(model: LocalModel) -> None:
    held = _prompt(model, "Where is my order 1234?")
    prompt = _prompt(model, "Can I change my delivery address, please? I moved last week.")
    common = next(i for i, (a, b) in enumerate(zip(held, prompt, strict=False)) if a != b)
    tiled = tiled_until(len(prompt), model.n_batch)
    assert common > TILE_ROWS and len(prompt) - 1 - common < TILE_ROWS
    cold = _logits_after(model, held, prompt, 0, plan(0, len(prompt), model.n_batch)[1])
    start, steps = plan(
        reusable(common, tiled_until(len(held), model.n_batch), tiled), len(prompt), model.n_batch
    )
    assert 0 < start < common and steps == [TILE_ROWS]
    planned = _logits_after(model, held, prompt, start, steps)
    naive = _logits_after(model, held, prompt, common, [len(prompt) - 1 - common])
    assert np.array_equal(planned, cold)
    # Why the plan exists: the rest evaluated in one short step moves the logits.
    assert not np.array_equal(naive, cold)


def _ask(system_rules: int, question: str) -> dict[str, object]:
    system = "Policy. " + "".join(RULES.format(i=i) for i in range(1, system_rules + 1))
    return {
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
        "max_tokens": 16,
        "temperature": 0,
        "logprobs": True,
        "top_logprobs": 2,
    }


def test_the_single_path_answers_from_a_reused_prefix_as_from_an_empty_context(
    model: LocalModel,
) -> None:
    first = _ask(5, "Where is my order 1234?")
    second = _ask(5, "Can I change my delivery address, please? I moved last week.")
    model.forget()
    cold = model.chat(second)
    model.forget()
    model.chat(first)
    live = model.chat(second)  # the prefix from the live context
    model.chat(_ask(1, "Hello"))  # another prompt replaces the live context
    saved = model.chat(second)  # the prefix restored from the prefix cache
    assert live["frugal"]["cached_tokens"] > 100 and saved["frugal"]["cached_tokens"] > 100
    assert model.prefix_cache is not None and model.prefix_cache.hits >= 1
    assert live["choices"] == cold["choices"]  # tokens and logprobs
    assert saved["choices"] == cold["choices"]


def test_a_deferred_prompts_untiled_tail_is_cut_into_short_steps() -> None:
    # A short prompt is all tail: 53 positions to prefill, cut 16 at a time (issue 41).
    start, steps = plan(0, 54, 512)
    assert (start, steps) == (0, [53])
    assert cut_tail(steps, 0, 54, 512, DEFERRED_ROWS) == [16, 16, 16, 5]
    # A long prompt's tiled steps stay whole; only its short tail is cut.
    start, steps = plan(0, 600, 512)
    assert steps == [512, 87] and tiled_until(600, 512) == 599
    assert cut_tail(steps, 0, 600, 512, 16) == [512, 87]  # 87 rows, tiled: left whole
    start, steps = plan(0, 540, 512)
    assert steps == [512, 27]
    assert cut_tail(steps, 0, 540, 512, 16) == [512, 16, 11]
    assert cut_tail([10], 0, 11, 512, 16) == [10]


def test_a_short_tail_cut_into_steps_gives_the_logits_of_one_step(model: LocalModel) -> None:
    # What cut_tail rests on: rows evaluated row by row do not depend on the cut.
    question = 'Which city is mentioned? Answer with the city only: "We meet Omar in Lyon."'
    prompt = model.prompt_tokens({"messages": [{"role": "user", "content": question}]})
    n = len(prompt) - 1
    assert tiled_until(len(prompt), model.n_batch) == 0 and n > 2 * DEFERRED_ROWS
    whole = _logits_after(model, [], prompt, 0, [n])
    cut = _logits_after(model, [], prompt, 0, cut_tail([n], 0, len(prompt), model.n_batch, 16))
    one_by_one = _logits_after(model, [], prompt, 0, [1] * n)
    assert np.array_equal(whole, cut) and np.array_equal(whole, one_by_one)
