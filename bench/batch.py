"""Benchmark (issue 41): the figures of bulk work, all in one run.

A batch of ``--lines`` lines (500 by default) of the work pipelines send to a Batch API: short
extraction (a date, an amount, a city, an e-mail address out of a sentence), classification (a
review's sentiment, a ticket's department, a message's language) and formatting (a list of names
as JSON, a date in ISO form, a title in title case), written here from small word lists with a
fixed seed; and about one line in ten the local model cannot serve at all: embeddings (a batch
of their own, as OpenAI's Batch API takes one endpoint per batch), a chat line asking for the
provider's built-in web search, and a prompt past the local context.

The batch runs through the proxy's own parts, in-process (``frugal serve`` did not run the batch
runner in the tree this was written on): the ledger's batch store on a SQLite file,
:class:`BatchRunner` at ``--width`` lines, each line a deferred job of the real bundled engine
(SmolLM2-135M) gated by its real quality score against ``[quality] threshold``'s default, and
the rejects sent as one upstream batch per endpoint to the fake API's Batch API
(``tests/fake_batch.py``) on loopback, through the proxy's upstream client. Printed, side by
side from the same run:

    local share      lines the gate accepted / all lines
    cost             the ledger's API cost of the batch through the proxy, against the same
                     lines sent straight to the provider's Batch API (the fake's usage, priced
                     at the ``batch`` tier of the price book for ``gpt-4o-mini`` and
                     ``text-embedding-3-small``)
    wall time        the batch through the proxy, against the same lines one at a time through
                     the interactive cascade (the app in-process, the same engine and gate, the
                     fake as its API); ``--serial-lines`` of them, spread over the mix, and
                     scaled to the whole batch
    decode rate      every token the engine wrote while the batch ran (the lines' answers,
                     accepted or not, and the interactive requests' local answers) over the
                     batch's local wall time, divided by ``bench/engine_batch.py``'s measure at
                     the same width (its decode phase only, measured in this run before and
                     after the batch; target >= 0.9)
    latency          ``--probes`` interactive chat requests through the cascade while the batch
                     runs, each right after one on the idle engine (``--probe-gap`` seconds
                     apart), so that idle and busy probes alternate and the shared machine's
                     load drifts alike on both: p50 and p95, and their ratio (target <= 1.25).
                     For an idle probe the runner's local attempts wait at their door, the
                     lines in the engine finish, the probe runs, and the door opens again; the
                     seconds the engine stood empty for it are left out of the decode rate
    where the time goes   a line's seconds in the engine (``LocalEngine.chat``) split into
                     before its first token (``prefill_s``: its wait for a turn and its prompt),
                     its answer (``decode_s``) and the rest (the engine's queue, the pipe, the
                     gate's scoring), as places of the width; and the batch loop's own counts
                     (decode steps, rows a step, prefill steps and their tokens), from the
                     worker

    .venv/bin/python bench/batch.py [--lines 500] [--width 4] [--threads 1] [--serial-lines 40]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from engine_batch import PROMPTS, _request, batched
from engine_common import machine, median, smollm2_path

from proxy import config
from proxy.engine.local_engine import LocalEngine
from proxy.engine.worker_link import ContextOverflow
from proxy.ledger.batches.files import FileStore
from proxy.ledger.batches.store import BatchStore
from proxy.ledger.db.connections import Pool
from proxy.ledger.db.location import parse
from proxy.ledger.db.migrate import open_database
from proxy.ledger.pricing import PICO, Price, PriceBook, pico_per_token
from proxy.routing.servable import chat_blocker
from proxy.serving.batch_lines import Accepted, Attempted, CannotServe, Rejected
from proxy.serving.batch_runner import BatchRunner
from proxy.upstream.client import Upstream
from proxy.upstream.deferred import Deferred, DeferredLine
from tests.fake_api import FakeAPI
from tests.in_process import in_process

KEY_ENV = "FRUGAL_BENCH_BATCH_KEY"
KEY = "sk-bench-batch-0123456789"
MODEL = "gpt-4o-mini"
EMBED = "text-embedding-3-small"
CHAT = "/v1/chat/completions"
EMBEDDINGS = "/v1/embeddings"
STANDARD = {MODEL: (0.15, 0.6), EMBED: (0.02, 0.0)}  # USD per million tokens, in and out
PRICES = PriceBook(
    {},
    {m: Price(input=pico_per_token(i), output=pico_per_token(o)) for m, (i, o) in STANDARD.items()},
)
OWNER = "id:bench"

# -- the lines ------------------------------------------------------------------------------------

FIRST = ["Maria", "James", "Aiko", "Omar", "Lena", "Carlos", "Priya", "Tom", "Fatima", "Noah"]
LAST = ["Garcia", "Smith", "Tanaka", "Haddad", "Novak", "Silva", "Patel", "Brown", "Okafor", "Kim"]
CITIES = ["Lisbon", "Denver", "Osaka", "Nairobi", "Hamburg", "Toronto", "Lyon", "Perth", "Austin"]
MONTHS = ["January", "March", "April", "June", "August", "September", "October", "December"]
PRODUCTS = ["blender", "headphones", "backpack", "desk lamp", "kettle", "phone case", "jacket"]
GOOD = ["works perfectly", "arrived early and looks great", "is worth every penny"]
BAD = ["broke after two days", "never arrived", "is much smaller than pictured"]
TICKETS = [
    ("I was charged twice for my subscription this month.", "billing"),
    ("The app crashes when I open the settings page.", "technical"),
    ("Can I change the delivery address of my order?", "shipping"),
    ("I forgot my password and the reset e-mail never comes.", "account"),
]
MESSAGES = ["Où est la gare, s'il vous plaît ?", "Wie spät ist es?", "¿Dónde está el baño?"]
TITLES = ["the old man and the sea", "a tale of two cities", "the quick brown fox"]


def extraction(r: random.Random) -> str:
    name = f"{r.choice(FIRST)} {r.choice(LAST)}"
    day, month, year = r.randint(1, 28), r.choice(MONTHS), r.randint(2019, 2027)
    kind = r.randrange(4)
    if kind == 0:
        return (
            f"Extract the date from this sentence and answer with the date only: "
            f'"{name} signed the lease on {month} {day}, {year}, in {r.choice(CITIES)}."'
        )
    if kind == 1:
        amount = f"{r.randint(12, 990)}.{r.randint(0, 99):02d}"
        return (
            f"What amount was paid? Answer with the number only: "
            f'"Invoice 4{r.randint(100, 999)}: {name} paid ${amount} for a {r.choice(PRODUCTS)}."'
        )
    if kind == 2:
        return (
            f"Which city is mentioned? Answer with the city only: "
            f'"Our team meets {name} in {r.choice(CITIES)} next week."'
        )
    user = f"{name.split()[0].lower()}.{name.split()[1].lower()}{r.randint(1, 99)}"
    return (
        f"Extract the e-mail address from this message: "
        f'"Hi, please write to {user}@example.com about the {r.choice(PRODUCTS)} order."'
    )


def classification(r: random.Random) -> str:
    kind = r.randrange(3)
    if kind == 0:
        good = r.random() < 0.5
        review = f"This {r.choice(PRODUCTS)} {r.choice(GOOD if good else BAD)}."
        return f'Classify the sentiment of this review as positive or negative: "{review}"'
    if kind == 1:
        ticket, _ = r.choice(TICKETS)
        return (
            "Which department should handle this ticket: billing, technical, shipping or "
            f'account? Answer with one word. "{ticket}"'
        )
    return (
        f'Which language is this message written in? Answer with one word: "{r.choice(MESSAGES)}"'
    )


def formatting(r: random.Random) -> str:
    kind = r.randrange(3)
    if kind == 0:
        names = ", ".join(f"{r.choice(FIRST)} {r.choice(LAST)}" for _ in range(r.randint(2, 4)))
        return f"Format these names as a JSON list of strings: {names}"
    if kind == 1:
        day, month, year = r.randint(1, 28), r.choice(MONTHS), r.randint(2019, 2027)
        return f"Write the date {month} {day}, {year} in ISO 8601 form (YYYY-MM-DD)."
    return f'Rewrite this title in title case: "{r.choice(TITLES)}"'


def chat_body(prompt: str, max_tokens: int, **extra: Any) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        **extra,
    }


def make_lines(n: int, max_tokens: int, seed: int = 41) -> list[dict[str, Any]]:
    """``n`` lines of the mix, as ``{"custom_id", "method", "url", "body", "kind"}`` (``kind``
    is the bench's label, dropped from the uploaded file)."""
    r = random.Random(seed)
    lines: list[dict[str, Any]] = []
    for i in range(n):
        roll = r.random()
        if roll < 0.04:
            kind, url = "embedding", EMBEDDINGS
            body: dict[str, Any] = {"model": EMBED, "input": classification(r)}
        elif roll < 0.07:
            kind, url = "built-in tool", CHAT
            question = f"What is the weather in {r.choice(CITIES)} today?"
            body = chat_body(question, max_tokens, web_search_options={})
        elif roll < 0.10:
            kind, url = "context overflow", CHAT
            filler = " ".join(extraction(r) for _ in range(300))  # far past a 4k context
            body = chat_body(f"Summarise these notes in one line: {filler}", max_tokens)
        else:
            kind = ("extraction", "classification", "formatting")[r.randrange(3)]
            url = CHAT
            text = {"extraction": extraction, "classification": classification}.get(
                kind, formatting
            )(r)
            body = chat_body(text, max_tokens)
        lines.append({"custom_id": f"line-{i}", "method": "POST", "url": url, "body": body})
        lines[-1]["kind"] = kind
    return lines


# -- the local attempt ----------------------------------------------------------------------------


class EngineAttempt:
    """A batch line's local attempt: what the local model cannot serve is said at once
    (embeddings; a chat parameter only the API has, by the cascade's own
    :func:`chat_blocker`; a prompt past the context, by the engine), the rest runs on the real
    engine as deferred work and is gated by its quality score against ``threshold``. Counts the
    tokens the engine wrote."""

    def __init__(self, engine: LocalEngine, threshold: float) -> None:
        self.engine, self.threshold = engine, threshold
        self.tokens = 0
        self.last_answer = 0.0
        self.in_engine_s = self.prefill_s = self.decode_s = 0.0  # summed over the lines
        self.batch_health: dict[str, Any] = {}  # the worker's batch counts, at the last answer
        self.door = asyncio.Event()  # closed while an idle probe runs
        self.door.set()
        self.inside = 0  # lines in the engine now
        self.held_s = 0.0  # seconds the engine stood empty for idle probes

    async def hold(self) -> float:
        """Close the door and wait until no line is in the engine; when it emptied."""
        self.door.clear()
        while self.inside:
            await asyncio.sleep(0.02)
        return time.perf_counter()

    async def __call__(
        self, url: str, body: dict[str, Any], *, deadline: float, priority: str
    ) -> Attempted:
        if url != CHAT:
            return CannotServe(reason="unsupported")
        if chat_blocker(body) is not None:
            return CannotServe(reason="unsupported")
        await self.door.wait()
        started = time.monotonic()
        self.inside += 1
        try:
            answer = await self.engine.chat(
                dict(body), deadline=started + (deadline - time.time()), priority=priority
            )
        except ContextOverflow:
            return CannotServe(reason="context_overflow")
        finally:
            self.inside -= 1
        self.batch_health = (answer["frugal"].get("batch") or {}).get("engine") or {}
        self.tokens += int(answer["usage"]["completion_tokens"])
        self.last_answer = time.perf_counter()
        self.in_engine_s += time.monotonic() - started
        self.prefill_s += float(answer["frugal"]["prefill_s"])
        self.decode_s += float(answer["frugal"]["decode_s"])
        value = answer["frugal"]["quality"]["value"]
        local_ms = (time.monotonic() - started) * 1000.0
        if value is None or value < self.threshold:
            return Rejected(reason="low_quality", local_ms=local_ms)
        shown = {k: v for k, v in answer.items() if k != "frugal"}
        return Accepted(status_code=200, body=shown, usage=answer.get("usage"), local_ms=local_ms)


# -- helpers --------------------------------------------------------------------------------------


def settings_for(db: Path, api: FakeAPI, args: argparse.Namespace) -> config.Settings:
    """The interactive cascade's settings: the defaults, but the fake as the API and a ledger of
    the bench's own."""
    return config.from_dict(
        {
            "server": {"api_keys_env": "", "max_concurrency": 256},
            "local": {"n_threads": args.threads, "parallel": args.width, "max_queue": 64},
            "fallback": {"api_base": api.url, "api_key_env": KEY_ENV, "timeout_s": 120.0},
            "ledger": {"path": str(db), "flush_interval_s": 0.05},
            "pricing": {
                m: {"input_per_mtok": i, "output_per_mtok": o} for m, (i, o) in STANDARD.items()
            },
        },
        source="<bench>",
    )


def batch_cost(model: str, usage: dict[str, Any]) -> int:
    """Picodollars of one answer's usage at the ``batch`` tier."""
    price = PRICES.price(model, "batch")
    assert price is not None, model
    prompt = int(usage.get("prompt_tokens") or 0)
    completion = int(usage.get("completion_tokens") or 0)
    return prompt * price.input + completion * price.output


def p95(values: list[float]) -> float:
    return statistics.quantiles(values, n=20, method="inclusive")[18]


def reference_rate(width: int, threads: int, reps: int, max_tokens: int) -> list[float]:
    """``bench/engine_batch.py``'s aggregate decode rate at ``width``: ``reps`` runs."""
    from proxy.engine.batch.decode import BatchEngine
    from proxy.engine.generate import LocalModel

    model = LocalModel.load(smollm2_path(), n_ctx=1024, n_threads=threads, calibrate=False)
    engine = BatchEngine(model, width)
    requests = [_request(PROMPTS[i % len(PROMPTS)], max_tokens) for i in range(width)]
    rates = []
    for _ in range(reps):
        wall, _, tokens = batched(engine, requests)
        rates.append(tokens / wall)
    engine.close()
    model.close()
    return rates


PROBES = [
    "Name three colours.",
    "What is the capital of Italy?",
    "Give one word for happy.",
    "What is two plus two?",
    "Name a large animal.",
    "Say hello to a friend.",
]


async def probe(client: Any, i: int, max_tokens: int) -> tuple[float, str, int]:
    """One interactive chat request through the cascade: its wall seconds, route, and the tokens
    the engine wrote for it (0 when it went to the API without a local answer)."""
    body = chat_body(PROBES[i % len(PROBES)], max_tokens)
    started = time.perf_counter()
    response = await client.post(CHAT, json=body)
    seconds = time.perf_counter() - started
    response.raise_for_status()
    route = response.headers.get("x-frugal-route", "?")
    tokens = int(response.json()["usage"]["completion_tokens"]) if route == "local" else 0
    return seconds, route, tokens


class LoopLag:
    """How late the event loop wakes a 50 ms sleep, by the probe running meanwhile: what the
    runner and the rest of the process hold the loop for while an interactive request waits."""

    def __init__(self) -> None:
        self.tag: str | None = None
        self.lags: dict[str, list[float]] = {}

    async def watch(self) -> None:
        while True:
            started = time.perf_counter()
            await asyncio.sleep(0.05)
            if self.tag is not None:
                self.lags.setdefault(self.tag, []).append(time.perf_counter() - started - 0.05)

    def line(self) -> str:
        parts = []
        for tag in ("idle", "busy"):
            lags = self.lags.get(tag) or [0.0]
            parts.append(
                f"{tag} mean {statistics.fmean(lags) * 1000:.0f} ms, max {max(lags) * 1000:.0f} ms"
            )
        return "event loop lag during the probes: " + "; ".join(parts)


# -- the run --------------------------------------------------------------------------------------


async def run(args: argparse.Namespace, workdir: Path) -> None:
    lines = make_lines(args.lines, args.max_tokens)
    by_id = {line["custom_id"]: line for line in lines}
    kinds: dict[str, int] = {}
    for line in lines:
        kinds[line["kind"]] = kinds.get(line["kind"], 0) + 1
    print(f"{len(lines)} lines: " + ", ".join(f"{k} {v}" for k, v in sorted(kinds.items())))

    ref = reference_rate(args.width, args.threads, args.reps, 128)
    engine = LocalEngine(
        config.LocalSettings(
            n_threads=args.threads, parallel=args.width, max_queue=64, timeout_s=120.0
        )
    )
    await engine.start()
    threshold = config.Settings().quality.threshold
    with FakeAPI() as api:
        os.environ[KEY_ENV] = KEY
        settings = settings_for(workdir / "interactive.db", api, args)
        async with in_process(settings, engine, timeout_s=600) as client:
            for i in range(2):  # warm-up: the rates settle, not counted
                await probe(client, i, args.probe_tokens)
            idle: list[float] = []

            # -- the batch through the proxy, interactive requests meanwhile ---------------------
            database = parse(str(workdir / "batch.db"))
            open_database(database)
            pool = Pool(database, size=8, timeout_s=30.0)
            files = FileStore(pool, quota_bytes=10**10)
            store = BatchStore(pool, prices=PRICES)
            made = []
            for url in (CHAT, EMBEDDINGS):
                own = [
                    {k: v for k, v in x.items() if k != "kind"} for x in lines if x["url"] == url
                ]
                if not own:
                    continue
                content = "".join(json.dumps(x) + "\n" for x in own).encode()
                upload = files.put(OWNER, purpose="batch", filename="in.jsonl", content=content)
                made.append(store.create(OWNER, input_file_id=upload.id, endpoint=url).id)
            local = EngineAttempt(engine, threshold)
            fallback = config.FallbackSettings(
                api_base=api.url, api_key_env=KEY_ENV, timeout_s=120.0, connect_timeout_s=5.0
            )
            batch_settings = config.BatchSettings(poll_interval_s=0.2, max_poll_interval_s=1.0)
            busy: list[float] = []
            busy_routes: dict[str, int] = {}
            probe_tokens = 0
            async with Upstream(fallback) as upstream:
                deferred = Deferred(upstream, batch_settings)
                runner = BatchRunner(
                    store, local, deferred, width=args.width, lease_s=600.0, idle_s=0.2
                )
                started = time.perf_counter()
                await runner.start()

                def open_batches() -> int:
                    return sum(
                        1
                        for b in made
                        if (got := store.get(b)) is not None
                        and got.status not in ("completed", "failed", "cancelled", "expired")
                    )

                lag = LoopLag()
                watcher = asyncio.create_task(lag.watch())
                i = 0
                while await asyncio.to_thread(open_batches):
                    if i < args.probes and local.inside == args.width:
                        # An idle probe (the engine emptied for it), then a busy one once the
                        # runner has filled the engine again: alternating, as the load drifts.
                        emptied = await local.hold()
                        lag.tag = "idle"
                        seconds, _, _ = await probe(client, i, args.probe_tokens)
                        lag.tag = None
                        idle.append(seconds)
                        local.held_s += time.perf_counter() - emptied
                        local.door.set()
                        for _ in range(int(30 / 0.05)):
                            if local.inside == args.width:
                                break
                            await asyncio.sleep(0.05)
                        lag.tag = "busy"
                        seconds, route, tokens = await probe(client, i, args.probe_tokens)
                        lag.tag = None
                        if runner.gauges().running:  # the batch held the engine meanwhile
                            busy.append(seconds)
                            busy_routes[route] = busy_routes.get(route, 0) + 1
                            probe_tokens += tokens
                        i += 1
                    await asyncio.sleep(args.probe_gap)
                batch_wall = time.perf_counter() - started
                watcher.cancel()
                local_wall = local.last_answer - started
                await runner.stop()

            outputs: dict[str, dict[str, Any]] = {}
            written = 0  # output lines, so that a custom_id twice is seen
            for b in made:
                got = store.get(b)
                assert got is not None and got.status == "completed", got
                for raw in (files.content(got.output_file_id) or b"").decode().splitlines():
                    out = json.loads(raw)
                    outputs[out["custom_id"]] = out
                    written += 1
                assert got.error_file_id is None, "a line failed"
            assert sorted(outputs) == sorted(by_id), "a line is missing"
            assert written == len(lines), "a line is answered twice"
            with pool.transaction() as tx:
                rows = tx.rows(
                    "SELECT route, reason, api_cost_pusd, counterfactual_cost_pusd FROM requests"
                )
            pool.close()
            assert len(rows) == len(lines), (len(rows), len(lines))
            accepted = sum(1 for r in rows if r[0] == "local")
            reasons: dict[str, int] = {}
            for r in rows:
                reasons[r[1]] = reasons.get(r[1], 0) + 1
            proxy_cost = sum(r[2] or 0 for r in rows)
            cf_cost = sum(r[3] or 0 for r in rows)
            sent_up = len(api.batch_lines)
            upstream_batches = api.batches_made

            # -- the same lines straight to the provider's Batch API -----------------------------
            api.reset()
            direct_cost = 0
            direct_started = time.perf_counter()
            async with Upstream(fallback) as upstream:
                deferred = Deferred(upstream, batch_settings)
                for url in (CHAT, EMBEDDINGS):
                    own = [
                        DeferredLine(custom_id=x["custom_id"], url=url, body=x["body"])
                        for x in lines
                        if x["url"] == url
                    ]
                    if not own:
                        continue
                    outcome = await deferred.send(own, request_id=f"direct-{url}")
                    assert not outcome.unanswered and len(outcome.results) == len(own)
                    for cid, answer in outcome.results.items():
                        usage = answer.body.get("usage") or {}
                        direct_cost += batch_cost(by_id[cid]["body"]["model"], usage)
            direct_wall = time.perf_counter() - direct_started
            direct_batches = api.batches_made

            # -- a sample of the lines one at a time through the interactive cascade -------------
            step = max(1, len(lines) // max(1, args.serial_lines))
            sample = lines[::step][: args.serial_lines]
            serial_routes: dict[str, int] = {}
            serial_started = time.perf_counter()
            for line in sample:
                response = await client.post(line["url"], json=line["body"])
                response.raise_for_status()
                route = response.headers.get("x-frugal-route", "?")
                route += " " + response.headers.get("x-frugal-reason", "?")
                serial_routes[route] = serial_routes.get(route, 0) + 1
            serial_wall = time.perf_counter() - serial_started
    ref += reference_rate(args.width, args.threads, args.reps, 128)
    await engine.stop()

    # -- the figures ------------------------------------------------------------------------------
    n = len(lines)
    working = local_wall - local.held_s  # the engine's time on the batch, idle probes out
    rate = (local.tokens + probe_tokens) / working
    print(
        f"SmolLM2-135M Q4_1 (the bundled model), {args.threads} thread(s), width {args.width}, "
        f"answers up to {args.max_tokens} tokens, gate threshold {threshold}"
    )
    print(
        f"local share: {accepted}/{n} = {accepted / n:.1%} accepted by the gate; "
        + ", ".join(f"{k} {v}" for k, v in sorted(reasons.items()))
    )
    print(
        f"to the API: {sent_up} lines in {upstream_batches} upstream batch(es), 0 single calls "
        f"(the fake saw {api.single_calls} single calls in the cascade part)"
    )
    print(
        f"cost at the batch rate: through the proxy ${proxy_cost / PICO:.6f}, straight to the "
        f"Batch API ${direct_cost / PICO:.6f} ({direct_batches} batches), ratio "
        f"{proxy_cost / direct_cost:.3f}; the ledger's counterfactual ${cf_cost / PICO:.6f}"
    )
    scaled = serial_wall * n / len(sample)
    print(
        f"wall time: the batch through the proxy {batch_wall:.1f} s "
        f"(local part {local_wall:.1f} s); "
        f"one at a time through the interactive cascade {serial_wall:.1f} s for {len(sample)} "
        f"lines ({', '.join(f'{k} {v}' for k, v in sorted(serial_routes.items()))}), "
        f"x {n / len(sample):.1f} = {scaled:.1f} s for {n}; ratio {batch_wall / scaled:.2f}"
    )
    print(f"  (straight to the fake's Batch API: {direct_wall:.1f} s, its answers instant)")
    print(
        f"engine decode rate during the batch: {local.tokens} line tokens + {probe_tokens} "
        f"interactive tokens over {working:.1f} s ({local_wall:.1f} s less {local.held_s:.1f} s "
        f"emptied for idle probes) = {rate:.1f} tok/s (prefill included); "
        f"engine_batch at width {args.width}: median {median(ref):.1f} tok/s "
        f"({', '.join(f'{x:.1f}' for x in ref)}); ratio {rate / median(ref):.2f} (target >= 0.9)"
    )
    rest = local.in_engine_s - local.prefill_s - local.decode_s
    print(
        f"  lines in the engine at once, on average: {local.in_engine_s / working:.2f} of "
        f"{args.width} (before the first token {local.prefill_s / working:.2f}, decoding "
        f"{local.decode_s / working:.2f}, queue, pipe and gate {rest / working:.2f}); a "
        f"rejected interactive answer's tokens are not counted"
    )
    health = local.batch_health
    if health:
        prefill_steps = health["steps"] - health["decode_steps"]
        print(
            f"  the worker's batch loop since it started (probes included): "
            f"{health['decode_steps']} decode steps of {health['mean_rows_per_step']} rows on "
            f"average, {prefill_steps} prefill steps of "
            f"{health['mean_prefill_tokens_per_step']} tokens on average, "
            f"{health['prefix']['sequences']} prompts kept a cached prefix "
            f"({health['prefix']['tokens']} tokens), busy {health['busy_s']:.1f} s"
        )
    if len(busy) >= 2 and len(idle) >= 2:
        print(
            f"interactive latency, {len(busy)} requests while the batch ran "
            f"({', '.join(f'{k} {v}' for k, v in sorted(busy_routes.items()))}) against "
            f"{len(idle)} on the idle engine: p50 {median(busy):.2f} s / {median(idle):.2f} s = "
            f"{median(busy) / median(idle):.2f}x; p95 {p95(busy):.2f} s / {p95(idle):.2f} s = "
            f"{p95(busy) / p95(idle):.2f}x (target <= 1.25)"
        )
        print(f"  {lag.line()}")
    else:
        print(f"interactive latency: too few requests while the batch ran ({len(busy)})")
    print(machine())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lines", type=int, default=500)
    parser.add_argument("--width", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--max-tokens", type=int, default=48, help="each line's max_tokens")
    parser.add_argument("--serial-lines", type=int, default=40)
    parser.add_argument("--probes", type=int, default=12)
    parser.add_argument("--probe-tokens", type=int, default=24)
    parser.add_argument("--probe-gap", type=float, default=2.0, help="seconds between probes")
    parser.add_argument("--reps", type=int, default=2, help="engine_batch runs, before and after")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="frugal-bench-batch-") as workdir:
        asyncio.run(run(args, Path(workdir)))


if __name__ == "__main__":
    main()
