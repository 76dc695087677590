"""Benchmark 4: prefill and decode tok/s for each thread count from 1 to the number of cores,
to check the "threads = cores - 1" rule of the production account this project started from
(an 8B Q4_K_M model on a 4-core VPS) on this machine.

One SmolLM2 per thread count in this process; the runs are interleaved (1, 2, ..., 1, 2, ...)
so that a neighbour's burst hits every count alike. EOS is banned so every answer is full length.

    .venv/bin/python bench/engine_threads.py [--reps 3]
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

from engine_common import machine, median, smollm2_path

TEXT = (
    "The museum opened a new wing for maps and globes. Visitors can see sea charts from the "
    "sixteenth century, city plans drawn by hand and the first printed atlas of the region. "
)


def main() -> None:
    from proxy.engine.generate import LocalModel

    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    cores = len(os.sched_getaffinity(0))
    models = {
        n: LocalModel.load(smollm2_path(), n_ctx=2048, n_threads=n, calibrate=False)
        for n in range(1, cores + 1)
    }
    ban = {0: -100.0, 2: -100.0}
    prefill: dict[int, list[float]] = {n: [] for n in models}
    decode: dict[int, list[float]] = {n: [] for n in models}
    for rep in range(args.reps):
        for n, model in models.items():
            long: dict[str, Any] = {
                "messages": [{"role": "user", "content": f"[{rep}] " + TEXT * 8}],
                "max_tokens": 1,
                "temperature": 0,
            }
            model.forget()
            started = time.perf_counter()
            out = model.chat(long)
            prefill[n].append(out["usage"]["prompt_tokens"] / (time.perf_counter() - started))
            short = {
                "messages": [{"role": "user", "content": "Describe a map."}],
                "temperature": 0,
                "logit_bias": ban,
            }
            model.chat({**short, "max_tokens": 1})
            started = time.perf_counter()
            model.chat({**short, "max_tokens": 1})
            t1 = time.perf_counter() - started
            started = time.perf_counter()
            model.chat({**short, "max_tokens": 65})
            decode[n].append(64 / (time.perf_counter() - started - t1))
    print(f"SmolLM2-135M Q4_1, {args.reps} runs, medians ({cores} cores on this machine)")
    print(f"{'threads':>7} {'prefill tok/s':>14} {'decode tok/s':>13}")
    for n in models:
        print(f"{n:7d} {median(prefill[n]):14.1f} {median(decode[n]):13.1f}")
    print(machine())
    for model in models.values():
        model.close()


if __name__ == "__main__":
    main()
