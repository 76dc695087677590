"""Benchmark 3: time to first token with a shared ~1,500-token system prompt, cold vs warm.

Through the engine's worker process (``LocalEngine``), with max_tokens = 1 so that the request's
time is its time to first token (plus queueing, IPC and scoring, as a client would see it).

    cold          a system prompt the engine has never seen (a fresh one each run)
    warm (live)   the same system prompt as the request just before, another question
    warm (saved)  the same system prompt after an unrelated request came between: with
                  parallel = 1 its state comes back from the prefix cache ([local]
                  prefix_cache_mb); with parallel > 1 another sequence id took the unrelated
                  request and the shared prompt's cells were still held
    together      four questions on a fresh system prompt sent at once: the mean and the
                  slowest time to first token. With parallel = 1 they queue and the 2nd to
                  4th find the prompt in the live context; with parallel = 4 the 2nd to 4th
                  wait for the first one's prefill of it and copy its cells

``--parallel 1 4`` (the default) runs both engines in one run, interleaved run by run (only one
works at a time). ``--parallel 1`` alone gives the issue-4 figures.

    .venv/bin/python bench/engine_prefix.py [--reps 2] [--threads 1] [--parallel 1 4]
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from engine_common import engine_parser, machine, median

RULES = (
    "Rule {i}: when a customer asks about an order, first confirm the order number, then the "
    "delivery address, and never share the payment details; answer politely and briefly. "
)
QUESTIONS = [
    "Where is my order 1234?",
    "Can I change my delivery address?",
    "Do you ship to Norway?",
    "I want a refund for order 99.",
]


def system_prompt(tag: str) -> dict[str, Any]:
    text = f"Policy set {tag}. " + "".join(RULES.format(i=i) for i in range(1, 42))
    return {"role": "system", "content": text}


async def ask(engine: Any, system: dict[str, Any], question: str) -> tuple[float, dict[str, Any]]:
    request = {
        "messages": [system, {"role": "user", "content": question}],
        "max_tokens": 1,
        "temperature": 0,
    }
    started = time.perf_counter()
    out = await engine.chat(request, deadline=time.monotonic() + 900)
    return time.perf_counter() - started, out


async def one_run(engine: Any, tag: str, times: dict[str, list[float]], cached: dict[str, int]):
    shared = system_prompt(f"A{tag}")
    t, out = await ask(engine, shared, QUESTIONS[0])
    times["cold"].append(t)
    cached["prompt"] = out["usage"]["prompt_tokens"]
    t, out = await ask(engine, shared, QUESTIONS[1])
    times["live"].append(t)
    cached["live"] = out["frugal"]["cached_tokens"]
    await ask(engine, system_prompt(f"B{tag}"), "Hello")  # an unrelated prompt between
    t, out = await ask(engine, shared, QUESTIONS[2])
    times["saved"].append(t)
    cached["saved"] = out["frugal"]["cached_tokens"]
    fresh = system_prompt(f"C{tag}")
    together = await asyncio.gather(*(ask(engine, fresh, q) for q in QUESTIONS))
    times["together"].append(sum(t for t, _ in together) / len(together))
    times["together_max"].append(max(t for t, _ in together))
    cached["together"] = sum(out["frugal"]["cached_tokens"] for _, out in together)


async def main() -> None:
    from proxy.config import LocalSettings
    from proxy.engine.local_engine import LocalEngine

    parser = engine_parser(reps=2)
    parser.add_argument("--parallel", type=int, nargs="+", default=[1, 4])
    args = parser.parse_args()
    engines: dict[int, Any] = {}
    for parallel in args.parallel:
        settings = LocalSettings(
            n_threads=args.threads, n_ctx=4096, timeout_s=900, parallel=parallel
        )
        engines[parallel] = LocalEngine(settings, relevance=False)
        await engines[parallel].start()
    keys = ("cold", "live", "saved", "together", "together_max")
    times = {p: {k: [] for k in keys} for p in engines}
    cached: dict[int, dict[str, int]] = {p: {} for p in engines}
    try:
        for rep in range(args.reps):
            order = list(engines) if rep % 2 == 0 else list(reversed(engines))
            for parallel in order:
                await one_run(
                    engines[parallel], f"{rep}-{parallel}", times[parallel], cached[parallel]
                )
        health = {p: e.health() for p, e in engines.items()}
    finally:
        for engine in engines.values():
            await engine.stop()
    first = next(iter(engines))
    print(
        f"SmolLM2-135M Q4_1, {args.threads} thread(s), prompt {cached[first]['prompt']} tokens, "
        f"{args.reps} runs, median seconds to first token (max_tokens=1)"
    )
    print(f"{'parallel':>8}  {'cold':>7}  {'live':>14}  {'saved':>14}  {'4 together':>20}")
    for parallel in engines:
        m = {k: median(v) for k, v in times[parallel].items()}
        c = m["cold"]
        print(
            f"{parallel:>8}  {c:7.3f}  {m['live']:6.3f} ={m['live'] / c:6.3f}x  "
            f"{m['saved']:6.3f} ={m['saved'] / c:6.3f}x  "
            f"mean {m['together']:6.2f} max {m['together_max']:6.2f}"
        )
    for parallel in engines:
        got = cached[parallel]
        extra = health[parallel].get("batch", {}).get("prefix") or health[parallel]["prefix_cache"]
        print(
            f"parallel {parallel}: cached tokens live {got['live']}, saved {got['saved']}, "
            f"together (sum of 4) {got['together']}; {extra}"
        )
    if len(engines) == 2:
        one, many = engines
        print(
            "parallel "
            + f"{many} / {one}: "
            + ", ".join(
                f"{k} {median(times[many][k]) / median(times[one][k]):.2f}"
                for k in ("cold", "live", "saved", "together", "together_max")
            )
        )
    print(machine())


if __name__ == "__main__":
    asyncio.run(main())
