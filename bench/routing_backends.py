"""The long-prompt burst with a backend beside the bundled engine, against the bundled engine alone,
side by side in one run (issue 28).

    .venv/bin/python bench/routing_backends.py                      # starts llama_cpp.server
    .venv/bin/python bench/routing_backends.py --requests 8 --rounds 2
    .venv/bin/python bench/routing_backends.py --backend-url http://127.0.0.1:8081/v1 \\
        --backend-kind llama-server --backend-concurrency 4         # a server already running

The burst is ``bench/routing.py``'s (its code is shared): ``--requests`` chat requests of about
``--prompt-tokens`` tokens, each its own text, asking for ``--max-tokens`` tokens, sent
``--gap-ms`` apart, against an in-process app (the real ``create_app``, ledger on) on one real
bundled engine (SmolLM2, ``--threads``, ``--parallel``), the API being ``tests/fake_api.py``
(1.5 s + 20 ms per token), the quality threshold 0. Both variants route predictively:

- ``engine``: the bundled engine alone, as ``bench/routing.py``'s ``predictive``;
- ``engine+backend``: the same engine plus one ``[[local.backends]]`` entry at
  ``--backend-url`` (``kind`` ``--backend-kind``, ``max_concurrency``
  ``--backend-concurrency``). Each request goes where its predicted finish is soonest: the
  engine, the backend, or (past the deadline everywhere) the API.

Without ``--backend-url``, the backend is ``python -m llama_cpp.server`` (llama-cpp-python's own
server, kind ``llama-cpp-python``, one request at a time) serving the bundled SmolLM2 on CPU
with ``--backend-threads`` threads (1 by default), started as the tests start it
(``tests/llama_cpp_server.py``) and killed at the end.

The backend is profiled before the bursts, as the engine is (profiling-informed scheduling:
measure first, then route): two requests alone, sent to it directly. Its prefill and decode
rates go into the backend's config (``prefill_tok_s``, ``decode_tok_s``), from the answer's
``timings`` when the server gives them (llama-server), else from its wall time and usage, split
as the engine's rates are. The router refines them from every answer, as it does in production.

The local deadline (``--timeout auto``) is 3.5 times the bundled engine's lone request, the same
for both variants. Rounds alternate the variants' order. Printed per variant: burst time, mean,
p50 and p95 latency, the local share split into bundled engine and backend, dollars saved, and
the MdAPE of the predicted local times (per backend too).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import httpx  # noqa: E402

from bench import routing  # noqa: E402
from bench.routing import (  # noqa: E402
    KEY_ENV,
    WORDS,
    Run,
    make_prompts,
    run_burst,
    warm_up,
)
from proxy import config  # noqa: E402
from proxy.engine.local_engine import LocalEngine  # noqa: E402
from tests.fake_api import FakeAPI  # noqa: E402

BACKEND = "backend"  # the [[local.backends]] entry's name, as the ledger's rows show it
ENGINE = "engine"


def profile_backend(
    url: str, prompts: list[str], max_tokens: int, ratio: float
) -> tuple[float, float, float]:
    """Send ``prompts`` to the backend one at a time; returns (lone request s, prefill tok/s,
    decode tok/s) of the last one. ``ratio`` (prefill per decode rate) splits a wall time into
    the two when the answer carries no ``timings``."""
    alone, prefill, decode = 0.0, 0.0, 0.0
    with httpx.Client(timeout=600) as client:
        for prompt in prompts:
            t = time.perf_counter()
            response = client.post(
                url.rstrip("/") + "/chat/completions",
                json={
                    "model": "local",
                    "messages": [{"role": "user", "content": prompt}],
                    "max_tokens": max_tokens,
                },
            )
            alone = time.perf_counter() - t
            response.raise_for_status()
            body = response.json()
            timings = body.get("timings") or {}
            if timings.get("prompt_per_second") and timings.get("predicted_per_second"):
                prefill = float(timings["prompt_per_second"])
                decode = float(timings["predicted_per_second"])
                continue
            usage = body.get("usage") or {}
            prompt_tokens = int(usage.get("prompt_tokens") or 0)
            completion_tokens = max(1, int(usage.get("completion_tokens") or 0))
            # alone = prompt / (ratio * decode) + completion / decode
            decode = (prompt_tokens / ratio + completion_tokens) / alone
            prefill = decode * ratio
    return alone, prefill, decode


def split(run: Run) -> dict[str, float]:
    """The share of the burst's requests answered by each local backend."""
    total = len(run.results)
    return {name: count / total for name, count in sorted(run.local_by_backend.items())}


def describe(run: Run) -> dict[str, Any]:
    summary = run.summary()
    summary["local_split"] = {k: round(v, 4) for k, v in split(run).items()}
    summary["mdape_by_backend"] = {
        name: round(statistics.median(errors), 4)
        for name, errors in sorted(run.errors_by_backend.items())
    }
    return summary


def print_table(runs: list[Run]) -> None:
    """The routing bench's table with each backend's share between local and saved $."""
    shares: list[routing.Column] = [
        (f"{'engine':>7}", lambda run, _: f"{split(run).get(ENGINE, 0) * 100:>6.1f}%"),
        (f"{'backend':>8}", lambda run, _: f"{split(run).get(BACKEND, 0) * 100:>7.1f}%"),
    ]
    routing.print_table(runs, [*routing.timing_columns(15), *shares, *routing.COST_COLUMNS])


def summarize(runs: list[Run]) -> dict[str, Any]:
    """Per variant over its rounds: mean latency, local share (split), MdAPE; and the ratio."""
    out: dict[str, Any] = {}
    for label in dict.fromkeys(r.variant for r in runs):
        mine = [r for r in runs if r.variant == label]
        errors = [e for r in mine for e in r.errors]
        by_backend: dict[str, list[float]] = {}
        for r in mine:
            for name, errs in r.errors_by_backend.items():
                by_backend.setdefault(name, []).extend(errs)
        shares = [split(r) for r in mine]
        out[label] = {
            "mean_s": statistics.fmean(statistics.fmean(r.latencies()) for r in mine),
            "local_share": statistics.fmean(r.local_share for r in mine),
            "engine_share": statistics.fmean(s.get(ENGINE, 0.0) for s in shares),
            "backend_share": statistics.fmean(s.get(BACKEND, 0.0) for s in shares),
            "mdape": statistics.median(errors) if errors else None,
            "mdape_by_backend": {n: statistics.median(e) for n, e in sorted(by_backend.items())},
            "local_answers": len(errors),
        }
    return out


async def main_async(args: argparse.Namespace, backend_url: str, kind: str) -> dict[str, Any]:
    api_latency = args.api_latency + args.api_per_token * args.max_tokens
    reply = " ".join(random.Random(7).choice(WORDS) for _ in range(args.max_tokens))
    os.environ[KEY_ENV] = "sk-bench-" + "0" * 16
    workdir = Path(tempfile.mkdtemp(prefix="frugal-routing-backends-"))
    engine = LocalEngine(
        config.LocalSettings(n_threads=args.threads, max_queue=64, parallel=args.parallel)
    )
    runs: list[Run] = []
    with FakeAPI(record=False, reply=reply, latency_s=api_latency) as api:
        await engine.start()
        try:
            alone = await warm_up(engine, api, args, workdir)
            rates = engine.rates
            ratio = rates.prefill_tok_s / rates.decode_tok_s
            backend_alone, prefill, decode = await asyncio.to_thread(
                profile_backend,
                backend_url,
                make_prompts(2, args.prompt_tokens, seed=998),
                args.max_tokens,
                ratio,
            )
            timeout_s = alone * 3.5 if args.timeout == "auto" else float(args.timeout)
            print(
                f"bundled engine: one request alone {alone:.2f} s; prefill "
                f"{rates.prefill_tok_s:.0f} tok/s, decode {rates.decode_tok_s:.1f} tok/s "
                f"({args.threads} thread(s), parallel {args.parallel})",
                flush=True,
            )
            print(
                f"backend ({kind}, {backend_url}, max_concurrency {args.backend_concurrency}): "
                f"one request alone {backend_alone:.2f} s; prefill {prefill:.0f} tok/s, "
                f"decode {decode:.1f} tok/s",
                flush=True,
            )
            print(
                f"local timeout_s = {timeout_s:.1f} s; API latency {api_latency:.2f} s; load "
                f"average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs",
                flush=True,
            )
            backend = {
                "name": BACKEND,
                "kind": kind,
                "api_base": backend_url,
                "max_concurrency": args.backend_concurrency,
                "max_queue": 64,
                "prefill_tok_s": round(prefill, 1),
                "decode_tok_s": round(decode, 2),
            }
            variants: list[tuple[str, tuple[dict[str, Any], ...]]] = [
                ("engine", ()),
                ("engine+backend", (backend,)),
            ]
            for round_ in range(args.rounds):
                order = variants if round_ % 2 == 0 else list(reversed(variants))
                for label, backends in order:
                    prompts = make_prompts(args.requests, args.prompt_tokens, seed=len(runs))
                    run = await run_burst(
                        label,
                        engine,
                        api,
                        prompts,
                        args,
                        timeout_s,
                        workdir,
                        predictive=True,
                        backends=backends,
                    )
                    runs.append(run)
                    print(f"round {round_ + 1} {label}: {describe(run)}", flush=True)
                    await asyncio.sleep(1.0)
        finally:
            await engine.stop()
    print()
    print_table(runs)
    print()
    summary = summarize(runs)
    for label, s in summary.items():
        mdape = "-" if s["mdape"] is None else f"{s['mdape'] * 100:.1f}%"
        per = ", ".join(f"{n} {e * 100:.1f}%" for n, e in s["mdape_by_backend"].items())
        print(
            f"{label}: mean latency {s['mean_s']:.2f} s, local share "
            f"{s['local_share'] * 100:.1f}% (engine {s['engine_share'] * 100:.1f}%, backend "
            f"{s['backend_share'] * 100:.1f}%), MdAPE {mdape} over {s['local_answers']} local "
            f"answers ({per or '-'})"
        )
    ratio_mean = summary["engine+backend"]["mean_s"] / summary["engine"]["mean_s"]
    print(f"mean latency engine+backend / engine alone: {ratio_mean:.2f}")
    return {
        "engine_alone_s": alone,
        "backend_alone_s": backend_alone,
        "backend_rates": {"prefill_tok_s": prefill, "decode_tok_s": decode},
        "timeout_s": timeout_s,
        "runs": [describe(r) for r in runs],
        "summary": summary,
        "mean_ratio": ratio_mean,
    }


def main() -> None:
    parser = routing.burst_parser(__doc__)
    parser.add_argument("--threads", type=int, default=1, help="the bundled engine's threads")
    parser.add_argument("--parallel", type=int, default=1, help="the bundled engine's parallel")
    parser.add_argument(
        "--backend-url", default=None, help="the backend's api_base (.../v1); none: start one"
    )
    parser.add_argument(
        "--backend-kind",
        default=None,
        choices=sorted(config.BACKEND_KINDS),
        help="its kind (default: llama-cpp-python for the started server, else llama-server)",
    )
    parser.add_argument(
        "--backend-concurrency", type=int, default=1, help="its max_concurrency (its slots)"
    )
    parser.add_argument(
        "--backend-threads", type=int, default=1, help="threads of the started llama_cpp.server"
    )
    parser.add_argument("--json", default=None, help="write the results to this file")
    args = parser.parse_args()
    server = None
    if args.backend_url is None:
        from tests import llama_cpp_server

        problem = llama_cpp_server.missing()
        if problem:
            parser.error(problem)
        folder = Path(tempfile.mkdtemp(prefix="frugal-llama-cpp-server-"))
        server = llama_cpp_server.start(folder, threads=args.backend_threads)
        url, kind = server.api_base, args.backend_kind or "llama-cpp-python"
        print(f"started python -m llama_cpp.server ({args.backend_threads} thread(s)) at {url}")
    else:
        url, kind = args.backend_url, args.backend_kind or "llama-server"
    try:
        result = asyncio.run(main_async(args, url, kind))
    finally:
        if server is not None:
            server.stop()
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
