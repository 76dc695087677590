"""How long ``quality.score`` takes per answer: ``python bench/quality_speed.py``.

Scores every cached local answer to the dev set (real SmolLM2 completions with logprobs, up to
160 tokens each) and the same answers without logprobs (as an API answer arrives), ``--rounds``
times over, and prints p50/p90/p99/max per answer in milliseconds, and p50 as a share of the
5 ms budget. The first round is reported apart: it pays for compiling regexes and building JSON
Schema validators, which are cached after.

Then the optional relevance signal (``quality/relevance.py``: all-MiniLM-L6-v2 through llama.cpp),
``--relevance-rounds`` times over: the whole score with it, and the signal alone, whose p50 the
issue caps at 20 ms. ``--threads`` sets the embedder's threads (default: as the server does).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from quality import score  # noqa: E402
from quality._view import view_of  # noqa: E402
from quality.dev.devset import load  # noqa: E402
from quality.dev.local_answers import ANSWERS_PATH, load_answers, request_for  # noqa: E402
from quality.relevance import Embedder, relevance  # noqa: E402

BUDGET_MS = 5.0
RELEVANCE_BUDGET_MS = 20.0


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _without_logprobs(completion: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(completion)
    out["choices"][0]["logprobs"] = None
    out.pop("frugal", None)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--relevance-rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    answers = load_answers(ANSWERS_PATH)
    pairs = [(request_for(p), answers[p.id]) for p in load() if p.id in answers]
    api_pairs = [(r, _without_logprobs(c)) for r, c in pairs]
    tokens = [len(c["choices"][0]["logprobs"]["content"]) for _, c in pairs]
    print(f"{len(pairs)} answers, {statistics.mean(tokens):.0f} tokens on average")
    for name, items in (("local (with logprobs)", pairs), ("api (no logprobs)", api_pairs)):
        first: list[float] = []
        rest: list[float] = []
        for round_ in range(args.rounds):
            for request, completion in items:
                t0 = time.perf_counter()
                score(request, completion)
                (first if round_ == 0 else rest).append((time.perf_counter() - t0) * 1000)
        print(
            f"{name:<22} p50 {_pct(rest, 0.5):.3f} ms  p90 {_pct(rest, 0.9):.3f}  "
            f"p99 {_pct(rest, 0.99):.3f}  max {max(rest):.3f}  "
            f"(first round p50 {_pct(first, 0.5):.3f}, max {max(first):.1f})  "
            f"p50 = {_pct(rest, 0.5) / BUDGET_MS:.1%} of the {BUDGET_MS:g} ms budget"
        )
    if args.relevance_rounds > 0:
        embedder = Embedder.load(n_threads=args.threads)
        print(f"relevance: {embedder.path}, {embedder.n_threads} threads")
        for request, completion in pairs[:20]:  # warm-up
            score(request, completion, embedder=embedder)
        whole: list[float] = []
        alone: list[float] = []
        for _ in range(args.relevance_rounds):
            for request, completion in pairs:
                t0 = time.perf_counter()
                score(request, completion, embedder=embedder)
                t1 = time.perf_counter()
                relevance(view_of(request, completion), embedder)
                whole.append((t1 - t0) * 1000)
                alone.append((time.perf_counter() - t1) * 1000)
        for name, values in (("local + relevance", whole), ("relevance signal alone", alone)):
            print(
                f"{name:<22} p50 {_pct(values, 0.5):.3f} ms  p90 {_pct(values, 0.9):.3f}  "
                f"p99 {_pct(values, 0.99):.3f}  max {max(values):.3f}"
            )
        print(
            f"relevance p50 = {_pct(alone, 0.5) / RELEVANCE_BUDGET_MS:.1%} of the "
            f"{RELEVANCE_BUDGET_MS:g} ms budget"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
