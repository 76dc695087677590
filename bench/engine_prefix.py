"""Benchmark 3: time to first token with a shared ~1,500-token system prompt, cold vs warm.

Through the engine's worker process (``LocalEngine``), with max_tokens = 1 so that the request's
time is its time to first token (plus queueing, IPC and scoring, as a client would see it).

    cold          a system prompt the engine has never seen (a fresh one each run)
    warm (live)   the same system prompt as the request just before, another question
    warm (saved)  the same system prompt after an unrelated request replaced the live context:
                  its state comes back from the prefix cache ([local] prefix_cache_mb)

    .venv/bin/python bench/engine_prefix.py [--reps 3] [--threads 1]
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

from engine_common import machine, median

RULES = (
    "Rule {i}: when a customer asks about an order, first confirm the order number, then the "
    "delivery address, and never share the payment details; answer politely and briefly. "
)


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
    out = await engine.chat(request, deadline=time.monotonic() + 600)
    return time.perf_counter() - started, out


async def main() -> None:
    from proxy.config import LocalSettings
    from proxy.engine.client import LocalEngine

    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    engine = LocalEngine(LocalSettings(n_threads=args.threads, n_ctx=4096, timeout_s=600))
    await engine.start()
    cold, live, saved = [], [], []
    prompt_tokens = cached_live = cached_saved = 0
    try:
        for rep in range(args.reps):
            shared = system_prompt(f"A{rep}")
            t, out = await ask(engine, shared, "Where is my order 1234?")
            cold.append(t)
            prompt_tokens = out["usage"]["prompt_tokens"]
            t, out = await ask(engine, shared, "Can I change my delivery address?")
            live.append(t)
            cached_live = out["frugal"]["cached_tokens"]
            await ask(engine, system_prompt(f"B{rep}"), "Hello")  # replaces the live context
            t, out = await ask(engine, shared, "Do you ship to Norway?")
            saved.append(t)
            cached_saved = out["frugal"]["cached_tokens"]
        cache = engine.health()["prefix_cache"]
    finally:
        await engine.stop()
    c, w1, w2 = median(cold), median(live), median(saved)
    print(
        f"SmolLM2-135M Q4_1, {args.threads} thread(s), prompt {prompt_tokens} tokens, "
        f"{args.reps} runs, median seconds to first token (max_tokens=1)"
    )
    print(f"cold                         {c:7.3f} s")
    print(f"warm, live context           {w1:7.3f} s = {w1 / c:.3f} x cold ({cached_live} cached)")
    print(f"warm, from the prefix cache  {w2:7.3f} s = {w2 / c:.3f} x cold ({cached_saved} cached)")
    print(f"prefix cache: {cache}")
    print(machine())


if __name__ == "__main__":
    asyncio.run(main())
