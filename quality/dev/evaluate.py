"""Evaluate the gate on the held-out split: ``python -m quality.dev.evaluate``.

It grades the local model's cached answers to the held-out prompts
(``tests/data/quality_answers_smollm2.jsonl``) with the dev set's checkers, scores them with the
committed weights and prints ROC AUC; acceptance, precision and recall at the threshold (default
0.6), overall and per task kind; and the thresholds needed for 0.9 and 0.95 precision.

``python bench/gate_answers.py`` first regenerates the answers with the proxy's own engine
(greedy), says how many differ from the cached ones, updates the cache, then prints the same
report; ``--split all`` there also generates (and caches) the train split, which calibration
reads. Generation lives there because this folder imports nothing from ``proxy``.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from quality import score
from quality.dev.devset import DEV_PATH, Prompt, load
from quality.dev.local_answers import ANSWERS_PATH, Graded, grade, load_answers, request_for
from quality.dev.roc import AtThreshold, at_threshold, roc_auc, threshold_for_precision
from quality.relevance import Embedder, RelevanceUnavailable

DEFAULT_THRESHOLD = 0.6
SWEEP = (0.2, 0.3, 0.4, 0.5, 0.6, 0.7)


def _fmt(r: AtThreshold | None) -> str:
    if r is None:
        return "not reachable"
    return (
        f"threshold {r.threshold:.3f}: acceptance {r.acceptance:.1%} ({r.accepted}/{r.n}), "
        f"precision {r.precision:.1%}, recall {r.recall:.1%}"
    )


def _without_logprobs(completion: dict[str, Any]) -> dict[str, Any]:
    """The completion as an answer without logprobs arrives (the API's): no confidence."""
    choices = [{**c, "logprobs": None} for c in completion.get("choices", [])]
    return {**completion, "choices": choices}


def report(
    graded: Sequence[Graded], threshold: float, embedder: Embedder | None = None
) -> list[str]:
    started = time.perf_counter()
    scores = [score(request_for(g.prompt), g.completion, embedder=embedder) for g in graded]
    per_answer_ms = (time.perf_counter() - started) * 1000 / max(1, len(graded))
    values = [s.value for s in scores]
    labels = [g.correct for g in graded]
    lines = [
        f"answers: {len(graded)}, right: {sum(labels)} ({sum(labels) / len(graded):.1%})",
        f"ROC AUC: {roc_auc(values, labels):.3f}",
        f"at default {_fmt(at_threshold(values, labels, threshold))}",
        f"for precision >= 0.90: {_fmt(threshold_for_precision(values, labels, 0.90))}",
        f"for precision >= 0.95: {_fmt(threshold_for_precision(values, labels, 0.95))}",
        f"mean scoring time: {per_answer_ms:.2f} ms/answer"
        + (" with the relevance signal" if embedder is not None else "")
        + " (see bench/quality_speed.py for p50)",
    ]
    if embedder is not None:
        plain = [score(request_for(g.prompt), g.completion).value for g in graded]
        lines.append(
            f"same answers without the relevance signal: ROC AUC {roc_auc(plain, labels):.3f}; "
            f"at default {_fmt(at_threshold(plain, labels, threshold))}"
        )
    bare = [
        score(request_for(g.prompt), _without_logprobs(g.completion), embedder=embedder).value
        for g in graded
    ]
    lines += [
        f"same answers without logprobs (no confidence, no task kind: how an API answer is "
        f"scored): ROC AUC {roc_auc(bare, labels):.3f}; "
        f"at default {_fmt(at_threshold(bare, labels, threshold))}",
        "",
        "threshold  acceptance  precision  recall",
    ]
    for t in SWEEP:
        r = at_threshold(values, labels, t)
        prec = "-" if r.accepted == 0 else f"{r.precision:.1%}"
        lines.append(f"{t:>9.2f}  {r.acceptance:>10.1%}  {prec:>9}  {r.recall:>6.1%}")
    lines += [
        "",
        f"{'kind':<15}{'n':>4}{'right':>7}{'AUC':>7}{'accepted':>10}{'precision':>11}{'recall':>8}",
    ]
    by_kind: dict[str, list[int]] = defaultdict(list)
    for i, g in enumerate(graded):
        by_kind[g.prompt.kind].append(i)
    for kind in sorted(by_kind):
        idx = by_kind[kind]
        v = [values[i] for i in idx]
        y = [labels[i] for i in idx]
        r = at_threshold(v, y, threshold)
        auc = roc_auc(v, y)
        prec = "-" if r.accepted == 0 else f"{r.precision:.0%}"
        rec = "-" if sum(y) == 0 else f"{r.recall:.0%}"
        auc_s = "-" if auc != auc else f"{auc:.2f}"
        lines.append(
            f"{kind:<15}{len(idx):>4}{sum(y):>7}{auc_s:>7}{r.accepted:>10}{prec:>11}{rec:>8}"
        )
    reasons: dict[str, int] = defaultdict(int)
    for s in scores:
        if s.value < threshold:
            for reason in s.reasons[:1]:
                reasons[reason] += 1
    if reasons:
        lines.append("")
        lines.append(
            "first reason of rejected answers: "
            + ", ".join(f"{r} {n}" for r, n in sorted(reasons.items(), key=lambda kv: -kv[1]))
        )
    return lines


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of the report (``bench/gate_answers.py`` takes them too)."""
    parser.add_argument("--split", choices=("heldout", "train", "all"), default="heldout")
    parser.add_argument("--threshold", type=float, default=DEFAULT_THRESHOLD)
    parser.add_argument("--dev", default=str(DEV_PATH))
    parser.add_argument("--answers", default=str(ANSWERS_PATH))
    parser.add_argument(
        "--no-relevance", action="store_true", help="score without the embedding model"
    )


def prompts_of(args: argparse.Namespace) -> list[Prompt]:
    return [p for p in load(args.dev) if args.split == "all" or p.split == args.split]


def print_report(
    args: argparse.Namespace, prompts: list[Prompt], answers: dict[str, dict[str, Any]]
) -> None:
    embedder: Embedder | None = None
    if not args.no_relevance:
        try:
            embedder = Embedder.load()
        except RelevanceUnavailable as exc:
            print(f"relevance signal off: {exc}", file=sys.stderr)
    graded = grade(prompts, answers)
    print(f"split: {args.split}")
    print("\n".join(report(graded, args.threshold, embedder)))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m quality.dev.evaluate", description=__doc__)
    add_arguments(parser)
    args = parser.parse_args(argv)
    print(f"using cached answers from {args.answers}", file=sys.stderr)
    print_report(args, prompts_of(args), load_answers(args.answers))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
