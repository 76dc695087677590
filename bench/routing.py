"""Predictive routing against the naive cascade, on the long-prompt burst, side by side in one run.

    .venv/bin/python bench/routing.py                       # 16 requests, timeout auto
    .venv/bin/python bench/routing.py --rounds 2 --timeout 40 --json /tmp/routing.json
    .venv/bin/python bench/routing.py --parallel 1 4 --rounds 2  # batching, both predictive

The long-prompt burst: ``--requests`` chat requests of about ``--prompt-tokens`` prompt tokens
(each its own text, so no prompt is served from the prefix cache) asking for ``--max-tokens``
answer tokens, sent ``--gap-ms`` apart. Each runs against an in-process app (the real
``create_app``, ledger on) sharing one real engine (the bundled SmolLM2, ``--threads``):

- ``naive``: ``[router] predictive = false``: every request waits in the local queue until it
  is answered or its deadline (``[local] timeout_s``) passes, and then goes to the API;
- ``predictive``: ``[router] predictive = true``: a request whose predicted local finish is
  past the deadline goes to the API at once (``predicted_slow``).

The API is ``tests/fake_api.py`` answering ``--max-tokens`` words after ``--api-latency`` +
``--api-per-token`` x ``--max-tokens`` seconds (1.5 s + 20 ms per token by default). The quality
threshold is 0, so that every local answer that finishes is used: this measures routing, not
the gate. ``--timeout auto`` sets the local deadline to 3.5 times the time one request takes
alone (measured in a warm-up), so that about three local answers fit in the deadline.

With several ``--parallel`` values, one engine per value runs the same bursts, rounds
alternating the order, with one local deadline for all (3.5 times the first engine's lone
request); by default only the ``predictive`` variant runs then.

Printed per variant: the burst's completion time (first request sent to last answer received),
mean / p50 / p95 latency, the local share, dollars saved (counterfactual − paid, from the
ledger, priced as gpt-4o-mini), the median absolute percentage error of the predictions of
the local answers (predicted time vs the time the answer took), and ``l_tmo``: the requests
admitted locally that were still cut at the local deadline (``local_timeout``; with
``predictive`` a right prediction never lets that happen, with ``naive`` every request is
admitted), with what was predicted for them. At the end, each engine's decode steps by width
(sequences in a step: milliseconds a step, answer tokens a sequence, steps), which the batch's
forecast plays the answers with.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import httpx  # noqa: E402

from proxy import config  # noqa: E402
from proxy.engine.local_engine import LocalEngine  # noqa: E402
from proxy.engine.model_files import bundled_model_path  # noqa: E402
from tests.fake_api import FakeAPI  # noqa: E402
from tests.in_process import in_process  # noqa: E402

MODEL = "gpt-4o-mini"
KEY_ENV = "FRUGAL_BENCH_UPSTREAM_KEY"
PICO = 10**12
WORDS = (
    "river mill bridge valley farmer wheat barley spring water meadow summer children weir "
    "fisherman trout shade village market baker bread morning evening lantern road forest hill "
    "harbour sailor storm lighthouse winter snow orchard apple cider festival music dancer "
    "clock tower merchant silk caravan desert oasis camel star night owl fox garden rose"
).split()


@dataclass
class Result:
    index: int
    sent: float
    latency_s: float
    route: str
    reason: str


@dataclass
class Run:
    variant: str
    results: list[Result] = field(default_factory=list)
    burst_s: float = 0.0
    saved_usd: float = 0.0
    errors: list[float] = field(default_factory=list)  # |predicted - actual| / actual, local
    rows: list[tuple[Any, ...]] = field(default_factory=list)
    # the local answers per backend ("engine" or a [[local.backends]] name), and their errors
    local_by_backend: dict[str, int] = field(default_factory=dict)
    errors_by_backend: dict[str, list[float]] = field(default_factory=dict)

    def latencies(self) -> list[float]:
        return [r.latency_s for r in self.results]

    @property
    def local_share(self) -> float:
        return sum(r.route == "local" for r in self.results) / len(self.results)

    @property
    def admitted_timeouts(self) -> list[tuple[Any, ...]]:
        """The ledger rows of requests that were given a local attempt (admitted: predicted in
        time, or, naive, every one) and were cut at the local deadline (``local_timeout``)."""
        return [row for row in self.rows if row[1] == "local_timeout"]

    def summary(self) -> dict[str, Any]:
        lat = sorted(self.latencies())
        reasons: dict[str, int] = {}
        for r in self.results:
            reasons[r.reason] = reasons.get(r.reason, 0) + 1
        return {
            "variant": self.variant,
            "burst_s": round(self.burst_s, 2),
            "mean_s": round(statistics.fmean(lat), 2),
            "p50_s": round(statistics.median(lat), 2),
            "p95_s": round(_nearest_rank(lat, 0.95), 2),
            "local_share": round(self.local_share, 4),
            "saved_usd": round(self.saved_usd, 6),
            "mdape": round(statistics.median(self.errors), 4) if self.errors else None,
            "predicted_local": len(self.errors),
            "admitted_local_timeout": len(self.admitted_timeouts),
            "local_timeout_predicted_s": [
                None if row[3] is None else round(row[3] / 1000, 2)
                for row in self.admitted_timeouts
            ],
            "reasons": reasons,
        }


def _nearest_rank(values: list[float], q: float) -> float:
    return values[max(0, min(len(values) - 1, int(-(-q * len(values) // 1)) - 1))]


def make_prompts(count: int, tokens: int, seed: int) -> list[str]:
    """``count`` different prompts of about ``tokens`` tokens (the local model's tokenizer)."""
    import llama_cpp

    vocab = llama_cpp.Llama(bundled_model_path(), vocab_only=True, verbose=False)
    prompts = []
    for i in range(count):
        rnd = random.Random(seed * 1000 + i)
        head = f"Notes from a travel diary (page {seed}-{i}):\n"
        tail = "\n\nWrite a long, detailed story inspired by these notes."
        budget = tokens - len(vocab.tokenize((head + tail).encode(), add_bos=False)) - 8
        sentences: list[str] = []
        while True:
            sentence = " ".join(rnd.choice(WORDS) for _ in range(rnd.randint(6, 14))) + "."
            text = " ".join([*sentences, sentence.capitalize()])
            if len(vocab.tokenize(text.encode(), add_bos=False)) > budget:
                break
            sentences.append(sentence.capitalize())
        prompts.append(head + " ".join(sentences) + tail)
    return prompts


def settings_for(
    db: Path,
    api: FakeAPI,
    *,
    predictive: bool,
    timeout_s: float,
    threads: int,
    backends: tuple[dict[str, Any], ...] = (),
) -> config.Settings:
    """The bench's settings; ``backends`` are ``[[local.backends]]`` tables."""
    local: dict[str, Any] = {"timeout_s": timeout_s, "n_threads": threads, "max_queue": 64}
    if backends:
        local["backends"] = list(backends)
    return config.from_dict(
        {
            "server": {"api_keys_env": "", "max_concurrency": 256},
            "local": local,
            "fallback": {
                "api_base": api.url,
                "api_key_env": KEY_ENV,
                "max_retries": 0,
                "timeout_s": 120.0,
            },
            "router": {"predictive": predictive},
            "quality": {"threshold": 0.0},
            "ledger": {"path": str(db), "flush_interval_s": 0.05},
            # litellm's price, stated: the GPU check's machine runs without litellm
            "pricing": {MODEL: {"input_per_mtok": 0.15, "output_per_mtok": 0.6}},
        },
        source="<bench>",
    )


async def ask(
    client: httpx.AsyncClient, prompt: str, max_tokens: int, headers: dict[str, str] | None = None
) -> httpx.Response:
    """One chat request of ``prompt``; an error status raises."""
    response = await client.post(
        "/v1/chat/completions",
        json={
            "model": MODEL,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens,
        },
        headers=headers,
    )
    response.raise_for_status()
    return response


async def run_burst(
    variant: str,
    engine: LocalEngine,
    api: FakeAPI,
    prompts: list[str],
    args: argparse.Namespace,
    timeout_s: float,
    workdir: Path,
    *,
    predictive: bool | None = None,
    backends: tuple[dict[str, Any], ...] = (),
) -> Run:
    """One burst; ``predictive`` defaults to ``variant == "predictive"``."""
    db = workdir / f"{variant.replace(' ', '_')}-{time.monotonic_ns()}.db"
    settings = settings_for(
        db,
        api,
        predictive=variant == "predictive" if predictive is None else predictive,
        timeout_s=timeout_s,
        threads=args.threads,
        backends=backends,
    )
    run = Run(variant)
    async with in_process(settings, engine, timeout_s=600) as client:
        start = time.perf_counter()

        async def one(i: int, prompt: str) -> Result:
            await asyncio.sleep(i * args.gap_ms / 1000)
            sent = time.perf_counter()
            response = await ask(client, prompt, args.max_tokens)
            return Result(
                index=i,
                sent=sent - start,
                latency_s=time.perf_counter() - sent,
                route=response.headers["x-frugal-route"],
                reason=response.headers["x-frugal-reason"],
            )

        run.results = list(await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts))))
        run.burst_s = max(r.sent + r.latency_s for r in run.results)
    # The app is closed: every ledger row is written and counted.
    conn = sqlite3.connect(db)
    try:
        cf, paid = conn.execute(
            "SELECT COALESCE(SUM(counterfactual_cost_pusd), 0), COALESCE(SUM(api_cost_pusd), 0) "
            "FROM requests"
        ).fetchone()
        run.saved_usd = (cf - paid) / PICO
        run.rows = conn.execute(
            "SELECT route, reason, local_ms, predicted_local_ms, actual_local_ms, "
            "local_completion_tokens FROM requests ORDER BY ts"
        ).fetchall()
        for (backend,) in conn.execute("SELECT backend FROM requests WHERE route = 'local'"):
            name = backend or "engine"
            run.local_by_backend[name] = run.local_by_backend.get(name, 0) + 1
        for backend, p, a in conn.execute(
            "SELECT backend, predicted_local_ms, actual_local_ms FROM requests "
            "WHERE route = 'local' AND predicted_local_ms IS NOT NULL AND actual_local_ms > 0"
        ):
            run.errors.append(abs(p - a) / a)
            run.errors_by_backend.setdefault(backend or "engine", []).append(abs(p - a) / a)
    finally:
        conn.close()
    return run


async def warm_up(
    engine: LocalEngine, api: FakeAPI, args: argparse.Namespace, workdir: Path
) -> float:
    """Two requests alone, one after the other: the rates and answer lengths settle, and the
    second one's time is what one request takes alone."""
    prompts = make_prompts(2, args.prompt_tokens, seed=999)
    settings = settings_for(
        workdir / "warmup.db", api, predictive=False, timeout_s=600, threads=args.threads
    )
    alone = 0.0
    async with in_process(settings, engine, timeout_s=600) as client:
        for prompt in prompts:
            t = time.perf_counter()
            await ask(client, prompt, args.max_tokens, {"x-frugal-route": "local"})
            alone = time.perf_counter() - t
    return alone


# One column of the table a burst prints: its heading and its cell for a run and that run's summary.
Column = tuple[str, Callable[[Run, dict[str, Any]], str]]


def timing_columns(variant_width: int) -> list[Column]:
    """The columns every routing bench opens its table with: variant, times and local share."""
    return [
        (f"{'variant':<{variant_width}}", lambda _, s: f"{s['variant']:<{variant_width}}"),
        (f"{'burst s':>8}", lambda _, s: f"{s['burst_s']:>8.2f}"),
        (f"{'mean s':>7}", lambda _, s: f"{s['mean_s']:>7.2f}"),
        (f"{'p50 s':>7}", lambda _, s: f"{s['p50_s']:>7.2f}"),
        (f"{'p95 s':>7}", lambda _, s: f"{s['p95_s']:>7.2f}"),
        (f"{'local':>6}", lambda _, s: f"{s['local_share'] * 100:>5.1f}%"),
    ]


def _mdape_cell(_: Run, s: dict[str, Any]) -> str:
    mdape = "-" if s["mdape"] is None else f"{s['mdape'] * 100:.1f}%"
    return f"{mdape:>6}"


# The money and forecast columns, after any bench's own shares.
COST_COLUMNS: list[Column] = [
    (f"{'saved $':>9}", lambda _, s: f"{s['saved_usd']:>9.5f}"),
    (f"{'MdAPE':>6}", _mdape_cell),
]


def print_table(runs: list[Run], columns: list[Column] | None = None) -> None:
    """One row a run; ``columns`` default to this bench's (with admitted local timeouts)."""
    if columns is None:
        columns = [
            *timing_columns(11),
            *COST_COLUMNS,
            (f"{'l_tmo':>5}", lambda _, s: f"{s['admitted_local_timeout']:>5}"),
        ]
    header = " ".join(heading for heading, _ in columns)
    print(header)
    print("-" * len(header))
    for run in runs:
        s = run.summary()
        print(" ".join(cell(run, s) for _, cell in columns))


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    api_latency = args.api_latency + args.api_per_token * args.max_tokens
    reply = " ".join(random.Random(7).choice(WORDS) for _ in range(args.max_tokens))
    os.environ[KEY_ENV] = "sk-bench-" + "0" * 16
    workdir = Path(tempfile.mkdtemp(prefix="frugal-routing-"))
    variants = args.variants or (
        ["naive", "predictive"] if len(args.parallel) == 1 else ["predictive"]
    )
    engines = {
        p: LocalEngine(config.LocalSettings(n_threads=args.threads, max_queue=64, parallel=p))
        for p in args.parallel
    }
    runs: list[Run] = []
    with FakeAPI(record=False, reply=reply, latency_s=api_latency) as api:
        for engine in engines.values():
            await engine.start()
        try:
            alone = {p: await warm_up(e, api, args, workdir) for p, e in engines.items()}
            first = args.parallel[0]
            timeout_s = alone[first] * 3.5 if args.timeout == "auto" else float(args.timeout)
            for p, engine in engines.items():
                rates = engine.rates
                print(
                    f"parallel {p}: one request alone: {alone[p]:.2f} s; engine rates: prefill "
                    f"{rates.prefill_tok_s:.0f} tok/s, decode {rates.decode_tok_s:.1f} tok/s "
                    f"({args.threads} thread)",
                    flush=True,
                )
            print(
                f"local timeout_s = {timeout_s:.1f} s; API latency {api_latency:.2f} s; load "
                f"average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs",
                flush=True,
            )
            combos = [(p, v) for p in args.parallel for v in variants]
            for round_ in range(args.rounds):
                order = combos if round_ % 2 == 0 else list(reversed(combos))
                for parallel, variant in order:
                    prompts = make_prompts(args.requests, args.prompt_tokens, seed=len(runs))
                    label = variant if len(engines) == 1 else f"{variant} p={parallel}"
                    run = await run_burst(
                        variant, engines[parallel], api, prompts, args, timeout_s, workdir
                    )
                    run.variant = label
                    runs.append(run)
                    print(f"round {round_ + 1} {label}: {run.summary()}", flush=True)
                    await asyncio.sleep(1.0)
        finally:
            for engine in engines.values():
                await engine.stop()
    for p, engine in engines.items():
        batch = engine.stats.batch or {}
        widths = {
            w: (c.get("ms"), c.get("tokens_per_sequence"), c.get("steps"))
            for w, c in (batch.get("step_ms_by_width") or {}).items()
        }
        if widths:  # what the forecast played the answers with: ms a step, tokens, steps
            print(f"parallel {p}: decode steps by width (ms, tokens a sequence, steps): {widths}")
    print()
    print_table(runs)
    print()
    labels = list(dict.fromkeys(r.variant for r in runs))
    for label in labels:
        mine = [r for r in runs if r.variant == label]
        errors = [e for r in mine for e in r.errors]
        mdape = f"{statistics.median(errors) * 100:.1f}%" if errors else "-"
        mean = statistics.fmean(statistics.fmean(r.latencies()) for r in mine)
        print(
            f"{label}: mean latency {mean:.2f} s, "
            f"local share {statistics.fmean(r.local_share for r in mine) * 100:.1f}%, "
            f"MdAPE {mdape} over {len(errors)} local answers, "
            f"admitted locally but local_timeout: {sum(len(r.admitted_timeouts) for r in mine)}"
        )
    result: dict[str, Any] = {
        "alone_s": alone,
        "timeout_s": timeout_s,
        "runs": [r.summary() for r in runs],
        "rows": {f"{i}-{r.variant}": r.rows for i, r in enumerate(runs)},
    }
    if len(engines) == 1:
        naive = [r for r in runs if r.variant == "naive"]
        predictive = [r for r in runs if r.variant == "predictive"]
        if naive and predictive:
            mean_naive = statistics.fmean(statistics.fmean(r.latencies()) for r in naive)
            mean_pred = statistics.fmean(statistics.fmean(r.latencies()) for r in predictive)
            print(f"mean latency predictive / naive: {mean_pred / mean_naive:.2f} (target <= 0.5)")
            result["mean_ratio"] = mean_pred / mean_naive
        errors = [e for r in predictive for e in r.errors]
        result["mdape"] = statistics.median(errors) if errors else None
    return result


def burst_parser(doc: str) -> argparse.ArgumentParser:
    """A parser with the options every routing bench takes: the burst, the fake API's latency
    and the rounds; ``doc`` is the bench's module docstring."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--prompt-tokens", type=int, default=512)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--gap-ms", type=float, default=50.0)
    parser.add_argument("--timeout", default="auto", help="local timeout_s, or 'auto'")
    parser.add_argument("--api-latency", type=float, default=1.5)
    parser.add_argument("--api-per-token", type=float, default=0.02)
    parser.add_argument("--rounds", type=int, default=1)
    return parser


def main() -> None:
    parser = burst_parser(__doc__)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--parallel",
        type=int,
        nargs="+",
        default=[1],
        help="[local] parallel; several values run side by side (one engine each)",
    )
    parser.add_argument(
        "--variants",
        nargs="+",
        choices=["naive", "predictive"],
        default=None,
        help="default: both with one --parallel value, predictive with several",
    )
    parser.add_argument("--json", default=None, help="write the results to this file")
    args = parser.parse_args()
    result = asyncio.run(main_async(args))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
