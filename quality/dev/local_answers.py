"""Local answers to the dev set: generated with the proxy's own engine, cached in a JSONL file.

The engine is passed in (:class:`AnswerModel`, which ``proxy.engine.generate.LocalModel`` is):
this folder imports nothing from ``proxy``. ``python bench/gate_answers.py`` loads the engine
and (re)generates the cache; the model tests load it themselves.

The gate is calibrated on exactly what the server produces: the same ``LocalModel.chat`` (greedy,
logprobs from the last position's logits of each sampled token), the same bundled model. The
engine starts every answer from an empty KV cache: llama.cpp's numbers depend slightly on how a
prompt was split into batches, so an answer that reused the previous prompt's prefix can differ
from a cold one, and the cache would then depend on the order of the dev set. The
cache (``tests/data/quality_answers_smollm2.jsonl``) lets calibration and tests re-run without
the model; ``python bench/gate_answers.py`` regenerates them and says how many answers differ
from the cache.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from quality.dev.devset import Prompt, answer_text, is_correct

ANSWERS_PATH = (
    Path(__file__).resolve().parents[2] / "tests" / "data" / "quality_answers_smollm2.jsonl"
)
N_CTX = 2048
"""The context the answers are generated with (``LocalModel.load(..., n_ctx=N_CTX, seed=0)``)."""


class AnswerModel(Protocol):
    """What answers the dev set: the proxy's ``LocalModel``, loaded by the caller."""

    def chat(self, request: dict[str, Any]) -> dict[str, Any]: ...

    def forget(self) -> None: ...


@dataclass(frozen=True)
class Graded:
    prompt: Prompt
    completion: dict[str, Any]
    correct: bool


def request_for(prompt: Prompt) -> dict[str, Any]:
    """The request as the server would pass it to the engine: greedy."""
    return {**prompt.request, "temperature": 0}


def generate(
    prompts: Iterable[Prompt], model: AnswerModel, *, verbose: bool = True
) -> dict[str, dict[str, Any]]:
    """Answer each prompt with ``model``, greedy, each from an empty KV cache."""
    answers: dict[str, dict[str, Any]] = {}
    items = list(prompts)
    started = time.perf_counter()
    for i, prompt in enumerate(items, 1):
        model.forget()  # each answer as a cold request gets it, whatever came before
        answers[prompt.id] = model.chat(request_for(prompt))
        if verbose and (i % 25 == 0 or i == len(items)):
            elapsed = time.perf_counter() - started
            print(f"  generated {i}/{len(items)} in {elapsed:.0f}s", file=sys.stderr)
    return answers


def load_answers(path: str | Path = ANSWERS_PATH) -> dict[str, dict[str, Any]]:
    answers: dict[str, dict[str, Any]] = {}
    p = Path(path)
    if not p.exists():
        return answers
    with p.open(encoding="utf-8") as f:
        for line in f:
            if line.strip():
                row = json.loads(line)
                answers[row["id"]] = row["completion"]
    return answers


def _stable(completion: dict[str, Any]) -> dict[str, Any]:
    """The completion without what changes on every run (ids, clocks)."""
    out = {k: v for k, v in completion.items() if k not in ("id", "created")}
    frugal = out.get("frugal")
    if isinstance(frugal, dict):
        out["frugal"] = {k: v for k, v in frugal.items() if not k.endswith("_s")}
    return out


def save_answers(answers: dict[str, dict[str, Any]], path: str | Path = ANSWERS_PATH) -> None:
    """Write (merging into) the cache, one line per prompt id, sorted."""
    merged = load_answers(path)
    merged.update(answers)
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    with p.open("w", encoding="utf-8") as f:
        for key in sorted(merged):
            row = {"id": key, "completion": _stable(merged[key])}
            f.write(json.dumps(row, ensure_ascii=False, separators=(",", ":")) + "\n")


def same_text(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return answer_text(a) == answer_text(b)


def grade(prompts: Iterable[Prompt], answers: dict[str, dict[str, Any]]) -> list[Graded]:
    graded = []
    for prompt in prompts:
        completion = answers.get(prompt.id)
        if completion is None:
            raise KeyError(f"no cached answer for {prompt.id}: run python bench/gate_answers.py")
        graded.append(Graded(prompt, completion, is_correct(prompt.check, answer_text(completion))))
    return graded
