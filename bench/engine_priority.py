"""Benchmark (issue 41): deferred work at full width, and interactive requests while it runs.

One :class:`BatchEngine` of ``--parallel`` sequences, in-process, the real SmolLM2. Each rep,
interleaved:

    batch        ``--parallel`` greedy requests of ``--max-tokens`` tokens decoded together as
                 interactive sequences: ``bench/engine_batch.py``'s measure (output tokens over
                 the decode phase, after every prompt is in)
    deferred     the same requests as deferred sequences, the same measure: the ratio to
                 ``batch`` is the cost of the priority machinery on a batch that has the engine
                 to itself (target >= 0.9); each of the two goes first in every other rep
    during       a full-width deferred batch of ``--batch-tokens`` tokens; after every
                 ``--gap`` steps of it, one short interactive request (``--probe-tokens``) is
                 added and stepped to its end (it parks a paused deferred sequence, which
                 resumes after): whole-request wall seconds, while the batch runs
    idle         right before each of those, the same request alone on an idle engine of the
                 same width, from a cold cache: so that idle and busy probes alternate, and the
                 load of the shared machine drifts alike on both (target: p50 and p95 of
                 ``during`` <= 1.25x ``idle``). CPU seconds are printed beside wall seconds
    shared       the same, but the deferred rows keep decoding beside the interactive one (an
                 id kept free for it, no pause: ``--parallel`` + 1 ids, all interactive), to
                 show what pausing buys

The decode rate of the ``during`` batch (every answer token, deferred and interactive, over its
wall time, probes included) is printed beside the others: with interactive requests arriving, the
engine serves them alone, so it is lower by the time they take.

    .venv/bin/python bench/engine_priority.py [--reps 3] [--parallel 4] [--threads 1]
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from engine_batch import PROMPTS, _request, batched
from engine_common import engine_parser, machine, median, smollm2_path

PROBES = [
    "Name three colours.",
    "What is bread made of?",
    "Say hello to a friend.",
    "Give one word for happy.",
    "What is two plus two?",
    "Name a large animal.",
]


def probe(engine: Any, request: dict[str, Any]) -> tuple[float, float, int]:
    """Wall and CPU seconds from adding an interactive request to its last token, stepping the
    engine (whatever else it holds steps too, or waits, as the engine decides), and its tokens."""
    started, cpu = time.perf_counter(), time.process_time()
    seq = engine.add(request)
    assert seq is not None, "no room for an interactive request"
    while not seq.done:
        engine.step()
    return time.perf_counter() - started, time.process_time() - cpu, len(seq.generated)


def during(
    engine: Any,
    quiet: Any,
    long: list[dict[str, Any]],
    probes: list[dict[str, Any]],
    gap: int,
    deferred: bool,
    lat: dict[str, list[float]],
) -> tuple[float, float]:
    """Probe latencies while ``long`` requests decode, each after the same probe on the idle
    engine ``quiet`` (into ``lat``); and the engine's decode rate meanwhile (all answer
    tokens over the wall and the CPU time from the batch's first token to its end, idle probes
    left out)."""
    engine.forget()
    seqs = [engine.add(r, deferred=deferred) for r in long]
    assert all(s is not None for s in seqs)
    while any(not s.generated for s in seqs):
        engine.step()
    started, cpu_started = time.perf_counter(), time.process_time()
    before = sum(len(s.generated) for s in seqs)
    probe_tokens = 0
    away = away_cpu = 0.0  # seconds spent on the idle probes
    for request in probes:
        for _ in range(gap):
            engine.step()
        quiet.forget()
        w = time.perf_counter()
        seconds, cpu, _ = probe(quiet, request)
        away += time.perf_counter() - w
        away_cpu += cpu
        lat["idle"].append(seconds)
        lat["idle cpu"].append(cpu)
        seconds, cpu, tokens = probe(engine, request)
        lat["busy"].append(seconds)
        lat["busy cpu"].append(cpu)
        probe_tokens += tokens
        assert not any(s.done for s in seqs), "--batch-tokens too small for the probes"
    engine.run_all()
    wall = time.perf_counter() - started - away
    cpu_s = time.process_time() - cpu_started - away_cpu
    tokens = sum(len(s.generated) for s in seqs) - before + probe_tokens
    return tokens / wall, tokens / cpu_s


def p95(values: list[float]) -> float:
    return statistics.quantiles(values, n=20, method="inclusive")[18]


def main() -> None:
    from proxy.engine.batch.decode import BatchEngine
    from proxy.engine.generate import LocalModel

    parser = engine_parser(reps=3, max_tokens=128)
    parser.add_argument("--parallel", type=int, default=4)
    parser.add_argument("--probes", type=int, default=6)
    parser.add_argument("--probe-tokens", type=int, default=24)
    parser.add_argument("--batch-tokens", type=int, default=400)
    parser.add_argument("--gap", type=int, default=12)
    args = parser.parse_args()
    model = LocalModel.load(smollm2_path(), n_ctx=1024, n_threads=args.threads, calibrate=False)
    engine = BatchEngine(model, args.parallel)
    quiet = BatchEngine(model, args.parallel)
    shared = BatchEngine(model, args.parallel + 1)
    requests = [_request(p, args.max_tokens) for p in PROMPTS[: args.parallel]]
    long = [_request(PROMPTS[i % len(PROMPTS)], args.batch_tokens) for i in range(args.parallel)]
    probes = [_request(PROBES[i % len(PROBES)], args.probe_tokens) for i in range(args.probes)]
    rates: dict[str, list[float]] = {
        f"{name}{unit}": []
        for name in ("batch", "deferred", "during", "shared")
        for unit in ("", " cpu")
    }
    lat: dict[str, dict[str, list[float]]] = {
        name: {"idle": [], "idle cpu": [], "busy": [], "busy cpu": []}
        for name in ("during", "shared")
    }
    for rep in range(args.reps):
        # Each side goes first in every other rep: the machine's load drifts.
        sides = [("batch", False), ("deferred", True)]
        for name, deferred in sides if rep % 2 == 0 else sides[::-1]:
            wall, cpu, tokens = batched(engine, requests, deferred=deferred)
            rates[name].append(tokens / wall)
            rates[f"{name} cpu"].append(tokens / cpu)
        for name, eng, deferred in (("during", engine, True), ("shared", shared, False)):
            rate, rate_cpu = during(eng, quiet, long, probes, args.gap, deferred, lat[name])
            rates[name].append(rate)
            rates[f"{name} cpu"].append(rate_cpu)
    m = {k: median(v) for k, v in rates.items()}
    print(
        f"SmolLM2-135M Q4_1, {args.threads} thread(s), parallel={args.parallel}, "
        f"{args.reps} interleaved runs, medians; {len(lat['during']['busy'])} interactive "
        f"requests of up to {args.probe_tokens} tokens, each probed idle then busy"
    )
    for unit in ("", " cpu"):
        print(
            f"aggregate decode tok/s by {'CPU' if unit else 'wall'} time, {args.parallel} x "
            f"{args.max_tokens} tokens: interactive batch (engine_batch) {m['batch' + unit]:.1f}, "
            f"deferred batch {m['deferred' + unit]:.1f}, "
            f"ratio {m['deferred' + unit] / m['batch' + unit]:.3f}"
        )
    for name in ("during", "shared"):
        what = "paused deferred batch" if name == "during" else "no pause (one more id)"
        got = lat[name]
        for unit, busy, idle in (("wall", "busy", "idle"), ("CPU", "busy cpu", "idle cpu")):
            print(
                f"interactive latency {unit} s, {what}: p50 {median(got[busy]):.3f} / idle "
                f"{median(got[idle]):.3f} = {median(got[busy]) / median(got[idle]):.2f}x; "
                f"p95 {p95(got[busy]):.3f} / idle {p95(got[idle]):.3f} = "
                f"{p95(got[busy]) / p95(got[idle]):.2f}x"
            )
        print(
            f"engine decode tok/s during that batch, probes included: wall {m[name]:.1f} "
            f"({m[name] / m['batch']:.2f}x engine_batch), CPU {m[name + ' cpu']:.1f} "
            f"({m[name + ' cpu'] / m['batch cpu']:.2f}x)"
        )
    print(f"parked {engine.stats.parked}, resumed {engine.stats.resumed}")
    print(machine())
    shared.close()
    quiet.close()
    engine.close()
    model.close()


if __name__ == "__main__":
    main()
