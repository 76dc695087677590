"""One sequence of the batch (a request, where it is, its answer so far), and the batch's counts.

:class:`Sequence` is what :class:`~proxy.engine.batch.decode.BatchEngine` keeps for each request it
decodes: the prompt and how much of it is in the KV cache, the sampling state (its generator,
grammar sampler, token counts for penalties, speculation policies) and the answer so far; a
finished one gives its ``chat.completion`` (:meth:`Sequence.completion`). :class:`BatchStats`
counts what the loop has done, for ``/healthz`` and ``/metrics``.
"""

from __future__ import annotations

import codecs
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from proxy.engine.answer import chat_completion
from proxy.engine.draft_policy import DraftPolicy
from proxy.engine.generate import StopCheck, TokenCallback
from proxy.engine.rates import ewma
from proxy.engine.reasoning import Watch
from proxy.engine.sampling import SamplingParams, held_back, logprob_entry
from proxy.engine.speculative import PromptLookup

WIDTH_ALPHA = 0.15  # weight of the newest decode step in the costs by width

__all__ = ["BatchStats", "Sequence"]


@dataclass(eq=False)
class Sequence:
    """One request in the batch: its prompt, where it is, and the answer so far."""

    seq_id: int  # -1 until the batch places it (batch/streams.py)
    request: dict[str, Any]
    params: SamplingParams
    prompt: list[int]
    budget: int
    on_token: TokenCallback | None
    should_stop: StopCheck | None
    grammar: Any  # a llama_sampler (grammar) of its own, or None
    rng: np.random.Generator | None
    started: float
    prefilled: int = 0  # prompt tokens in the KV cache
    cached: int = 0  # of which held or copied from another sequence, not prefilled
    tiled: int = 0  # prefill_plan.tiled_until of the prompt: how its cells were evaluated
    plan: list[int] = field(default_factory=list)  # the prefill steps still to run, in tokens
    deadline: float | None = None  # time.monotonic() by which the answer is due
    leader: Sequence | None = None  # a running sequence prefilling this prompt's prefix
    lead_target: int = 0  # the tokens of it to wait for, then copy
    pending: int | None = None  # the last sampled token, to be decoded at the next step
    generated: list[int] = field(default_factory=list)
    entries: list[dict[str, Any]] = field(default_factory=list)
    text: str = ""
    emitted: int = 0
    first_token_at: float | None = None
    stop_cause: str | None = None
    finish_reason: str = "stop"
    counts: dict[int, int] = field(default_factory=dict)
    decoder: Any = field(default_factory=lambda: codecs.getincrementaldecoder("utf-8")("replace"))
    error: str | None = None
    steps: int = 0  # decode steps this sequence took part in
    rows_seen: int = 0  # sum of the batch sizes of those steps
    drafter: PromptLookup | None = None  # speculation: greedy, no grammar, no penalties
    policies: dict[int, DraftPolicy] = field(default_factory=dict)
    draft: list[int] = field(default_factory=list)  # this step's drafted tokens
    drafted: int = 0
    accepted: int = 0
    watch: Watch | None = None  # a thinking model's answer (proxy/engine/reasoning.py)
    deferred: bool = False  # deferred work: paused while an interactive sequence runs
    parked: Any = None  # a paused sequence's KV, moved out of its stream (batch/streams.py)
    _history: npt.NDArray[np.intc] | None = field(default=None, repr=False)
    _in_history: int = field(default=0, repr=False)

    @property
    def done(self) -> bool:
        return self.stop_cause is not None or self.error is not None

    @property
    def n_past(self) -> int:
        return self.prefilled + len(self.generated) - (1 if self.pending is not None else 0)

    @property
    def prefilling(self) -> bool:
        """Prompt tokens (but the last, decoded with the answer) still to prefill."""
        return self.prefilled < len(self.prompt) - 1

    def history(self) -> npt.NDArray[np.intc]:
        """The prompt and the answer so far, as the array prompt lookup searches: kept from
        step to step and extended by the new tokens only, not rebuilt every step."""
        n_prompt = len(self.prompt)
        size = n_prompt + len(self.generated)
        buf = self._history
        if buf is None or buf.shape[0] < size:
            grown = np.empty(max(size, n_prompt + self.budget + 1), dtype=np.intc)
            if buf is None:
                grown[:n_prompt] = self.prompt
                self._in_history = n_prompt
            else:
                grown[: self._in_history] = buf[: self._in_history]
            buf = self._history = grown
        if self._in_history < size:
            buf[self._in_history : size] = self.generated[self._in_history - n_prompt :]
            self._in_history = size
        return buf[:size]

    def held(self) -> list[int]:
        """The tokens whose KV this sequence's stream holds now (cells ``0 .. n_past - 1``)."""
        return (self.prompt + self.generated)[: self.n_past]

    def accept(self, llm: Any, token: int, logprob: float, best: list[Any]) -> None:
        """Take one sampled token (with its logprobs) as ``LocalModel.chat`` does: end at EOS, a
        stop string or the budget; stream what can no longer begin a stop string."""
        from llama_cpp import llama_vocab_is_eog

        if self.first_token_at is None:
            self.first_token_at = time.perf_counter()
        if llama_vocab_is_eog(llm._model.vocab, token):
            self.stop_cause = "eos"
            return
        piece = llm.detokenize([token], prev_tokens=self.prompt + self.generated)
        self.generated.append(token)
        self.pending = token
        self.counts[token] = self.counts.get(token, 0) + 1
        self.entries.append(logprob_entry(llm, piece, logprob, best))
        self.text += self.decoder.decode(piece)
        stops = self.params.stop
        cut = next((self.text.find(s) for s in stops if s in self.text), -1)
        if cut >= 0:
            self.text = self.text[:cut]
            self.stop_cause = "stop_sequence"
            return
        if self.on_token is not None:
            safe = len(self.text) - held_back(self.text, stops)
            if safe > self.emitted:
                self.on_token(self.text[self.emitted : safe])
                self.emitted = safe
        if len(self.generated) >= self.budget:
            full = self.budget == self.params.max_tokens
            self.stop_cause = "max_tokens" if full else "context_full"
            self.finish_reason = "length"
        elif self.watch is not None and self.watch.over_budget(self.text, len(self.generated)):
            self.stop_cause = "thinking_budget"
            self.finish_reason = "length"

    def completion(self, model: str) -> dict[str, Any]:
        """The OpenAI ``chat.completion`` of this finished sequence, shaped as ``LocalModel.chat``
        (``model`` is the name it answers as); the text held back for stop strings is sent."""
        self.text += self.decoder.decode(b"", final=True)
        if self.on_token is not None and len(self.text) > self.emitted:
            self.on_token(self.text[self.emitted :])
            self.emitted = len(self.text)
        if self.watch is not None:
            self.watch.close()
        done = time.perf_counter()
        first = self.first_token_at or done
        n_prompt = len(self.prompt)
        n_out = len(self.generated)
        completion = chat_completion(
            model=model,
            text=self.text,
            entries=self.entries,
            finish_reason=self.finish_reason,
            prompt_tokens=n_prompt,
            completion_tokens=n_out,
            cached_tokens=self.cached,
            prefilled_tokens=self.prefilled - self.cached,
            stop_cause=self.stop_cause,
            prefill_s=first - self.started,
            decode_s=done - first,
            speculative={
                "mode": "prompt-lookup",
                "steps": self.steps,
                "verify_batches": self.steps,
                "drafted": self.drafted,
                "accepted": self.accepted,
            }
            if self.drafter is not None
            else None,
            batch={
                "steps": self.steps,
                "mean_rows_per_step": round(self.rows_seen / self.steps, 2) if self.steps else None,
                "tok_s": round((n_out - 1) / (done - first), 1)
                if n_out > 1 and done > first
                else None,
            },
        )
        if self.watch is not None:
            self.watch.apply(completion)
        return completion


@dataclass
class BatchStats:
    """What the batch loop has done, for ``/healthz`` and ``/metrics``."""

    steps: int = 0
    rows: int = 0  # sum over steps of the rows decoded
    decode_steps: int = 0
    decode_rows: int = 0  # sum over decode steps of their rows (one per sequence)
    decoded_tokens: int = 0
    busy_s: float = 0.0
    decode_s: float = 0.0  # of busy_s, in decode steps
    max_rows: int = 0
    sequences: int = 0
    reused: int = 0  # sequences that kept a prefix instead of prefilling it
    reused_tokens: int = 0
    copies: int = 0  # prefixes copied from another sequence's stream
    followed: int = 0  # sequences that waited for another to prefill their prefix
    parked: int = 0  # deferred sequences moved out of their stream for an interactive one
    resumed: int = 0  # of them, put back into a stream
    prefill_rate: float | None = None  # prompt tokens per second of prefill steps (EWMA)
    # Decode steps by width (sequences in the step, drafted rows not counted): [seconds a
    # step, answer tokens a sequence gets from it, steps seen], seconds and tokens as moving
    # averages. What the forecast plays the answers forward with (batch/forecast.py).
    by_width: dict[int, list[float]] = field(default_factory=dict)

    def prefilled_step(self, tokens: int, seconds: float) -> None:
        """One prefill step: its rate, as a moving average (the machine's speed drifts)."""
        if tokens >= 16 and seconds > 0:
            self.prefill_rate = ewma(self.prefill_rate, tokens / seconds)

    def decoded_step(self, width: int, seconds: float, tokens: int) -> None:
        """One decode step of ``width`` sequences that took ``seconds`` and gave ``tokens``
        answer tokens in all. A step more than twice the average (the shared machine preempted
        it) counts as twice the average once the width has a few steps."""
        if width < 1 or seconds <= 0:
            return
        seen = self.by_width.get(width)
        per_sequence = tokens / width
        if seen is None:
            self.by_width[width] = [seconds, per_sequence, 1.0]
            return
        sample = min(seconds, 2.0 * seen[0]) if seen[2] >= 3 else seconds
        seen[0] = ewma(seen[0], sample, WIDTH_ALPHA)
        seen[1] = ewma(seen[1], per_sequence, WIDTH_ALPHA)
        seen[2] += 1

    def as_dict(self) -> dict[str, Any]:
        prefill_steps = self.steps - self.decode_steps
        return {
            "steps": self.steps,
            "sequences": self.sequences,
            "decode_steps": self.decode_steps,
            "mean_rows_per_step": round(self.decode_rows / self.decode_steps, 2)
            if self.decode_steps
            else None,
            "max_rows_per_step": self.max_rows,
            "mean_prefill_tokens_per_step": round((self.rows - self.decode_rows) / prefill_steps, 1)
            if prefill_steps
            else None,
            "decoded_tokens": self.decoded_tokens,
            "aggregate_tok_s": round(self.decoded_tokens / self.decode_s, 1)
            if self.decode_s
            else None,
            "prefill_tok_s": None if self.prefill_rate is None else round(self.prefill_rate, 1),
            "step_ms_by_width": {
                str(width): {
                    "ms": round(seconds * 1000, 2),
                    "tokens_per_sequence": round(tokens, 3),
                    "steps": int(steps),
                }
                for width, (seconds, tokens, steps) in sorted(self.by_width.items())
            },
            "busy_s": round(self.busy_s, 3),
            "prefix": {
                "sequences": self.reused,
                "tokens": self.reused_tokens,
                "copies": self.copies,
                "followed": self.followed,
            },
            "deferred": {"parked": self.parked, "resumed": self.resumed},
        }
