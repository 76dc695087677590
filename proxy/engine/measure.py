"""Start-up calibration, as in profiling-informed scheduling: measure the real costs, then decide.

A few decodes on the freshly loaded model measure, on this machine and with these threads:

* prefill tok/s: one batch of prompt tokens, logits for the last row only;
* decode tok/s: single-token decodes, the way answers are generated;
* the cost of a speculative verify batch of n rows, fitted as ``fixed + per_row * n``;
* the draft model's time per drafted token, when there is one.

It takes a fraction of a second on SmolLM2-135M; the number of prefill tokens shrinks on a slow
model so that it stays short. The KV cache is left empty afterwards.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any

from proxy.engine.draft_policy import VerifyCost
from proxy.engine.speculative import BatchDecoder

TEXT = (
    b"The river runs past the old mill, under the stone bridge and into the valley, where "
    b"farmers grow wheat and barley. In the spring the water rises and floods the meadows; in "
    b"the summer children swim near the weir and fishermen wait for trout in the shade. "
)


@dataclass(frozen=True, kw_only=True)
class Calibration:
    prefill_tok_s: float
    decode_tok_s: float
    verify: VerifyCost
    draft_token_s: float
    seconds: float

    def as_dict(self) -> dict[str, Any]:
        return {
            "prefill_tok_s": round(self.prefill_tok_s, 1),
            "decode_tok_s": round(self.decode_tok_s, 1),
            "verify_fixed_ms": round(self.verify.fixed * 1000, 2),
            "verify_per_row_ms": round(self.verify.per_row * 1000, 2),
            "draft_token_ms": round(self.draft_token_s * 1000, 2),
            "seconds": round(self.seconds, 3),
        }


def _sample_tokens(llm: Any, n: int) -> list[int]:
    tokens: list[int] = llm.tokenize(TEXT, add_bos=False, special=False)
    while len(tokens) < n:
        tokens = tokens + tokens
    return tokens[:n]


def _reset(llm: Any) -> None:
    llm._ctx.kv_cache_clear()
    llm.n_tokens = 0
    llm._requires_eval = True


def _time_decode(decoder: BatchDecoder, tokens: list[int], pos: int, reps: int) -> float:
    times = []
    for _ in range(reps):
        started = time.perf_counter()
        decoder.decode(tokens, pos, logits=True)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def calibrate(llm: Any, *, draft_llm: Any = None, verify_rows: int = 8) -> Calibration:
    started = time.perf_counter()
    n_ctx = int(llm.n_ctx())
    rows = max(2, min(verify_rows, 16))
    decoder = BatchDecoder(llm, max(rows, 32))
    try:
        sample = _sample_tokens(llm, 160)
        _reset(llm)
        # Touch every weight once (mmap page-ins) before timing anything.
        decoder.decode(sample[:8], 0, logits=False)
        _reset(llm)
        first = time.perf_counter()
        decoder.decode(sample[:32], 0, logits=False)
        prefill_s, prefilled = time.perf_counter() - first, 32
        if prefill_s < 0.25 and n_ctx > 200:
            more = time.perf_counter()
            llm.n_tokens = 32
            llm.eval(sample[32:160])
            prefill_s, prefilled = time.perf_counter() - more, 128
        pos = prefilled
        one = _time_decode(decoder, sample[pos : pos + 1], pos, 6)
        many = _time_decode(decoder, sample[pos : pos + rows], pos, 3)
        per_row = max((many - one) / (rows - 1), 0.05 * one)
        verify = VerifyCost(fixed=max(one - per_row, 0.0), per_row=per_row)
        draft_s = 0.0
        if draft_llm is not None:
            draft_decoder = BatchDecoder(draft_llm, 32)
            try:
                _reset(draft_llm)
                draft_decoder.decode(sample[:32], 0, logits=False)
                draft_s = _time_decode(draft_decoder, sample[32:33], 32, 6)
            finally:
                draft_decoder.close()
                _reset(draft_llm)
    finally:
        decoder.close()
        _reset(llm)
    return Calibration(
        prefill_tok_s=prefilled / prefill_s,
        decode_tok_s=1.0 / one,
        verify=verify,
        draft_token_s=draft_s,
        seconds=time.perf_counter() - started,
    )
