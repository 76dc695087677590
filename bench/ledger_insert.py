"""How many rows per second the ledger writes, and how long a row waits before it is committed.

    .venv/bin/python bench/ledger_insert.py [--rows 50000] [--rate 2000] [--seconds 10]

Three runs against a fresh SQLite file each (WAL, ``synchronous=NORMAL``, the default
``flush_interval_s = 0.2`` and ``batch_size = 256``):

1. burst, API rows: ``--rows`` rows recorded at once; rows/s from the first ``record`` to the
   last commit. API rows carry the provider's usage, so nothing is counted.
2. burst, local rows: the same with a counterfactual count per row (``litellm.token_counter``
   on the counter thread, o200k for gpt-4o-mini), which bounds the rate.
3. sustained: ``--rate`` rows per second for ``--seconds``, half local, half API; the delay from
   ``record`` to commit, p50 / p99 / max, is the ledger's part of the kill -9 window.

The event loop is the benchmark's own; a row is a realistic dict as
``proxy.serving.chat`` builds it.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from proxy.ledger.writing.tokens import CountJob, TokenCounter  # noqa: E402
from proxy.ledger.writing.writer import Ledger, LedgerRow  # noqa: E402

BODY = {
    "model": "gpt-4o-mini",
    "messages": [
        {"role": "system", "content": "You are a helpful assistant. Answer briefly."},
        {"role": "user", "content": "What is the capital of France? Answer in one word."},
    ],
}
COMPLETION = {"choices": [{"message": {"role": "assistant", "content": "Paris."}}]}


def row(i: int, route: str) -> LedgerRow:
    return LedgerRow(
        request_id=f"bench-{i:08d}",
        ts=time.time(),
        endpoint="chat.completions",
        requested_model="gpt-4o-mini",
        api_model="gpt-4o-mini",
        route=route,
        reason="accepted" if route == "local" else "low_quality",
        status=200,
        stream=0,
        quality=0.81,
        quality_reasons="logprob_mean,format_ok",
        prompt_tokens=31,
        completion_tokens=3,
        local_prompt_tokens=41,
        local_completion_tokens=4,
        latency_ms=412.5,
        local_ms=400.1,
        api_ms=0.0 if route == "local" else 350.0,
        cached_tokens=0,
        error=None,
    )


async def ready_counter() -> TokenCounter:
    counter = TokenCounter()
    await asyncio.wrap_future(counter.start())
    return counter


def target(tmp: str, url: str | None) -> str:
    """The database to write to: a fresh SQLite file, or the ``--db`` PostgreSQL database,
    emptied first."""
    if not url:
        return str(Path(tmp) / "bench.db")
    import psycopg

    from proxy.ledger.db.migrate import open_database

    open_database(url)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("TRUNCATE requests, requests_daily")
    return url


async def burst(rows: int, local: bool, url: str | None = None) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        ledger = Ledger(target(tmp, url), counter=await ready_counter())
        await ledger.start()
        started = time.perf_counter()
        for i in range(rows):
            count = CountJob(model="gpt-4o-mini", body=BODY, completion=COMPLETION)
            ledger.record(row(i, "local" if local else "api"), count=count if local else None)
            if i % 1000 == 999:
                await asyncio.sleep(0)  # let the writer run, as requests would
        while ledger.written < rows:
            await asyncio.sleep(0.001)
        elapsed = time.perf_counter() - started
        await ledger.close()
        assert ledger.dropped == 0
        return rows / elapsed


async def sustained(
    rate: int, seconds: float, url: str | None = None
) -> tuple[float, list[float], int]:
    with tempfile.TemporaryDirectory() as tmp:
        ledger = Ledger(target(tmp, url), counter=await ready_counter())
        await ledger.start()
        recorded: list[float] = []
        committed: list[float] = []

        async def watch() -> None:
            seen = 0
            while True:
                now = time.perf_counter()
                while seen < ledger.written:
                    committed.append(now)
                    seen += 1
                await asyncio.sleep(0.001)

        watcher = asyncio.create_task(watch())
        total = int(rate * seconds)
        started = time.perf_counter()
        for i in range(total):
            due = started + i / rate
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            local = i % 2 == 0
            count = CountJob(model="gpt-4o-mini", body=BODY, completion=COMPLETION)
            recorded.append(time.perf_counter())
            ledger.record(row(i, "local" if local else "api"), count=count if local else None)
        achieved = total / (time.perf_counter() - started)
        while ledger.written < total:
            await asyncio.sleep(0.001)
        await asyncio.sleep(0.01)
        watcher.cancel()
        await ledger.close()
        waits = [(c - r) * 1000 for r, c in zip(recorded, committed, strict=False)]
        return achieved, waits, ledger.estimated


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=50_000)
    parser.add_argument("--rate", type=int, default=2000)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument(
        "--db", help="postgresql://USER@HOST/DB to write to (emptied!); default: a SQLite file"
    )
    args = parser.parse_args()
    api = await burst(args.rows, local=False, url=args.db)
    print(f"burst, API rows:   {args.rows:,} rows, {api:,.0f} rows/s")
    local = await burst(args.rows // 5, local=True, url=args.db)
    print(f"burst, local rows: {args.rows // 5:,} rows (counted), {local:,.0f} rows/s")
    achieved, waits, estimated = await sustained(args.rate, args.seconds, url=args.db)
    q = statistics.quantiles(waits, n=100)
    print(
        f"sustained: {achieved:,.0f} rows/s offered for {args.seconds:g} s, all written; "
        f"record -> commit p50 {q[49]:.0f} ms, p99 {q[98]:.0f} ms, max {max(waits):.0f} ms; "
        f"rows written before their count was ready: {estimated}"
    )


if __name__ == "__main__":
    asyncio.run(main())
