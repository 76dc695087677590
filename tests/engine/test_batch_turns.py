"""Whose turn is the batch's next step (batch/turns.py): pure decisions on sequences, no model."""

from __future__ import annotations

import time

from proxy.engine.batch.sequence import Sequence
from proxy.engine.batch.turns import Turns
from proxy.engine.sampling import SamplingParams


def _seq(
    *,
    prompt: int,
    prefilled: int,
    deadline: float | None = None,
    stream: bool = False,
    generated: int = 0,
    budget: int = 128,
) -> Sequence:
    seq = Sequence(
        seq_id=0,
        request={},
        params=SamplingParams.from_request({"max_tokens": budget}, 512),
        prompt=[1] * prompt,
        budget=budget,
        on_token=(lambda text: None) if stream else None,
        should_stop=None,
        grammar=None,
        rng=None,
        started=0.0,
        prefilled=prefilled,
        deadline=deadline,
    )
    if generated:
        seq.generated = [2] * generated
        seq.pending = 2
    return seq


def _turns() -> Turns:
    return Turns(lambda rows: 0.02 + 0.01 * rows)  # 30 ms for one row, 60 ms for four


def test_a_prompt_goes_first_when_nothing_is_owed_to_the_answers() -> None:
    turns = _turns()
    answer = _seq(prompt=50, prefilled=50, generated=5, deadline=time.monotonic() + 60)
    joining = _seq(prompt=501, prefilled=0)
    assert turns.prefill_next([answer, joining], joining)
    assert turns.prefill_next([joining], joining)  # nothing to decode
    assert not turns.prefill_next([answer], None)  # nothing to prefill


def test_answers_get_four_seconds_of_decode_per_second_of_prompt() -> None:
    turns = _turns()
    answer = _seq(prompt=50, prefilled=50, generated=5, stream=True)
    joining = _seq(prompt=2001, prefilled=0)
    active = [answer, joining]
    assert turns.prefill_next(active, joining)
    turns.after(prefill=True, seconds=0.5, decoders=True, waiting=True)
    assert turns.credit_s == -2.0
    for _ in range(4):  # 2.0 s owed: four decode steps of 0.6 s repay it
        assert not turns.prefill_next(active, joining)
        turns.after(prefill=False, seconds=0.6, decoders=True, waiting=True)
    assert turns.credit_s == 0.0
    assert turns.prefill_next(active, joining)
    turns.after(prefill=True, seconds=0.5, decoders=True, waiting=True)
    turns.after(prefill=False, seconds=0.1, decoders=True, waiting=False)  # no prompt left
    assert turns.credit_s == 0.0  # nothing is owed to the next prompt's turn


def test_an_answer_that_would_miss_its_deadline_gets_every_step() -> None:
    turns = _turns()
    # 123 tokens at 30 ms / 0.8 of the time is 4.6 s, x 1.2: due with 5 s left
    answer = _seq(prompt=50, prefilled=50, generated=5, deadline=time.monotonic() + 5)
    joining = _seq(prompt=501, prefilled=0)
    assert not turns.prefill_next([answer, joining], joining)
    assert turns.due == 1
    # Its expected length is the mean of the answers that ended by themselves: 20 tokens.
    ended = _seq(prompt=10, prefilled=10, generated=20)
    ended.stop_cause = "eos"
    turns.ended(ended)
    assert turns.prefill_next([answer, joining], joining)  # 15 x 30 ms / 0.8 x 1.2 < 5 s


def test_deferred_answers_let_a_waiting_prompt_go_first_and_are_owed_nothing() -> None:
    # Batch lines: no client streams them, so the batch fills before it decodes (issue 41).
    turns = _turns()
    answer = _seq(prompt=50, prefilled=50, generated=5)
    answer.deferred = True
    joining = _seq(prompt=60, prefilled=0)
    joining.deferred = True
    active = [answer, joining]
    assert turns.prefill_next(active, joining)
    turns.after(prefill=True, seconds=0.5, decoders=True, waiting=True, deferred=True)
    assert turns.credit_s == 0.0
    turns.credit_s = -2.0  # owed to interactive answers before: deferred ones do not wait on it
    assert turns.prefill_next(active, joining)
    # An interactive answer among them keeps its share of the time.
    answer.deferred = False
    assert not turns.prefill_next(active, joining)
