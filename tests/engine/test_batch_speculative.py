"""Speculation inside the batch when it drafts nothing: the decode steps of plain decoding.

Issue 27: at the defaults (prompt lookup, ``parallel = 4``) a lone free-chat request must cost
what a plain one costs. Where the policy declines every draft, a speculating sequence must make
the same ``llama_decode`` calls, with the same rows and the same rows asking for logits, as the
same request in a plain engine, and give the same answer. The calls are counted on the real
llama.cpp, through a wrapper that passes each one on.
"""

from __future__ import annotations

import copy
from typing import Any

from proxy.engine.batch.decode import BatchEngine
from proxy.engine.draft_policy import Priors, StepCosts
from proxy.engine.generate import LocalModel

CHAT = {
    "messages": [{"role": "user", "content": "How can I get better at waking up early?"}],
    "max_tokens": 48,
    "temperature": 0,
    "logprobs": True,
    "top_logprobs": 1,
}


class CountingLlama:
    """llama_cpp, with each ``llama_decode`` noted as (rows, rows with logits) and passed on."""

    def __init__(self, lib: Any) -> None:
        self._lib = lib
        self.calls: list[tuple[int, int]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._lib, name)

    def llama_decode(self, ctx: Any, batch: Any) -> int:
        n = int(batch.n_tokens)
        self.calls.append((n, sum(1 for i in range(n) if batch.logits[i])))
        return int(self._lib.llama_decode(ctx, batch))

    def llama_memory_seq_rm(self, *args: Any) -> bool:
        self.calls.append((-1, -1))  # a KV removal: plain decoding never makes one
        return bool(self._lib.llama_memory_seq_rm(*args))


def _answer(engine: BatchEngine) -> tuple[dict[str, Any], list[tuple[int, int]]]:
    counting = CountingLlama(engine._lib)
    engine._lib = counting
    try:
        seq = engine.add(dict(CHAT))
        assert seq is not None
        engine.run_all()
        return engine.completion(seq), counting.calls
    finally:
        engine._lib = counting._lib


def test_a_sequence_whose_drafts_are_declined_decodes_as_a_plain_one(model: LocalModel) -> None:
    plain = BatchEngine(model, 4)
    spec = BatchEngine(model, 4, speculative=True)
    # As after a run of requests where drafts failed: no kind of draft is worth trying.
    spec.priors = Priors({}, default=0.05, floor=0.0)
    try:
        want, plain_calls = _answer(plain)
        got, spec_calls = _answer(spec)
    finally:
        plain.close()
        spec.close()
    assert got["choices"] == want["choices"]
    assert got["frugal"]["speculative"]["drafted"] == 0
    assert spec_calls == plain_calls
    assert plain_calls[1:] == [(1, 1)] * (len(plain_calls) - 1)  # one row a step, after the prompt
    assert spec.draft_costs.as_dict().keys() == {"1"}  # no step of more rows was ever run


class MemoryBound(StepCosts):
    """A decode step that costs the same whatever its rows, as on a memory-bound model, where a
    right draft always pays. The test then sees what the drafts yielded, not how this shared
    machine happened to time a step of several rows (which can make the policy stop drafting)."""

    def __init__(self) -> None:
        super().__init__(1)

    def observe(self, rows: int, seconds: float) -> None:
        pass

    def __call__(self, rows: int) -> float:
        return 0.01


def test_a_speculating_engine_carries_what_drafts_yielded_to_the_next_request(
    model: LocalModel,
) -> None:
    request = {
        "messages": [
            {
                "role": "user",
                "content": "Copy this text word for word:\n\nAlice Martin met Bob Stone and "
                "Carol White in Paris. Dave Brown stayed home with Erin Black.",
            }
        ],
        "max_tokens": 40,
        "temperature": 0,
    }
    engine = BatchEngine(model, 4, speculative=True)
    engine.draft_costs = MemoryBound()
    before = copy.deepcopy(engine.priors)
    try:
        seq = engine.add(request)
        assert seq is not None
        engine.run_all()
        drafted = seq.policies  # by kind of draft (n-gram length), those the request used
    finally:
        engine.close()
    assert drafted, "the copy drafted nothing"
    assert sum(p.accepted for p in drafted.values()) >= 3  # the copy's drafts were right
    assert all(p.rejected == 0 for p in drafted.values())
    for kind, policy in drafted.items():
        assert engine.priors[kind] == min(engine.priors.ceiling, policy.p)
        assert engine.priors[kind] > before[kind]  # the next request drafts more of this kind
