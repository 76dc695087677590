"""Benchmark (issue 18): continuous batching, parallel = 4 against parallel = 1, in one run.

Four greedy chat requests of ``--max-tokens`` output tokens each (``ignore_eos``-like: prompts that
make SmolLM2 write at length, and answers cut by max_tokens) are answered

    parallel = 1   one after the other through ``LocalModel.chat`` (the single path, as served)
    parallel = 4   together, as four sequences of one :class:`BatchEngine`

and the aggregate decode rate is output tokens / decode seconds (the time after every prompt was
prefilled, so that both sides count the same work). A lone request is then timed both ways:
its latency with parallel = 4 (a batch of one) against parallel = 1. Runs are interleaved rep by
rep; CPU time is reported beside wall time (the machine is shared).

    .venv/bin/python bench/engine_batch.py [--reps 3] [--threads 1] [--max-tokens 128]

``--copy`` asks four copy-heavy requests instead, and runs the batch both plain and with prompt-
lookup speculation inside it (``speculative = "prompt-lookup"`` with ``parallel = 4``); then the
four free-chat requests both ways, where the default must cost nothing.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from engine_common import engine_parser, machine, median, smollm2_path

PROMPTS = [
    "Write a long story about a lighthouse keeper and a storm.",
    "Explain in detail how bread is made, step by step.",
    "Describe a walk through a busy market in the morning.",
    "Write a long letter to a friend about your summer holidays.",
]


MEMO = (
    "From: Dana Reyes, Operations. To: all staff. Date: 3 March. Subject: office move. The Leeds "
    "office moves to 14 Canal Street on 28 March. Movers arrive at 8 am; please pack your desks "
    "by 5 pm on 27 March. IT will reconnect computers on 29 March. Questions go to Sam Patel."
)
COPY_PROMPTS = [
    f"Copy this memo word for word, then add the line 'Copy {i}.':\n\n{MEMO}" for i in range(4)
]


def _request(prompt: str, max_tokens: int) -> dict[str, Any]:
    return {
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
    }


def serial(model: Any, requests: list[dict[str, Any]]) -> tuple[float, float, int]:
    """parallel = 1: decode wall and CPU seconds summed over the requests, tokens."""
    wall = cpu = 0.0
    tokens = 0
    for request in requests:
        model.forget()
        model.chat({**request, "max_tokens": 1})  # the prompt, then only decoding is timed
        w, c = time.perf_counter(), time.process_time()
        out = model.chat(request)
        wall += time.perf_counter() - w
        cpu += time.process_time() - c
        tokens += out["usage"]["completion_tokens"]
    return wall, cpu, tokens


def batched(
    engine: Any, requests: list[dict[str, Any]], *, deferred: bool = False
) -> tuple[float, float, int]:
    """parallel = N: every prompt prefilled and first token out, then the decode phase timed
    (``deferred``: the sequences added as deferred ones, the batch endpoints' class)."""
    seqs = [engine.add(r, deferred=deferred) for r in requests]
    assert all(s is not None for s in seqs)
    while any(not s.generated and not s.done for s in seqs):
        engine.step()
    w, c = time.perf_counter(), time.process_time()
    before = sum(len(s.generated) for s in seqs)
    engine.run_all()
    wall, cpu = time.perf_counter() - w, time.process_time() - c
    return wall, cpu, sum(len(s.generated) for s in seqs) - before


def lone(model: Any, engine: Any, request: dict[str, Any]) -> tuple[float, float]:
    """Whole-request wall seconds of one request alone, from an empty cache: single path, then
    a batch of one."""
    model.forget()
    w = time.perf_counter()
    model.chat(request)
    single = time.perf_counter() - w
    engine.forget()  # cold too: no prompt held from the runs before
    w = time.perf_counter()
    seq = engine.add(request)
    engine.run_all()
    engine.completion(seq)
    return single, time.perf_counter() - w


def main() -> None:
    from proxy.engine.batch.decode import BatchEngine
    from proxy.engine.generate import LocalModel

    parser = engine_parser(reps=3, max_tokens=128)
    parser.add_argument("--parallel", type=int, default=4)
    parser.add_argument("--copy", action="store_true", help="copy-heavy, speculation in the batch")
    args = parser.parse_args()
    if args.copy:
        copy_bench(args)
        return
    model = LocalModel.load(smollm2_path(), n_ctx=1024, n_threads=args.threads, calibrate=False)
    engine = BatchEngine(model, args.parallel)
    requests = [_request(p, args.max_tokens) for p in PROMPTS[: args.parallel]]
    one_rate, many_rate, one_cpu, many_cpu, singles, lones = [], [], [], [], [], []
    for _ in range(args.reps):
        w1, c1, t1 = serial(model, requests)
        wn, cn, tn = batched(engine, requests)
        one_rate.append(t1 / w1)
        many_rate.append(tn / wn)
        one_cpu.append(t1 / c1)
        many_cpu.append(tn / cn)
        s, b = lone(model, engine, requests[0])
        singles.append(s)
        lones.append(b)
    print(
        f"SmolLM2-135M Q4_1, {args.threads} thread(s), flash attention, {len(requests)} greedy "
        f"requests x {args.max_tokens} tokens, {args.reps} interleaved runs, medians"
    )
    print(
        f"aggregate decode tok/s, wall: parallel=1 {median(one_rate):.1f}, "
        f"parallel={args.parallel} {median(many_rate):.1f}, "
        f"ratio {median(many_rate) / median(one_rate):.2f}"
    )
    print(
        f"aggregate decode tok/s, CPU: parallel=1 {median(one_cpu):.1f}, "
        f"parallel={args.parallel} {median(many_cpu):.1f}, "
        f"ratio {median(many_cpu) / median(one_cpu):.2f}"
    )
    print(
        f"lone request, whole request wall s: parallel=1 {median(singles):.2f}, "
        f"parallel={args.parallel} {median(lones):.2f}, "
        f"ratio {median(lones) / median(singles):.2f}"
    )
    print(machine())
    engine.close()
    model.close()


def copy_bench(args: argparse.Namespace) -> None:
    """Four copy-heavy requests, then four free-chat ones (issue 27: the default must cost
    nothing there), each batch plain and with prompt lookup inside it, interleaved."""
    from proxy.engine.batch.decode import BatchEngine
    from proxy.engine.generate import LocalModel

    model = LocalModel.load(smollm2_path(), n_ctx=1024, n_threads=args.threads, calibrate=False)
    plain = BatchEngine(model, args.parallel)
    spec = BatchEngine(model, args.parallel, speculative=True)
    copy = [_request(p, args.max_tokens) for p in COPY_PROMPTS[: args.parallel]]
    chat = [_request(p, args.max_tokens) for p in PROMPTS[: args.parallel]]
    rates: dict[str, list[float]] = {
        "serial": [],
        "batch": [],
        "batch+PL": [],
        "chat batch": [],
        "chat batch+PL": [],
    }
    for _ in range(args.reps):
        w, c, t = serial(model, copy)
        rates["serial"].append(t / c)
        w, c, t = batched(plain, copy)
        rates["batch"].append(t / c)
        w, c, t = batched(spec, copy)
        rates["batch+PL"].append(t / c)
        w, c, t = batched(plain, chat)
        rates["chat batch"].append(t / c)
        w, c, t = batched(spec, chat)
        rates["chat batch+PL"].append(t / c)
    m = {k: median(v) for k, v in rates.items()}
    print(
        f"SmolLM2-135M Q4_1, {args.threads} thread(s), {len(copy)} copy-heavy greedy requests "
        f"x {args.max_tokens} tokens, {args.reps} interleaved runs, aggregate decode tok/s by CPU "
        f"time: parallel=1 {m['serial']:.1f}, parallel={args.parallel} {m['batch']:.1f} "
        f"({m['batch'] / m['serial']:.2f}x), parallel={args.parallel} + prompt-lookup "
        f"{m['batch+PL']:.1f} ({m['batch+PL'] / m['serial']:.2f}x)"
    )
    print(
        f"{len(chat)} free-chat greedy requests, same run: parallel={args.parallel} "
        f"{m['chat batch']:.1f}, + prompt-lookup {m['chat batch+PL']:.1f} "
        f"({m['chat batch+PL'] / m['chat batch']:.2f}x plain)"
    )
    print(machine())
    spec.close()
    plain.close()
    model.close()


if __name__ == "__main__":
    main()
