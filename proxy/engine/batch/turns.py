"""Whose turn is the batch's next step: a joining prompt's chunk, or the running answers' tokens.

A prefill step and a decode step never share one ``llama_decode`` (``decode.py``), so while a
prompt is being read the answers wait, and the other way round. :class:`Turns` decides:

    time share      a prefill step of t seconds is followed by 4t seconds of decode steps (or
                    fewer, if the answers finish first): running answers keep 80% of the
                    time, so they finish in about the order they came, which is what the
                    predictions made at their arrival assume, and a long prompt slows a
                    streamed answer by a fifth but never stops it
    an answer's due a running answer that would miss its deadline at that share (its remaining
                    tokens at the measured cost of a step, with a 20% margin) gets every step
                    until it is safe again
    deferred only   while the step serves deferred sequences alone (batch lines, background
                    responses: no interactive one is in the batch), a waiting prompt goes
                    first, unless an answer is due: nobody streams those answers, and a
                    decode step of four rows costs about two of one row here, so a batch is
                    fastest full. With the time share, a short line's prompt (tens of
                    tokens, then an answer of tens) waited four times its prefill for its
                    turn, the next line's prompt behind it: measured on the bundled model, a
                    width-4 batch of 24 such lines decoded 1.13 rows a step on average (3.59
                    with prompts first), and most of a line's time in the engine went before
                    its first token (``bench/README.md``, "Bulk work"). Nothing is owed to
                    deferred answers, so an interactive request next starts from a clean account

An answer's remaining tokens are its ``max_tokens`` left, capped by the mean length of the
answers that ended by themselves so far. Prompts first (every joining prompt before the answers
go on, so that they decode together) would batch more rows per step, but it makes the first
requests of a burst wait for the later ones, and their finish times, predicted when they
arrived, no longer hold (``bench/README.md``, (6)). llama-server differs: it mixes a prompt chunk
and the decode rows in one step (and so its answers depend on the batch; here they may not).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from proxy.engine.batch.forecast import SHARE_RATIO
from proxy.engine.batch.sequence import Sequence
from proxy.engine.rates import ewma

__all__ = ["Turns"]

MARGIN = 1.2  # on the projected time of an answer, before it counts as due


class Turns:
    """Chooses each step's kind; see the module docstring."""

    def __init__(self, step_cost: Callable[[int], float]) -> None:
        self.step_cost = step_cost
        self.credit_s = 0.0  # decode time owed to the running answers (negative: owed)
        self.mean_answer: float | None = None  # tokens, of answers that ended by themselves
        self.due = 0  # decode steps taken because an answer was due

    def prefill_next(self, active: list[Sequence], filling: Sequence | None) -> bool:
        """Whether the next step prefills ``filling`` (the first prompt waiting); ``active``
        are the sequences the step may serve."""
        if filling is None:
            return False
        decoders = [q for q in active if q.pending is not None or q.prefilled == len(q.prompt) - 1]
        if not decoders:
            return True
        if self.credit_s < 0.0 and not _deferred_only(active):
            return False
        if self._due(decoders):
            self.due += 1
            return False
        return True

    def _due(self, decoders: list[Sequence]) -> bool:
        """Whether an answer would miss its deadline at 80% of the time."""
        timed = [q for q in decoders if q.deadline is not None]
        if not timed:
            return False
        step_s = self.step_cost(len(decoders)) / (1.0 - 1.0 / (1.0 + SHARE_RATIO))
        now = time.monotonic()
        for q in timed:
            left = q.budget - len(q.generated)
            if self.mean_answer is not None:
                left = min(left, max(round(self.mean_answer) - len(q.generated), 1))
            assert q.deadline is not None
            if now + MARGIN * left * step_s > q.deadline:
                return True
        return False

    def after(
        self,
        *,
        prefill: bool,
        seconds: float,
        decoders: bool,
        waiting: bool,
        deferred: bool = False,
    ) -> None:
        """Account one step (``decoders``: answers were running; ``waiting``: a prompt was
        waiting; ``deferred``: it served deferred sequences alone): the decode time owed to
        the running answers."""
        if deferred:
            self.credit_s = 0.0  # nothing is owed to deferred answers (module docstring)
        elif prefill:
            if decoders:
                self.credit_s -= seconds * SHARE_RATIO
        else:
            self.credit_s = min(self.credit_s + seconds, 0.0) if waiting else 0.0

    def ended(self, seq: Sequence) -> None:
        """Learn the length of an answer that ended by itself (EOS or a stop string)."""
        if seq.stop_cause in ("eos", "stop_sequence") and seq.error is None:
            self.mean_answer = ewma(self.mean_answer, float(len(seq.generated)))


def _deferred_only(active: list[Sequence]) -> bool:
    return bool(active) and all(q.deferred for q in active)
