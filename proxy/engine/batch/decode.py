"""Continuous batching: up to N chat completions decoded together in one llama.cpp context.

:class:`BatchEngine` owns a second llama.cpp context on the loaded model, made with
``n_seq_max = N`` and one KV stream of ``n_ctx`` cells per sequence (``kv_unified = false``), so
that every sequence has the whole context of the single path and attention never looks across
sequences: with one unified cache, a row's logits changed with what else was in the step (by up
to 0.7 in logprob here, enough to flip greedy choices). Each sequence has its own sequence id;
each :meth:`BatchEngine.step` is one ``llama_decode``, of one of two kinds:

    decode   one row with logits for every sequence that has one: its last sampled token, or
             the last token of its prompt (which gives it its first answer token); with
             speculation, a greedy sequence's drafted tokens are more rows of it
    prefill  one step of one joining sequence's prompt but its last token, no logits, cut by
             ``prefill_plan.py`` as a cold prefill on the single path would cut it

Which kind comes next is ``batch/turns.py``'s (interactive answers keep 80% of the time, more
when one is due; deferred answers let a waiting prompt go first); which stream a prompt gets,
and the cells of a shared prefix it keeps, copies or waits for, is ``batch/streams.py``'s.
After the decode each row with logits is sampled on its own: its
sampling parameters (greedy, or temperature / top-p / top-k / min-p with its own seeded
generator), penalties, logit bias, grammar (a llama.cpp grammar sampler per sequence),
logprobs, stop strings, ``max_tokens``, deadline and cancellation (``should_stop``). A sequence
that stops leaves the batch before the next step; the others go on.

Each sequence is interactive (the default) or *deferred* (``add(deferred=True)``: a batch
line, a background response; ``proxy/engine/priority.py``). While any interactive sequence is in
the batch, the deferred ones are paused: no step decodes or prefills them, their cells stay where
they are, and the interactive answers run as on an idle engine. An interactive request that
finds every id taken parks a paused deferred sequence (the one with the fewest cells): its cells
are copied out of the context and its id given to the newcomer (``Streams.park``). Once no
interactive sequence is left, parked sequences go back into free ids (oldest first, before any
new deferred one joins) and every deferred sequence goes on where it stopped, token for token the
answer it would have given without the pause. Deadlines and cancellation are checked for paused
and parked sequences too.

With flash attention on and one thread, greedy answers are token for token (and logprob for
logprob) those of the same request run alone from an empty context (``tests/engine/
test_batch.py``, ``test_batch_streams.py``). llama-server differs: it puts prompt chunks and
decode rows in the same step, which lets answers depend on the batch. Sampled answers
(temperature > 0) follow the single path's distribution, not its random draws.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import numpy.typing as npt

from proxy.engine.batch.samplers import GrammarMasks
from proxy.engine.batch.sequence import BatchStats, Sequence
from proxy.engine.batch.streams import Streams
from proxy.engine.batch.turns import Turns
from proxy.engine.draft_policy import DraftPolicy, Priors, StepCosts
from proxy.engine.generate import LocalModel, PromptTooLong, StopCheck, TokenCallback
from proxy.engine.prefill_plan import tiled_until
from proxy.engine.sampling import (
    SamplingParams,
    adjusted,
    biased,
    pick,
)
from proxy.engine.speculative import PromptLookup, token_logprob


class BatchError(Exception):
    """llama.cpp refused a batch (no KV cells left, or a decode error): every row fails."""


class BatchEngine:
    """Up to ``n_seq`` sequences decoded together; see the module docstring."""

    def __init__(
        self,
        model: LocalModel,
        n_seq: int,
        *,
        speculative: bool = False,
        max_draft: int = 8,
        lookup_ngram: int = 3,
        max_rows: int = 16,
    ) -> None:
        import llama_cpp
        from llama_cpp._internals import LlamaContext

        self._lib = llama_cpp
        self.model = model
        self.llm = model.llm
        self.n_seq = max(1, n_seq)
        self.n_ctx = model.n_ctx
        self.n_vocab: int = self.llm.n_vocab()
        params = llama_cpp.llama_context_params.from_buffer_copy(self.llm.context_params)
        params.n_seq_max = self.n_seq
        params.kv_unified = False  # a KV stream of n_ctx cells per sequence; see above
        params.n_ctx = self.n_ctx * self.n_seq
        self.n_batch = int(params.n_batch)
        self.chunk = self.n_batch  # the single path's cut: see prefill_plan.py
        self._ctx = LlamaContext(model=self.llm._model, params=params, verbose=False)
        self._mem = llama_cpp.llama_get_memory(self._ctx.ctx)
        self._batch = llama_cpp.llama_batch_init(self.n_batch, 0, 1)
        self.active: list[Sequence] = []
        self.parked: list[Sequence] = []  # paused deferred sequences out of the streams
        self.stats = BatchStats()
        self.streams = Streams(llama_cpp, self._mem, self.n_seq, self.chunk, self.stats)
        # Decode-step seconds by number of rows: the batch's cost as a function of its size.
        self.speculative = speculative
        self.max_draft = max_draft
        self.lookup_ngram = lookup_ngram
        self.max_rows = max(max_rows, self.n_seq)  # rows of a decode step, drafts included
        self.step_costs = StepCosts(self.max_rows)
        # The same steps in CPU time, which the draft policy weighs: a step preempted on a
        # shared machine takes longer but costs no more CPU, so the ratio of a k-row step to a
        # one-row step, all that the policy reads, is not lost in the noise of wall time.
        self.draft_costs = StepCosts(self.max_rows)
        # Acceptance by n-gram length, carried from each speculating request to the next.
        self.priors = Priors({1: 0.4, 2: 0.5}, default=0.65, floor=0.4)
        # The predicted gain a draft must reach. The acceptance a policy starts from is a
        # prior, optimistic for free chat: a draft predicted to gain less than 10% lost as
        # often as it won there (bench/README.md, (5b)). At the floor of the priors a fresh
        # policy's optimistic estimate still reaches it, so each kind of draft is tried.
        self.min_gain = 1.10
        self.turns = Turns(self.step_costs)  # prefill or decode next: batch/turns.py
        self._grammars = GrammarMasks(llama_cpp, self.llm, self.n_vocab)

    def close(self) -> None:
        if self._batch is not None:
            self._lib.llama_batch_free(self._batch)
            self._batch = None
        for seq in [*self.active, *self.parked]:
            self._free_grammar(seq)
        self.active = []
        self.parked = []
        context: Any = self._ctx  # llama_cpp's internals are untyped
        context.close()

    # -- admission --------------------------------------------------------------------------

    def forget(self) -> None:
        """Drop the cells the free sequence ids still hold: the next prompts are prefilled
        from an empty cache, as after start (benchmarks of a cold request)."""
        self.streams.clear()

    def fits(self) -> bool:
        """Whether a sequence can join now: a free sequence id (its KV stream is its own)."""
        return bool(self.streams.free)

    @property
    def busy(self) -> bool:
        """Sequences in the batch, running, paused or parked."""
        return bool(self.active or self.parked)

    @property
    def interactive(self) -> bool:
        """Whether an interactive sequence is in the batch (the deferred ones are paused)."""
        return any(not q.deferred for q in self.active)

    def _room(self, deferred: bool) -> bool:
        """Whether a sequence of this class can take an id now: a deferred one once every
        parked one is back; an interactive one also by parking a deferred one."""
        if deferred:
            self._resume()
            return not self.parked and self.fits()
        if self.fits():
            return True
        paused = [q for q in self.active if q.deferred and q.leader is None]
        if not paused:
            return False
        victim = min(paused, key=lambda q: q.n_past)
        self.streams.park(victim, self._ctx.ctx)
        self.active.remove(victim)
        self.parked.append(victim)
        return True

    def _resume(self) -> None:
        """Put parked sequences back into free ids, oldest first, once no interactive
        sequence is in the batch."""
        while self.parked and self.fits() and not self.interactive:
            seq = self.parked.pop(0)
            self.streams.unpark(seq, self._ctx.ctx)
            self.active.append(seq)

    def _live(self) -> list[Sequence]:
        """The sequences this step may serve: the interactive ones if any, else all."""
        interactive = [q for q in self.active if not q.deferred]
        return interactive or self.active

    def add(
        self,
        request: dict[str, Any],
        *,
        on_token: TokenCallback | None = None,
        should_stop: StopCheck | None = None,
        grammar: Any = None,
        prompt: list[int] | None = None,
        deadline: float | None = None,
        deferred: bool = False,
    ) -> Sequence | None:
        """Admit a chat request at the next step; None while there is no room for it yet.

        Raises :class:`PromptTooLong` when it could never fit. ``grammar`` is a ``LlamaGrammar``.
        ``deferred``: deferred work, paused while interactive sequences run (module docstring).
        """
        params = SamplingParams.from_request(request, self.model.default_max_tokens)
        tokens = self.model.prompt_tokens(request) if prompt is None else list(prompt)
        n_prompt = len(tokens)
        if n_prompt >= self.n_ctx:
            raise PromptTooLong(n_prompt, self.n_ctx)
        budget = min(params.max_tokens, self.n_ctx - n_prompt)
        if not self._room(deferred):
            return None
        sampler = self._grammars.new(grammar) if grammar is not None else None
        watch = self.model.watch_thinking(request, on_token) if prompt is None else None
        if watch is not None:
            on_token = watch.on_token
        rng = None
        if params.temperature > 0:
            rng = np.random.default_rng(params.seed)
        drafter = None
        plain = not (params.presence_penalty or params.frequency_penalty)
        if self.speculative and rng is None and sampler is None and plain:
            drafter = PromptLookup(ngram_max=self.lookup_ngram)
        seq = Sequence(
            seq_id=-1,
            request=request,
            params=params,
            prompt=tokens,
            budget=budget,
            on_token=on_token,
            should_stop=should_stop,
            grammar=sampler,
            rng=rng,
            started=time.perf_counter(),
            drafter=drafter,
            tiled=tiled_until(n_prompt, self.chunk),
            deadline=deadline,
            watch=watch,
            deferred=deferred,
        )
        self.streams.place(seq, self.active)
        self.active.append(seq)
        self.stats.sequences += 1
        return seq

    # -- one step ---------------------------------------------------------------------------

    def step(self) -> list[Sequence]:
        """One ``llama_decode`` over the active rows; returns the sequences that finished."""
        self._resume()
        finished = self._check_stops()
        if not self.active:
            return finished
        live = self._live()  # deferred sequences wait while an interactive one runs
        batch = self._batch
        rows: list[tuple[Sequence, int]] = []  # (sequence, batch row with logits)
        n = 0
        for q in self.active:
            if q.leader is not None:
                self.streams.waiting(q, self.active)
        filling = next((q for q in live if q.prefilling and q.leader is None), None)
        decodable = self._decodable(live)
        if self.turns.prefill_next(live, filling) and filling is not None:
            # A prefill step: one sequence's chunk alone, cut by its plan (prefill_plan.py).
            left = len(filling.prompt) - 1 - filling.prefilled
            take = min(filling.plan.pop(0) if filling.plan else self.chunk, left)
            for j in range(take):
                pos = filling.prefilled + j
                self._put(n, filling.prompt[pos], pos, filling.seq_id, False)
                n += 1
            filling.prefilled += take
        else:
            # A decode step: one row with logits per sequence, its last sampled token or its
            # last prompt token; and a speculating sequence's drafted tokens after its own.
            base = sum(1 for q in live if q.pending is not None or q.prefilled == len(q.prompt) - 1)
            spare = self.max_rows - base
            # Rows in ascending sequence id: measured here, rows out of that order (ids 1, 0, 3,
            # 2, as streams are taken again after a batch) cost about 20% more CPU a step.
            for seq in sorted(live, key=lambda q: q.seq_id):
                if seq.pending is not None:
                    self._put(n, seq.pending, seq.n_past, seq.seq_id, True)
                    seq.draft = self._draft(seq, base, spare) if spare > 0 else []
                    spare -= len(seq.draft)
                    for j, token in enumerate(seq.draft):
                        self._put(n + 1 + j, token, seq.n_past + 1 + j, seq.seq_id, True)
                    rows.append((seq, n))
                    n += 1 + len(seq.draft)
                    continue
                if seq.prefilled == len(seq.prompt) - 1:
                    self._put(n, seq.prompt[-1], seq.prefilled, seq.seq_id, True)
                    seq.prefilled += 1
                else:
                    continue
                rows.append((seq, n))
                n += 1
        if n == 0:  # every sequence is waiting for a prefix (not for long: its leader is not)
            return finished
        batch.n_tokens = n
        started, cpu = time.perf_counter(), time.process_time()
        code = self._lib.llama_decode(self._ctx.ctx, batch)
        decode_cpu = time.process_time() - cpu
        if code != 0:
            raise BatchError(f"llama_decode returned {code} for a batch of {n} rows")
        before = sum(len(q.generated) for q, _ in rows)
        for seq, row in rows:
            try:
                self._sample(seq, row)
            except Exception as exc:  # noqa: BLE001 - this sequence fails, the batch goes on
                seq.error = f"{type(exc).__name__}: {exc}"
        produced = sum(len(q.generated) for q, _ in rows) - before
        elapsed = time.perf_counter() - started
        if rows:
            self.step_costs.observe(n, elapsed)
            self.draft_costs.observe(n, decode_cpu)
        self.turns.after(
            prefill=not rows,
            seconds=elapsed,
            decoders=decodable,
            waiting=bool(filling),
            deferred=all(q.deferred for q in live),
        )
        stats = self.stats
        stats.steps += 1
        stats.rows += n
        if not rows:
            stats.prefilled_step(n, elapsed)
        if rows:
            stats.decoded_step(len(rows), elapsed, produced)
            stats.decode_steps += 1
            stats.decode_rows += n
            stats.max_rows = max(stats.max_rows, n)
            stats.decode_s += elapsed
        stats.busy_s += elapsed
        stats.decoded_tokens += produced
        for seq, _ in rows:
            seq.steps += 1
            seq.rows_seen += n
        return finished + self._check_stops()

    def _decodable(self, live: list[Sequence]) -> bool:
        return any(q.pending is not None or q.prefilled == len(q.prompt) - 1 for q in live)

    def _put(self, i: int, token: int, pos: int, seq_id: int, logits: bool) -> None:
        batch = self._batch
        batch.token[i] = token
        batch.pos[i] = pos
        batch.n_seq_id[i] = 1
        batch.seq_id[i][0] = seq_id
        batch.logits[i] = logits

    def _row(self, i: int) -> npt.NDArray[np.float32]:
        ptr = self._lib.llama_get_logits_ith(self._ctx.ctx, i)
        return np.ctypeslib.as_array(ptr, shape=(self.n_vocab,))

    def _draft(self, seq: Sequence, base: int, spare: int) -> list[int]:
        """This step's draft for a speculating sequence: prompt lookup, cut by its policy.

        The policy weighs the tokens a draft of k is expected to yield against the measured
        cost of this step with k more rows than the ``base`` rows it has anyway.
        """
        if seq.drafter is None:
            return []
        room = min(self.max_draft, spare, seq.budget - len(seq.generated) - 1)
        if room <= 0:
            return []
        draft = seq.drafter.draft(seq.history(), room)
        if not draft:
            return []
        key = seq.drafter.last_match
        policy = seq.policies.get(key)
        costs = self.draft_costs
        if policy is None:
            policy = DraftPolicy(
                max_draft=self.max_draft,
                cost=lambda rows: costs(base - 1 + rows),
                prior=self.priors[key],
                min_gain=self.min_gain,
            )
            seq.policies[key] = policy
        else:
            policy.cost = lambda rows: costs(base - 1 + rows)
        policy.others = base - 1
        return draft[: policy.choose(len(draft))]

    def _verify(self, seq: Sequence, first: int) -> None:
        """Greedy tokens from a speculating sequence's rows: its own, then each draft row
        while the draft matched; rejected rows leave the KV cache."""
        bias = seq.params.logit_bias
        out: list[tuple[int, float, list[Any]]] = []
        for i in range(len(seq.draft) + 1):
            raw = self._row(first + i)
            chosen = biased(raw, bias) if bias else raw
            token = int(chosen.argmax())
            logprob, best = token_logprob(raw, token, seq.params.top_logprobs)
            out.append((token, logprob, best))
            if i >= len(seq.draft) or seq.draft[i] != token:
                break
        drafted, accepted = len(seq.draft), len(out) - 1
        if drafted:
            seq.drafted += drafted
            seq.accepted += accepted
            seq.policies[seq.drafter.last_match if seq.drafter else 0].update(drafted, accepted)
        seq.draft = []
        for token, logprob, best in out:
            seq.accept(self.llm, token, logprob, best)
            if seq.done:
                return
        if accepted < drafted:
            # Prompt and answer but the new pending token are in the cache; drop the rejected
            # rows (with nothing rejected there is nothing after them: no call, as plain).
            self._lib.llama_memory_seq_rm(self._mem, seq.seq_id, seq.n_past, -1)

    def _sample(self, seq: Sequence, row_index: int) -> None:
        if seq.drafter is not None and seq.pending is not None:
            self._verify(seq, row_index)
            return
        raw = self._row(row_index)
        params = seq.params
        chosen = adjusted(raw, params, seq.counts)
        if seq.grammar is not None:
            chosen = self._grammars.apply(seq.grammar, chosen)
            if not np.isfinite(chosen.max()):
                seq.error = "the grammar allows no next token"
                return
        token = pick(chosen, params, seq.rng)
        if seq.grammar is not None:
            self._grammars.accept(seq.grammar, token)
        logprob, best = token_logprob(raw, token, params.top_logprobs)
        seq.accept(self.llm, token, logprob, best)

    def _check_stops(self) -> list[Sequence]:
        """Ask each live sequence's ``should_stop`` (paused and parked ones too); take the
        finished ones out of the batch."""
        for seq in [*self.active, *self.parked]:
            if not seq.done and seq.should_stop is not None:
                reason = seq.should_stop()
                if reason:
                    seq.stop_cause = reason
                    seq.finish_reason = "length"
        finished = [seq for seq in self.active if seq.done]
        for seq in finished:
            self.turns.ended(seq)
            self._release(seq)
        gone = [seq for seq in self.parked if seq.done]
        for seq in gone:  # its cells are in no stream: only its own state to drop
            self.parked.remove(seq)
            seq.parked = None
            if seq.policies:
                self.priors.learn(seq.policies)
            self._free_grammar(seq)
        return finished + gone

    def _release(self, seq: Sequence) -> None:
        if seq.policies:
            self.priors.learn(seq.policies)
        self.active.remove(seq)
        self.streams.release(seq)
        self._free_grammar(seq)

    def _free_grammar(self, seq: Sequence) -> None:
        if seq.grammar is not None:
            self._grammars.free(seq.grammar)
            seq.grammar = None

    def health(self) -> dict[str, Any]:
        """The loop's counts and its measured decode-step cost by number of rows."""
        turns = self.turns
        return {
            **self.stats.as_dict(),
            "step_ms_by_rows": self.step_costs.as_dict(),
            "due_steps": turns.due,
            "mean_answer_tokens": None if turns.mean_answer is None else round(turns.mean_answer),
        }

    def fail_all(self, message: str) -> list[Sequence]:
        """Every live sequence fails with ``message`` (the batch itself broke)."""
        failed = list(self.active)
        for seq in failed:
            seq.error = message
            self._release(seq)
        for seq in self.parked:
            seq.error = message
            seq.parked = None
            self._free_grammar(seq)
        failed += self.parked
        self.parked = []
        self.streams.clear()
        return failed

    # -- the answer -------------------------------------------------------------------------

    def completion(self, seq: Sequence) -> dict[str, Any]:
        """The OpenAI ``chat.completion`` of a finished sequence, shaped as ``LocalModel.chat``."""
        return seq.completion(self.model.model_name)

    def run_all(self) -> None:
        """Step until every admitted sequence is done (tests and benchmarks)."""
        while self.busy:
            self.step()
