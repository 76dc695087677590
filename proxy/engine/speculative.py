"""Speculative decoding for greedy requests, in our own llama.cpp batch loop.

llama-cpp-python can speculate by itself (``Llama(draft_model=...)``), but it then forces
``logits_all=True``: an n_ctx x n_vocab float buffer filled on every decode, which made decoding
about 4x slower here. This module drives llama.cpp's batch API directly instead:

    draft   k tokens, from the prompt's n-grams (:class:`PromptLookup`) or a small second model
            sharing the vocabulary (:class:`LlamaDraftModel`)
    verify  decode [pending, d1..dk] in one batch, logits only for those k + 1 rows
    accept  the drafted tokens while they equal the greedy choice, plus the model's own next token
    undo    the rejected tail with ``llama_memory_seq_rm``

Under greedy decoding the emitted tokens are the ones plain decoding would have produced; only
the number of ``llama_decode`` calls changes. The logprob of each emitted token comes straight from
its row of logits.

Speculation pays only when enough drafted tokens are accepted: how long each draft is, is
decided by :class:`~proxy.engine.draft_policy.DraftPolicy` from the acceptance seen so far and
the measured cost of a verify batch (:mod:`proxy.engine.draft_policy`).
"""

from __future__ import annotations

import time
from collections.abc import Generator, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from proxy.engine.draft_policy import DraftPolicy, StepCosts, VerifyCost

Step = tuple[int, float, list[tuple[int, float]]]  # token, its logprob, top alternatives


class Drafter(Protocol):
    """Proposes the next tokens of a sequence."""

    name: str
    cost_per_token_s: float  # measured time to draft one token (0 for lookups)
    last_match: int  # what kind of draft the last one was (n-gram length; 0 for a model)

    def draft(self, seq: npt.NDArray[np.intc], k: int) -> list[int]: ...


def token_logprob(
    row: npt.NDArray[np.float32], token: int, top: int
) -> tuple[float, list[tuple[int, float]]]:
    """The logprob of ``token`` under one row of raw logits, and the ``top`` best alternatives."""
    peak = float(row.max())
    lse = peak + float(np.log(np.exp(row - peak).sum()))
    best: list[tuple[int, float]] = []
    if top > 0:
        idx = np.argpartition(-row, top)[:top]
        idx = idx[np.argsort(-row[idx], kind="stable")]
        best = [(int(i), float(row[i]) - lse) for i in idx]
    return float(row[token]) - lse, best


class PromptLookup:
    """Drafts by copying what followed the latest earlier occurrence of the sequence's tail.

    The tail is matched at ``ngram_max`` tokens first, then shorter down to ``ngram_min``. This is
    what makes extraction, typo fixing and reformatting fast: their answers copy the prompt.
    """

    name = "prompt-lookup"
    cost_per_token_s = 0.0

    def __init__(self, *, ngram_max: int = 3, ngram_min: int = 1) -> None:
        if not 1 <= ngram_min <= ngram_max:
            raise ValueError(f"expected 1 <= ngram_min <= ngram_max, got {ngram_min}, {ngram_max}")
        self.ngram_max = ngram_max
        self.ngram_min = ngram_min
        self.last_match = 0

    def draft(self, seq: npt.NDArray[np.intc], k: int) -> list[int]:
        size = len(seq)
        self.last_match = 0
        if k <= 0:
            return []
        for n in range(min(self.ngram_max, size - 1), self.ngram_min - 1, -1):
            tail = seq[size - n :]
            # Candidate starts whose first token matches, then the rest of the n-gram; the tail
            # itself (which starts at size - n) is excluded.
            starts = np.flatnonzero(seq[: size - n] == tail[0])
            for j in range(1, n):
                if starts.size == 0:
                    break
                starts = starts[seq[starts + j] == tail[j]]
            if starts.size:
                begin = int(starts[-1]) + n
                follow = seq[begin : begin + k]
                if follow.size:
                    self.last_match = n
                    return [int(t) for t in follow]
        return []


class LlamaDraftModel:
    """Drafts greedily with a second, smaller GGUF that shares the main model's vocabulary.

    It keeps its own KV cache in step with the main sequence: each call evaluates only the tokens
    it has not seen (the whole prompt the first time), then decodes ``k`` tokens one by one.
    """

    name = "draft"
    last_match = 0

    def __init__(self, llm: Any, *, eog: Any) -> None:
        self.llm = llm
        self._is_eog = eog
        self.cost_per_token_s = 0.0

    def _sync(self, seq: npt.NDArray[np.intc]) -> None:
        llm = self.llm
        have = llm.input_ids[: llm.n_tokens]
        m = min(len(have), len(seq) - 1)
        diff = np.flatnonzero(have[:m] != seq[:m])
        keep = int(diff[0]) if diff.size else m
        if keep < llm.n_tokens:
            if not llm._ctx.kv_cache_seq_rm(-1, keep, -1):
                keep = 0
                llm._ctx.kv_cache_clear()
            llm.n_tokens = keep
        llm.eval(seq[keep:].tolist())

    def draft(self, seq: npt.NDArray[np.intc], k: int) -> list[int]:
        if k <= 0 or len(seq) + k >= self.llm.n_ctx():
            return []
        llm = self.llm
        self._sync(seq)
        out: list[int] = []
        n_vocab = llm.n_vocab()
        while True:
            row = np.ctypeslib.as_array(llm._ctx.get_logits_ith(-1), shape=(n_vocab,))
            token = int(row.argmax())
            if self._is_eog(token):
                break
            out.append(token)
            if len(out) >= k:
                break
            llm.eval([token])
        return out


class BatchDecoder:
    """One llama_batch of our own: decode tokens of sequence 0 with logits for every row."""

    def __init__(self, llm: Any, capacity: int) -> None:
        import llama_cpp

        self._lib = llama_cpp
        self.llm = llm
        self.capacity = capacity
        self.n_vocab: int = llm.n_vocab()
        self._batch = llama_cpp.llama_batch_init(capacity, 0, 1)

    def close(self) -> None:
        if self._batch is not None:
            self._lib.llama_batch_free(self._batch)
            self._batch = None

    def __del__(self) -> None:
        self.close()

    def decode(self, tokens: Sequence[int], pos: int, *, logits: bool = True) -> None:
        """Put ``tokens`` at positions ``pos``.. of sequence 0, after dropping anything from
        ``pos`` on. With ``logits`` every row's logits are kept, otherwise only the last's."""
        n = len(tokens)
        if not 0 < n <= self.capacity:
            raise ValueError(f"batch of {n} tokens, capacity {self.capacity}")
        llm = self.llm
        llm._ctx.kv_cache_seq_rm(-1, pos, -1)
        batch = self._batch
        batch.n_tokens = n
        for i, token in enumerate(tokens):
            batch.token[i] = token
            batch.pos[i] = pos + i
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = logits
        batch.logits[n - 1] = True
        code = self._lib.llama_decode(llm._ctx.ctx, batch)
        if code != 0:
            raise RuntimeError(f"llama_decode returned {code}")

    def row(self, i: int) -> npt.NDArray[np.float32]:
        """Logits of batch row ``i`` (a view, valid until the next decode)."""
        ptr = self._lib.llama_get_logits_ith(self.llm._ctx.ctx, i)
        return np.ctypeslib.as_array(ptr, shape=(self.n_vocab,))


@dataclass
class SpecStats:
    """Speculation counts of one request, reported in ``completion["frugal"]["speculative"]``."""

    mode: str
    steps: int = 0
    verify_batches: int = 0  # the fields in the order they are reported
    drafted: int = 0
    accepted: int = 0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class Speculator:
    """Greedy generation with drafts and batch verification on a loaded ``Llama``.

    Acceptance is tracked apart for each kind of draft (a prompt-lookup draft found from a
    3-token match is far more often right than one from a single token), and carried across
    requests (``priors``), so that a workload where drafts keep failing starts its next request
    with speculation turned down.
    """

    def __init__(
        self,
        llm: Any,
        drafter: Drafter,
        *,
        max_draft: int = 8,
        cost: VerifyCost | None = None,
        adaptive: bool = True,
    ) -> None:
        self.llm = llm
        self.drafter = drafter
        self.max_draft = max_draft
        self.costs = StepCosts(max_draft + 1, prior=cost)
        self.adaptive = adaptive
        self.priors: dict[int, float] = {0: 0.6, 1: 0.35, 2: 0.5}
        self.decoder = BatchDecoder(llm, max_draft + 1)

    def close(self) -> None:
        self.decoder.close()

    def _prior(self, key: int) -> float:
        return self.priors.get(key, 0.65)

    def _learn(self, policies: dict[int, DraftPolicy]) -> None:
        """Carry this request's per-token acceptance into the next request's priors."""
        for key, policy in policies.items():
            if policy.accepted + policy.rejected >= 4:
                rate = policy.accepted / (policy.accepted + policy.rejected)
                prior = self._prior(key)
                self.priors[key] = min(0.95, max(0.05, prior + 0.3 * (rate - prior)))

    def generate(
        self,
        tokens: Sequence[int],
        *,
        limit: int,
        top: int,
        bias: dict[int, float] | None = None,
        stats: SpecStats,
    ) -> Generator[Step, None, None]:
        """Yield greedy tokens after ``tokens``, whose all-but-last are already in the KV cache.

        ``limit`` is the most tokens the caller will take; drafts never reach past it.
        """
        llm = self.llm
        n_ctx: int = llm.n_ctx()
        n = int(llm.n_tokens)
        if n != len(tokens) - 1:  # pragma: no cover - the caller prefills first
            raise RuntimeError(f"expected {len(tokens) - 1} tokens in the KV cache, found {n}")
        seq = np.zeros(min(n_ctx, len(tokens) + limit + self.max_draft + 1), dtype=np.intc)
        seq[: len(tokens)] = tokens
        size = len(tokens)
        bias_vec: npt.NDArray[np.float32] | None = None
        if bias:
            bias_vec = np.zeros(self.decoder.n_vocab, dtype=np.float32)
            for tok, value in bias.items():
                if 0 <= tok < bias_vec.shape[0]:
                    bias_vec[tok] += value
        policies: dict[int, DraftPolicy] = {}

        def policy_for(key: int) -> DraftPolicy:
            if key not in policies:
                policies[key] = DraftPolicy(
                    max_draft=self.max_draft,
                    cost=self.costs,
                    draft_cost_s=self.drafter.cost_per_token_s,
                    prior=self._prior(key),
                    adaptive=self.adaptive,
                )
            return policies[key]

        drafter = self.drafter
        free_drafts = drafter.cost_per_token_s == 0.0
        emitted = 0
        try:
            while emitted < limit:
                room = min(limit - emitted - 1, n_ctx - n - 1, len(seq) - size, self.max_draft)
                draft: list[int] = []
                if room > 0 and free_drafts:
                    # A lookup costs nothing: find the draft first, then decide how much of it
                    # is worth verifying, from how drafts of its kind have fared.
                    draft = drafter.draft(seq[:size], room)
                    policy = policy_for(drafter.last_match)
                    draft = draft[: policy.choose(len(draft))] if draft else []
                else:
                    policy = policy_for(0)
                    k = policy.choose(room)
                    draft = drafter.draft(seq[:size], k)[:k] if k > 0 else []
                batch = [int(seq[size - 1]), *draft]
                step_started = time.perf_counter()
                self.decoder.decode(batch, n, logits=True)
                stats.verify_batches += 1
                out: list[Step] = []
                for i in range(len(batch)):
                    row = self.decoder.row(i)
                    chosen = row if bias_vec is None else row + bias_vec
                    token = int(chosen.argmax())
                    logprob, best = token_logprob(row, token, top)
                    out.append((token, logprob, best))
                    if i >= len(draft) or draft[i] != token:
                        break
                self.costs.observe(len(batch), time.perf_counter() - step_started)
                accepted = len(out) - 1
                valid = n + accepted + 1
                if valid < n + len(batch):
                    llm._ctx.kv_cache_seq_rm(-1, valid, -1)
                llm.input_ids[n:valid] = batch[: accepted + 1]
                llm.n_tokens = valid
                n = valid
                if draft:
                    stats.steps += 1
                    stats.drafted += len(draft)
                    stats.accepted += accepted
                    policy.update(len(draft), accepted)
                for step in out:
                    seq[size] = step[0]
                    size += 1
                    emitted += 1
                    yield step
        finally:
            self._learn(policies)
            # Whatever the caller did with the last token, the KV cache holds exactly
            # llm.input_ids[:llm.n_tokens]; llama-cpp-python must re-evaluate before sampling.
            llm._requires_eval = True
