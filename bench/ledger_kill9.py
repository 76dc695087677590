"""After ``kill -9``, which answered requests are missing from the ledger, and how old were they?

    .venv/bin/python bench/ledger_kill9.py [--trials 5] [--clients 32]

Each trial starts the fake API and a real ``frugal serve`` with a fresh ledger (as
``bench/ledger_load.py`` does), runs ``--clients`` clients sending forced-API requests back to
back for a random 2-6 s, then kills the server with SIGKILL mid-load. A response counts as
completed when the client has read all of it; the client notes the wall time. The ledger is then
read (WAL recovery included) and every completed response not in it is a lost row; its *age* is
how long before the kill its response had completed. The window is the largest such age over
all trials: a row can be lost only if its response completed less than that before the kill.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from ledger_load import Load, Stack  # noqa: E402

from tests.loopback import outlived  # noqa: E402


async def trial(clients: int, seconds: float) -> tuple[int, int, list[float]]:
    with tempfile.TemporaryDirectory() as tmp:
        stack = Stack(Path(tmp))
        engine_pid = int(stack.health()["engine"]["pid"])  # type: ignore[index]
        load = Load(stack.base, clients)
        running = asyncio.create_task(load.run(None))
        await asyncio.sleep(seconds)
        killed_at = time.time()
        os.kill(stack.serve.pid, signal.SIGKILL)
        load.stop.set()
        await running
        stack.serve.wait(timeout=10)
        if await outlived(engine_pid):  # the engine worker ends with its parent; make sure it did
            print("warning: the engine worker outlived the killed server")
        stack.stop()
        rows = stack.rows()
        done = [(rid, at) for rid, at in load.completed if at <= killed_at]
        ages = sorted(killed_at - at for rid, at in done if rid not in rows)
        return len(done), len(rows), ages


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--clients", type=int, default=32)
    args = parser.parse_args()
    rng = random.Random(9)
    window = 0.0
    for n in range(1, args.trials + 1):
        seconds = rng.uniform(2, 6)
        done, rows, ages = await trial(args.clients, seconds)
        oldest = max(ages, default=0.0)
        window = max(window, oldest)
        print(
            f"trial {n}: killed after {seconds:.1f} s; {done:,} responses completed, "
            f"{rows:,} rows; lost {len(ages)}, the oldest completed {oldest * 1000:.0f} ms "
            "before the kill"
        )
    print(f"window: every response completed more than {window * 1000:.0f} ms before the kill "
          "was in the ledger")  # fmt: skip
    if window >= 1.0:
        raise SystemExit(1)


if __name__ == "__main__":
    asyncio.run(main())
