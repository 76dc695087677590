"""What the durable batch store costs a batch: making one of OpenAI's largest, and each line's
claim and finish with its ledger row, on SQLite and on PostgreSQL.

    .venv/bin/python bench/batch_store.py [--lines 50000] [--work 5000] [--width 8]

For each backend (PostgreSQL through ``tests/pg.py``'s throwaway server, when its binaries are
installed), on a fresh database:

1. upload an input file of ``--lines`` chat lines (about 330 bytes each) and make the batch:
   the seconds ``FileStore.put`` and ``BatchStore.create`` take (the file read, every line
   checked, then inserted in one transaction), and the longest a small write transaction on
   another connection (as a budget check makes) waited meanwhile;
2. one worker claims ``--width`` lines at a time and finishes each with its result and its
   ledger row (one transaction per line), for ``--work`` lines: lines per second, and the
   milliseconds of store time per line, set beside what a line costs the engine (seconds, on a
   CPU);
3. two workers (two pools: two replicas) do the same at once: lines per second together.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from proxy.ledger.batches.files import FileStore  # noqa: E402
from proxy.ledger.batches.objects import LineResult  # noqa: E402
from proxy.ledger.batches.store import BatchStore  # noqa: E402
from proxy.ledger.db.connections import Pool  # noqa: E402
from proxy.ledger.db.location import Database, parse  # noqa: E402
from proxy.ledger.db.migrate import open_database  # noqa: E402
from proxy.ledger.pricing import Price, PriceBook, pico_per_token  # noqa: E402
from proxy.ledger.writing.ledger_row import LedgerRow  # noqa: E402

PRICES = PriceBook(
    {}, {"gpt-4o-mini": Price(input=pico_per_token(0.15), output=pico_per_token(0.6))}
)
CHAT = "/v1/chat/completions"


def input_file(n: int) -> bytes:
    lines = []
    for i in range(n):
        body = {
            "model": "gpt-4o-mini",
            "max_tokens": 64,
            "messages": [
                {
                    "role": "system",
                    "content": "Extract the city from the text. Answer in one word.",
                },
                {
                    "role": "user",
                    "content": f"Order {i} ships from the warehouse in Lyon on Monday.",
                },
            ],
        }
        line = {"custom_id": f"order-{i}", "method": "POST", "url": CHAT, "body": body}
        lines.append(json.dumps(line))
    return ("\n".join(lines) + "\n").encode("utf-8")


def row() -> LedgerRow:
    return LedgerRow(
        request_id="",
        ts=time.time(),
        requested_model="gpt-4o-mini",
        route="local",
        reason="accepted",
        status=200,
        prompt_tokens=40,
        completion_tokens=2,
        latency_ms=900.0,
        service_tier="batch",
    )


def probe_writes(database: Database, stop: threading.Event, waits: list[float]) -> None:
    """Small write transactions, as the request path's budget checks make, one every 10 ms
    while a batch is made: how long each took."""
    pool = Pool(database, size=1, timeout_s=60.0)
    while not stop.is_set():
        started = time.perf_counter()
        with pool.transaction() as tx:
            tx.run(
                "INSERT INTO batch_file_usage (owner, bytes) VALUES ('probe', 0) "
                "ON CONFLICT (owner) DO UPDATE SET bytes = batch_file_usage.bytes"
            )
        waits.append(time.perf_counter() - started)
        time.sleep(0.01)
    pool.close()


def work(pool: Pool, worker: str, limit: int, width: int, done: list[int]) -> None:
    store = BatchStore(pool, prices=PRICES)
    while done[0] < limit:
        lines = store.claim(worker, width, lease_s=300)
        if not lines:
            return
        for line in lines:
            result = LineResult(status_code=200, request_id=f"req-{line.index}", body={"ok": 1})
            store.finish(line.id, result, route="local", row=row())
            done[0] += 1


def run(database: Database, lines: int, limit: int, width: int) -> None:
    open_database(database)
    pool = Pool(database, size=4, timeout_s=60.0)
    content = input_file(lines)
    started = time.perf_counter()
    upload = FileStore(pool, quota_bytes=2**40).put(
        "bench", purpose="batch", filename="in.jsonl", content=content
    )
    uploaded = time.perf_counter()
    waits: list[float] = []
    stop = threading.Event()
    probe = threading.Thread(target=probe_writes, args=(database, stop, waits))
    probe.start()
    batch = BatchStore(pool).create("bench", input_file_id=upload.id, endpoint=CHAT)
    made = time.perf_counter()
    stop.set()
    probe.join()
    assert batch.total == lines, batch.errors
    print(
        f"  {database.dialect}: {lines} lines, {len(content) / 1e6:.1f} MB: upload "
        f"{uploaded - started:.2f} s, create {made - uploaded:.2f} s; a small write meanwhile "
        f"waited at most {1000 * max(waits):.0f} ms ({len(waits)} writes)"
    )
    done = [0]
    started = time.perf_counter()
    work(pool, "one", limit, width, done)
    one = time.perf_counter() - started
    print(
        f"  {database.dialect}: one worker: {done[0]} lines in {one:.2f} s: "
        f"{done[0] / one:.0f} lines/s, {1000 * one / done[0]:.2f} ms a line"
    )
    pools = [Pool(database, size=2, timeout_s=60.0) for _ in range(2)]
    counts = [[0], [0]]
    threads = [
        threading.Thread(target=work, args=(pools[i], f"replica-{i}", limit // 2, width, counts[i]))
        for i in range(2)
    ]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    two = time.perf_counter() - started
    total = counts[0][0] + counts[1][0]
    print(
        f"  {database.dialect}: two workers: {total} lines in {two:.2f} s: "
        f"{total / two:.0f} lines/s ({counts[0][0]} + {counts[1][0]})"
    )
    for each in [pool, *pools]:
        each.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=50_000)
    parser.add_argument("--work", type=int, default=5_000)
    parser.add_argument("--width", type=int, default=8)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        run(parse(str(Path(folder) / "bench.db")), args.lines, args.work, args.width)
    from tests import pg

    with pg.running() as server:
        if server is None:
            print("  postgresql: not installed, skipped")
            return
        run(parse(server.database()), args.lines, args.work, args.width)


if __name__ == "__main__":
    main()
