"""Regenerate the dev set's local answers, then evaluate the gate: ``python bench/gate_answers.py``.

The answers the quality gate is calibrated and evaluated on (``quality/dev/``) are the bundled
model's, generated with the proxy's own engine (``proxy.engine.generate.LocalModel``: greedy,
``n_ctx`` 2048, seed 0, each answer from an empty KV cache). This script loads that engine,
answers the split's prompts, says how many answers differ from the cache
(``tests/data/quality_answers_smollm2.jsonl``), updates the cache (only for the bundled model),
and prints ``python -m quality.dev.evaluate``'s report on the fresh answers.

    python bench/gate_answers.py                # the held-out split
    python bench/gate_answers.py --split all    # every answer: what calibration reads
    python bench/gate_answers.py --model X.gguf --threads 4   # another model; cache untouched

It lives here, not in ``quality/dev/``, because ``quality`` imports nothing from ``proxy``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from proxy.engine.generate import LocalModel, bundled_model_path  # noqa: E402
from quality.dev import evaluate  # noqa: E402
from quality.dev.local_answers import (  # noqa: E402
    N_CTX,
    generate,
    load_answers,
    same_text,
    save_answers,
)


def load_model(model_path: str | None = None, n_threads: int = 2) -> LocalModel:
    """The engine the cached answers come from (the bundled model unless ``model_path``)."""
    path = model_path or bundled_model_path()
    return LocalModel.load(path, n_ctx=N_CTX, n_threads=n_threads, seed=0)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python bench/gate_answers.py", description=__doc__)
    evaluate.add_arguments(parser)
    parser.add_argument("--model", default=None, help="GGUF path (default: the bundled model)")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    prompts = evaluate.prompts_of(args)
    cached = load_answers(args.answers)
    print(f"generating {len(prompts)} answers with the local engine …", file=sys.stderr)
    answers = generate(prompts, load_model(args.model, args.threads))
    changed = sum(1 for k, v in answers.items() if k not in cached or not same_text(v, cached[k]))
    print(f"{changed} of {len(answers)} answers differ from the cache", file=sys.stderr)
    if args.model is None:
        save_answers(answers, args.answers)
    evaluate.print_report(args, prompts, answers)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
