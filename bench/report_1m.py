"""``frugal report`` over a ledger of 1,000,000 requests in one month.

    .venv/bin/python bench/report_1m.py [--rows 1000000] [--db PATH|postgresql://...] [--repeat 3]
                                        [--endpoint]

Seeds a ledger (all migrations applied: the daily rollup is kept by its triggers) with
``--rows`` rows spread over October 2026 plus 10% more in the months around it, with the mix
a real proxy writes: 70% local, 25% API (a third of them after a rejected local attempt), 5%
failed; four models, one of them unpriced; five client keys. Then it times the installed
``frugal report`` command end to end (process start, upgrade check, queries, rendering) for
each format and grouping, best of ``--repeat`` runs (wall time, and the CPU time of that run:
the machine is shared, so wall time moves with its load), and checks that the JSON counts every
row, in total and across the client keys. Every grouping reads the daily rollup, the client key
included (0005_key_rollup.sql). An existing ``--db`` with the right row count is reused (and
upgraded by the first report if an older proxy wrote it). A ``postgresql://`` ``--db`` is
emptied and seeded with ``COPY`` (50,000 rows a statement, so the rollup's statement trigger
runs once each), unless it already holds the right row count.

``--endpoint`` then starts a real ``frugal serve`` on the same ledger and times
``GET /v1/frugal/report?month=2026-10[&by=...]`` (what the dashboard reads) the same way, best of
``--repeat`` (wall time from request to the last byte, on a warm server), and the dashboard's own
load: its three reports (by day, model and key) asked at once.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import resource
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from proxy.ledger.db.migrate import open_database  # noqa: E402
from proxy.ledger.writing.writer import COLUMNS  # noqa: E402

# The columns seeded: the writer's, with the client key's name last (whether or not the writer
# lists it among its columns); a column the seed has no value for is NULL.
SEEDED = (*(c for c in COLUMNS if c != "key_name"), "key_name")

FRUGAL = str(Path(sys.executable).with_name("frugal"))
OCTOBER = datetime(2026, 10, 1, tzinfo=UTC).timestamp()
MONTH_S = 31 * 86400
MODELS = [
    ("gpt-4o-mini", 150_000, 600_000),
    ("gpt-4o", 2_500_000, 10_000_000),
    ("claude-3-5-haiku-20241022", 800_000, 4_000_000),
    ("my-finetune", None, None),
]
REASONS_API = ["low_quality", "local_timeout", "forced", "predicted_slow", "context_overflow"]


def seed(db: Path, rows: int) -> None:
    open_database(str(db))
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=OFF")
    insert = f"INSERT INTO requests ({', '.join(SEEDED)}) VALUES ({', '.join('?' for _ in SEEDED)})"
    for batch in batches(rows):
        conn.execute("BEGIN")
        conn.executemany(insert, batch)
        conn.execute("COMMIT")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()


def seed_postgres(url: str, rows: int) -> None:
    from proxy.ledger.db import postgres
    from proxy.ledger.db.location import from_argument

    db = from_argument(url)
    open_database(db)
    with postgres.connect(db) as conn:
        conn.execute("TRUNCATE requests, requests_daily")
        for batch in batches(rows):
            with conn.transaction(), conn.cursor() as cursor:
                statement = f"COPY requests ({', '.join(SEEDED)}) FROM STDIN"
                with cursor.copy(statement) as copy:
                    for values in batch:
                        copy.write_row([int(v) if isinstance(v, bool) else v for v in values])
        conn.execute("VACUUM ANALYZE requests_daily")


def postgres_rows(url: str) -> int:
    from proxy.ledger.db import postgres
    from proxy.ledger.db.location import from_argument

    db = from_argument(url)
    try:
        with postgres.connect(db) as conn:
            return int(conn.execute("SELECT count(*) FROM requests").fetchone()[0])
    except Exception:  # noqa: BLE001 - no schema yet
        return 0


def batches(rows: int) -> Iterator[list[list[Any]]]:
    """The rows to seed, 50,000 at a time, in ``SEEDED`` order."""
    rng = random.Random(1)
    total = rows + rows // 10
    batch: list[list[Any]] = []
    for i in range(total):
        if i < rows:
            ts = OCTOBER + MONTH_S * i / rows
        else:  # September and November, outside the month
            ts = (
                OCTOBER
                + (-1 if i % 2 else 1) * rng.uniform(1, 20 * 86400)
                + (MONTH_S if i % 2 == 0 else 0)
            )
        model, p_in, p_out = MODELS[i % 4]
        roll = rng.random()
        prompt, completion = rng.randint(20, 2000), rng.randint(1, 500)
        status, local_ms, tax = 200, rng.uniform(100, 3000), 0.0
        if roll < 0.70:
            route, reason, paid = "local", "accepted", 0
        elif roll < 0.95:
            route, reason = "api", REASONS_API[i % 5]
            tax = local_ms if reason in ("low_quality", "local_timeout") else 0.0
            local_ms = tax
            paid = None if p_in is None else prompt * p_in + completion * p_out
        else:
            route, reason, status, paid, local_ms = "none", "bad_request", 400, 0, 0.0
        cf = None if p_in is None or status >= 400 else prompt * p_in + completion * p_out
        values = {
            "request_id": f"{i:032x}",
            "ts": ts,
            "endpoint": "chat.completions",
            "requested_model": model,
            "route": route,
            "reason": reason,
            "status": status,
            "stream": i % 3 == 0,
            "quality": rng.random(),
            "quality_reasons": "logprob_mean,format_ok",
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "local_prompt_tokens": prompt + 10,
            "local_completion_tokens": completion,
            "latency_ms": local_ms + 200,
            "local_ms": local_ms,
            "api_ms": 200.0 if route == "api" else 0.0,
            "api_cost_pusd": paid,
            "counterfactual_cost_pusd": cf,
            "error": None,
            "api_model": model,
            "cached_tokens": 0,
            "counterfactual_prompt_tokens": prompt,
            "counterfactual_completion_tokens": completion,
            "token_source": "tokenizer" if route == "local" else "usage",
            "latency_tax_ms": tax,
        }
        values["key_name"] = f"key-{i % 5}"
        batch.append([values.get(c) for c in SEEDED])
        if len(batch) == 50_000:
            yield batch
            batch = []
    if batch:
        yield batch


def timed(args: list[str], repeat: int) -> tuple[float, float, str]:
    """Best wall time and its CPU time (user + sys of the child) over ``repeat`` runs."""
    best, cpu, out = float("inf"), 0.0, ""
    for _ in range(repeat):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.perf_counter()
        done = subprocess.run(
            [FRUGAL, "report", *args], capture_output=True, text=True, check=False
        )
        wall = time.perf_counter() - started
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if done.returncode != 0:
            raise SystemExit(f"frugal report {' '.join(args)} failed: {done.stderr}")
        if wall < best:
            best = wall
            cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
        out = done.stdout
    return best, cpu, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--db", help="ledger file to (re)use (default: a temporary one)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--endpoint", action="store_true", help="also time GET /v1/frugal/report on frugal serve"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if args.db and args.db.startswith("postgres"):
            if postgres_rows(args.db) != args.rows + args.rows // 10:
                started = time.perf_counter()
                seed_postgres(args.db, args.rows)
                took = time.perf_counter() - started
                print(f"seeded {args.rows:,} rows (+{args.rows // 10:,} outside): {took:.0f} s")
            report(args.db, args)
            if args.endpoint:
                endpoint(args.db, args)
            return
        db = Path(args.db) if args.db else Path(tmp) / "ledger.db"
        have = 0
        if db.exists():
            have = sqlite3.connect(db).execute("SELECT COUNT(*) FROM requests").fetchone()[0]
        if have != args.rows + args.rows // 10:
            db.unlink(missing_ok=True)
            started = time.perf_counter()
            seed(db, args.rows)
            took, size = time.perf_counter() - started, db.stat().st_size / 1e6
            print(
                f"seeded {args.rows:,} rows (+{args.rows // 10:,} outside the month): {took:.0f} s"
            )
            print(f"ledger file: {size:.0f} MB")
        report(str(db), args)
        if args.endpoint:
            endpoint(str(db), args)


def report(db: str, args: argparse.Namespace) -> None:
    """Time the installed command on ``db`` (a file or a URL)."""
    base = ["--db", db, "--month", "2026-10"]
    _, _, out = timed([*base, "--format", "json"], 1)
    assert json.loads(out)["requests"] == args.rows, "the report must count every row"
    _, _, out = timed([*base, "--by", "key", "--format", "json"], 1)
    by_key = sum(group["requests"] for group in json.loads(out)["groups"])
    assert by_key == args.rows, "the client keys must count every row"
    runs = [
        ["--format", "table"],
        ["--format", "json"],
        ["--format", "csv"],
        ["--format", "markdown"],
        ["--by", "model"],
        ["--by", "day"],
        ["--by", "reason"],
        ["--by", "key"],
        ["--from", "2026-10-05", "--to", "2026-10-20", "--by", "model"],
    ]
    for extra in runs:
        args_ = [*base, *extra] if extra[0] != "--from" else ["--db", db, *extra]
        best, cpu, _ = timed(args_, args.repeat)
        print(f"frugal report {' '.join(extra):<48} {best:5.2f} s wall, {cpu:5.2f} s CPU")


def endpoint(db: str, args: argparse.Namespace) -> None:
    """Time ``GET /v1/frugal/report`` on a real ``frugal serve`` over ``db``."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    where = f'url = "{db}"' if "://" in db else f'path = "{db}"'
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "frugal.toml"
        config.write_text(
            f'[server]\nport = {port}\napi_keys_env = ""\n\n[local]\nn_threads = 1\n\n'
            f'[fallback]\napi_base = ""\napi_key_env = ""\n\n[audit]\nrate = 0\n\n'
            f"[ledger]\n{where}\n"
        )
        env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
        env.pop("FRUGAL_API_KEYS", None)
        with (Path(tmp) / "serve.log").open("w") as log:
            proc = subprocess.Popen(
                [FRUGAL, "serve", "--config", str(config)], stdout=log, stderr=log, env=env
            )
        base = f"http://127.0.0.1:{port}"
        try:
            _wait_ready(base, proc)
            _time_endpoint(base, args)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=60)


def _wait_ready(base: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit("frugal serve exited before it was ready")
        try:
            if httpx.get(base + "/healthz", timeout=2).json()["engine"]["state"] == "ready":
                return
        except (httpx.HTTPError, KeyError, ValueError):
            pass
        time.sleep(0.2)
    raise SystemExit("frugal serve was not ready in 180 s")


def _time_endpoint(base: str, args: argparse.Namespace) -> None:
    path = "/v1/frugal/report?month=2026-10"
    with httpx.Client(base_url=base, timeout=60) as http:
        assert http.get(path).json()["requests"] == args.rows, "the report must count every row"
        for by in (None, "model", "day", "reason", "key"):
            query = path + (f"&by={by}" if by else "")
            best = float("inf")
            for _ in range(args.repeat):
                started = time.perf_counter()
                response = http.get(query)
                best = min(best, time.perf_counter() - started)
                assert response.status_code == 200, response.text
            print(f"GET {query:<46} {best:5.2f} s wall")

    async def page_load() -> float:
        async with httpx.AsyncClient(base_url=base, timeout=60) as http:
            started = time.perf_counter()
            answers = await asyncio.gather(
                *(http.get(f"{path}&by={by}") for by in ("day", "model", "key"))
            )
            assert all(a.status_code == 200 for a in answers)
            return time.perf_counter() - started

    best = min(asyncio.run(page_load()) for _ in range(args.repeat))
    print(f"the dashboard's three reports (day, model, key) at once {best:5.2f} s wall")


if __name__ == "__main__":
    main()
