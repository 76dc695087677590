"""A request's sampling parameters, and what both decoding paths do with one row of logits.

:class:`SamplingParams` reads the OpenAI parameters of a request once. The single path
(:mod:`proxy.engine.generate`) samples through ``Llama.generate`` and reads each token's logprob
with :class:`LogprobRecorder`; the batch (:mod:`proxy.engine.batch.decode`) samples each row itself,
with :func:`adjusted` (logit bias and penalties) and :func:`pick` (llama.cpp's order of top-k,
top-p, min-p and temperature, on numpy). Both report logprobs as :func:`logprob_entry` builds
them, and hold back streamed text that may still begin a stop sequence (:func:`held_back`).
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from proxy.engine.speculative import Step

__all__ = [
    "LogprobRecorder",
    "SamplingParams",
    "adjusted",
    "biased",
    "bias_processor",
    "held_back",
    "logprob_entry",
    "pick",
    "with_logprobs",
]

Logits = npt.NDArray[np.float32]


@dataclass(frozen=True, kw_only=True)
class SamplingParams:
    temperature: float
    top_p: float
    max_tokens: int
    stop: tuple[str, ...]
    seed: int | None
    presence_penalty: float
    frequency_penalty: float
    top_logprobs: int
    logit_bias: dict[int, float]

    @classmethod
    def from_request(cls, request: dict[str, Any], default_max_tokens: int) -> SamplingParams:
        stop = request.get("stop")
        stops: tuple[str, ...] = (
            (stop,) if isinstance(stop, str) else tuple(s for s in (stop or ()) if s)
        )
        max_tokens = request.get("max_completion_tokens") or request.get("max_tokens")
        bias = request.get("logit_bias") or {}
        temperature = request.get("temperature")
        top_p = request.get("top_p")
        return cls(
            temperature=0.0 if temperature is None else float(temperature),
            top_p=1.0 if top_p is None else float(top_p),
            max_tokens=int(max_tokens or default_max_tokens),
            stop=stops,
            seed=request.get("seed"),
            presence_penalty=float(request.get("presence_penalty") or 0.0),
            frequency_penalty=float(request.get("frequency_penalty") or 0.0),
            top_logprobs=int(request.get("top_logprobs") or 0) if request.get("logprobs") else 0,
            logit_bias={int(k): float(v) for k, v in bias.items()},
        )


# -- the single path (Llama.generate) ---------------------------------------------------------


class LogprobRecorder:
    """A logits processor that keeps the logits it was shown, unchanged.

    llama-cpp-python calls it once per sampled position, with the raw logits of that position,
    before penalties, grammar and the sampler itself. ``Llama.generate`` yields the sampled token
    right after, so each yielded token pairs with the logits of the call just before it.
    """

    def __init__(self) -> None:
        self.last: Logits | None = None

    def __call__(self, input_ids: npt.NDArray[np.intc], scores: Logits) -> Logits:
        self.last = np.array(scores, dtype=np.float32, copy=True)
        return scores

    def logprob(self, token: int, top: int) -> tuple[float, list[tuple[int, float]]]:
        logits = self.last
        if logits is None:  # pragma: no cover - generate always samples through the processor
            return 0.0, []
        peak = float(logits.max())
        lse = peak + float(np.log(np.exp(logits - peak).sum()))
        best: list[tuple[int, float]] = []
        if top > 0:
            idx = np.argpartition(-logits, top)[:top]
            idx = idx[np.argsort(-logits[idx])]
            best = [(int(i), float(logits[i]) - lse) for i in idx]
        return float(logits[token]) - lse, best


def with_logprobs(
    stream: Generator[int, Any, None], recorder: LogprobRecorder, top: int
) -> Generator[Step, None, None]:
    """``Llama.generate``'s tokens, each with the logprob the recorder saw for it."""
    try:
        for token in stream:
            logprob, best = recorder.logprob(token, top)
            yield token, logprob, best
    finally:
        stream.close()


def bias_processor(bias: dict[int, float]) -> Callable[[Any, Logits], Logits]:
    """A logits processor that adds ``logit_bias`` to the logits, in place."""

    def apply_bias(_ids: Any, scores: Logits) -> Logits:
        for tok, value in bias.items():
            if 0 <= tok < scores.shape[0]:
                scores[tok] += value
        return scores

    return apply_bias


# -- the batch (one row of logits at a time) --------------------------------------------------


def biased(raw: Logits, bias: dict[int, float]) -> Logits:
    """A copy of ``raw`` with ``logit_bias`` added."""
    chosen = raw.copy()
    for tok, value in bias.items():
        if 0 <= tok < raw.shape[0]:
            chosen[tok] += value
    return chosen


def adjusted(raw: Logits, params: SamplingParams, counts: dict[int, int]) -> Logits:
    """``raw`` with the logit bias and the presence/frequency penalties of the tokens sampled
    so far (``counts``); ``raw`` itself (llama.cpp's buffer) is never changed."""
    chosen = biased(raw, params.logit_bias) if params.logit_bias else raw
    if counts and (params.presence_penalty or params.frequency_penalty):
        chosen = chosen.copy() if chosen is raw else chosen
        ids = np.fromiter(counts.keys(), dtype=np.intp)
        times = np.fromiter(counts.values(), dtype=np.float32)
        chosen[ids] -= params.frequency_penalty * times + params.presence_penalty
    return chosen


def pick(logits: Logits, params: SamplingParams, rng: np.random.Generator | None) -> int:
    """The sampled token: the argmax when greedy (no ``rng``), else llama.cpp's order for the
    single path: top-k 40, top-p, min-p 0.05, temperature."""
    if rng is None:
        return int(logits.argmax())
    k = min(40, logits.shape[0])
    idx = np.argpartition(-logits, k - 1)[:k]
    idx = idx[np.argsort(-logits[idx], kind="stable")]
    vals = logits[idx].astype(np.float64)
    probs = np.exp(vals - vals[0])
    probs /= probs.sum()
    if params.top_p < 1.0:
        keep = int(np.searchsorted(np.cumsum(probs), params.top_p) + 1)
        idx, vals = idx[:keep], vals[:keep]
        probs = probs[:keep] / probs[:keep].sum()
    keep_min = probs >= 0.05 * probs[0]
    idx, vals = idx[keep_min], vals[keep_min]
    scaled = np.exp((vals - vals[0]) / max(params.temperature, 1e-6))
    scaled /= scaled.sum()
    return int(rng.choice(idx, p=scaled))


# -- both paths -------------------------------------------------------------------------------


def held_back(text: str, stops: tuple[str, ...]) -> int:
    """How many trailing characters of ``text`` could still begin a stop sequence."""
    hold = 0
    for stop in stops:
        for n in range(min(len(stop) - 1, len(text)), 0, -1):
            if text.endswith(stop[:n]):
                hold = max(hold, n)
                break
    return hold


def logprob_entry(
    llm: Any, piece: bytes, logprob: float, best: list[tuple[int, float]]
) -> dict[str, Any]:
    """One token's entry of OpenAI's ``logprobs.content``, its alternatives detokenized."""
    top = []
    for tok, lp in best:
        raw = llm.detokenize([tok])
        top.append(
            {"token": raw.decode("utf-8", errors="replace"), "logprob": lp, "bytes": list(raw)}
        )
    return {
        "token": piece.decode("utf-8", errors="replace"),
        "logprob": logprob,
        "bytes": list(piece),
        "top_logprobs": top,
    }
