"""Agent turns through the local engine and the gate: how often is a repeated call accepted?

``python bench/agent_turns.py [--threads 2]``

Reads the agent conversations of ``tests/data/agent_turns.jsonl`` (each ends in a tool's
result: ``answer``, where the right next answer is text from it; ``next_call`` and ``chain``,
where it is a call with new arguments; ``error``, where the tool failed and calling it again is
right) and prints two tables:

1. **Written answers, gate only.** Each conversation gets two answers scored by the gate
   (``quality.score``, no logprobs, as an API answer is scored): the call of its last turn
   made again, and the right answer (``good``). A repeated call after a result that is not an
   error is a fault; after an error it is the right answer.
2. **The real engine and the gate.** Each conversation answered by the bundled SmolLM2 as the
   worker answers it (``proxy.engine.tasks.chat``, greedy, the gate of the proxy's defaults:
   shipped weights, the relevance model when it loads), with ``tool_choice`` ``auto`` (what
   agent frameworks send) and ``required``. It counts the answers that repeat a call whose
   result is in and is not an error, and how many of them the gate accepted (score >= 0.6,
   ``[quality] threshold``).

It reads only the public interfaces that main had before issue 42 (``quality.score``,
``tasks.chat``, ``tasks.Hooks``, ``Gate``), so the same file runs on a checkout of main for the
"before" figures. It lives here, not in ``quality/dev/``, because ``quality`` imports nothing
from ``proxy``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import quality  # noqa: E402
from proxy.engine import tasks  # noqa: E402
from proxy.engine.gate import Gate  # noqa: E402
from proxy.engine.generate import LocalModel, bundled_model_path  # noqa: E402

DATA = ROOT / "tests" / "data" / "agent_turns.jsonl"
THRESHOLD = 0.6


def load(path: Path = DATA) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


def _key(name: str, arguments: Any) -> str:
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except ValueError:
            arguments = arguments.strip()
    return name + "\x00" + json.dumps(arguments, sort_keys=True)


def made_calls(messages: list[dict[str, Any]]) -> set[str]:
    """The calls the conversation made since the user's last message."""
    keys: set[str] = set()
    for message in messages:
        if message.get("role") == "user":
            keys = set()
        for call in message.get("tool_calls") or ():
            keys.add(_key(call["function"]["name"], call["function"]["arguments"]))
    return keys


def answer_calls(completion: dict[str, Any]) -> list[str]:
    message = completion["choices"][0]["message"]
    return [
        _key(c["function"]["name"], c["function"]["arguments"])
        for c in message.get("tool_calls") or ()
    ]


def request_of(row: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"model": "gpt-4o-mini", "messages": row["messages"], "tools": row["tools"], **extra}


def written(message: dict[str, Any]) -> dict[str, Any]:
    return {
        "object": "chat.completion",
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": "tool_calls" if message.get("tool_calls") else "stop",
            }
        ],
        "usage": {"prompt_tokens": 50, "completion_tokens": 12, "total_tokens": 62},
    }


def gate_only(rows: list[dict[str, Any]]) -> None:
    print("1. written answers, gate only (quality.score, no logprobs)")
    scores: dict[tuple[str, str], list[float]] = {}
    for row in rows:
        last = next(m for m in reversed(row["messages"]) if m.get("tool_calls"))
        repeat = {"role": "assistant", "content": None, "tool_calls": last["tool_calls"]}
        for label, message in (("repeated call", repeat), ("right answer", row["good"])):
            verdict = quality.score(request_of(row), written(message))
            scores.setdefault((row["kind"], label), []).append(verdict.value)
    print(f"   {'kind':<10} {'answer':<14} accepted  mean score")
    for kind in ("answer", "next_call", "chain", "error"):
        for label in ("repeated call", "right answer"):
            values = scores.get((kind, label))
            if not values:
                continue
            yes = sum(v >= THRESHOLD for v in values)
            mean = sum(values) / len(values)
            print(f"   {kind:<10} {label:<14} {yes:>2} of {len(values):<3} {mean:.3f}")
    repeats = [
        v
        for (k, label), vs in scores.items()
        if label == "repeated call" and k != "error"
        for v in vs
    ]
    accepted = sum(v >= THRESHOLD for v in repeats)
    print(f"   repeated calls after a result (not an error) accepted: {accepted} of {len(repeats)}")


def engine(
    rows: list[dict[str, Any]], threads: int, choices: Sequence[str], max_tokens: int
) -> None:
    print("2. the real engine (SmolLM2, greedy) and the gate")
    model = LocalModel.load(bundled_model_path(), n_ctx=2048, n_threads=threads, seed=0)
    try:
        from quality.relevance import Embedder

        gate = Gate(embedder=Embedder.load())
        print("   relevance model loaded")
    except Exception as exc:  # noqa: BLE001 - the gate without relevance, as the proxy runs then
        gate = Gate()
        print(f"   no relevance model ({type(exc).__name__}): the gate without it")
    hooks = tasks.Hooks(on_token=None, should_stop=None, score=gate.score)
    for choice in choices:
        counts: Counter[str] = Counter()
        scores: list[float] = []
        started = time.perf_counter()
        for row in rows:
            completion = tasks.chat(
                model, request_of(row, tool_choice=choice, max_tokens=max_tokens), hooks
            )
            verdict = completion["frugal"]["quality"]
            accepted = (verdict["value"] or 0.0) >= THRESHOLD
            calls = answer_calls(completion)
            repeated = bool(set(calls) & made_calls(row["messages"]))
            shape = "repeated call" if repeated else ("new call" if calls else "text")
            counts[f"{row['kind']}:{shape}"] += 1
            if repeated and row["kind"] != "error":
                counts["repeat"] += 1
                counts["repeat_accepted"] += accepted
                scores.append(float(verdict["value"] or 0.0))
            counts["accepted"] += accepted
            for reason in verdict.get("reasons") or ():
                counts[f"reason:{reason}"] += 1
        took = time.perf_counter() - started
        print(f"   tool_choice {choice!r} ({took:.0f} s):")
        for kind in ("answer", "next_call", "chain", "error"):
            of_kind = {k.split(":")[1]: v for k, v in counts.items() if k.startswith(kind + ":")}
            print(f"     {kind:<10} {dict(sorted(of_kind.items()))}")
        non_error = sum(1 for r in rows if r["kind"] != "error")
        print(
            f"     answers repeating an answered call: {counts['repeat']} of {non_error};"
            f" accepted by the gate: {counts['repeat_accepted']}"
            + (f" (scores {min(scores):.3f}..{max(scores):.3f})" if scores else "")
        )
        print(f"     all answers accepted: {counts['accepted']} of {len(rows)}")
        reasons = {k[7:]: v for k, v in counts.items() if k.startswith("reason:")}
        print(f"     the gate's reasons: {dict(sorted(reasons.items()))}")
    model.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python bench/agent_turns.py", description=__doc__)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--gate-only", action="store_true", help="skip the engine's table")
    parser.add_argument(
        "--kinds", default="answer,next_call,chain,error", help="which conversations to run"
    )
    parser.add_argument("--choices", default="auto,required", help="tool_choice values to run")
    parser.add_argument("--max-tokens", type=int, default=96)
    args = parser.parse_args(argv)
    kinds = set(args.kinds.split(","))
    rows = [row for row in load(args.data) if row["kind"] in kinds]
    gate_only(rows)
    if not args.gate_only:
        engine(rows, args.threads, args.choices.split(","), args.max_tokens)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
