"""CPU per request of the upstream client alone: httpx, aiohttp, and frugal's ``Upstream``.

    .venv/bin/python bench/upstream_clients.py              # 4000 requests at 1 and 16 at once

Each client POSTs the same chat body to ``bench/upstream_fast.py`` (started here, pinned to CPU 1
when there are two) and parses the JSON answer; the client runs in a fresh process pinned to
CPU 0, and its CPU time (``time.process_time``) over the requests, divided by their number, is
the cost of one request. This is why ``proxy/upstream/client.py`` uses aiohttp for the direct route.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import upstream_fast  # a sibling in bench/, the script's folder

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
BODY = json.dumps(
    {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "What is the capital?"}]}
).encode()
HEADERS = {"content-type": "application/json", "x-request-id": "bench", "authorization": "Bearer k"}
CLIENTS = ("httpx", "aiohttp", "frugal")


async def _drive(call: Callable[[], Awaitable[dict[str, Any]]], n: int, concurrency: int) -> float:
    """CPU microseconds per request for ``n`` calls, ``concurrency`` at a time."""
    for _ in range(50):
        await call()
    todo = iter(range(n))

    async def worker() -> None:
        for _ in todo:
            assert (await call())["usage"]

    cpu = time.process_time()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return (time.process_time() - cpu) * 1e6 / n


async def _one(kind: str, base: str, n: int, concurrency: int) -> float:
    url = base + "/chat/completions"
    if kind == "httpx":
        import httpx

        limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
        async with httpx.AsyncClient(limits=limits) as client:

            async def call() -> dict[str, Any]:
                response = await client.post(url, content=BODY, headers=HEADERS)
                return dict(json.loads(response.content))

            return await _drive(call, n, concurrency)
    if kind == "aiohttp":
        import aiohttp

        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=64)) as session:

            async def call() -> dict[str, Any]:
                async with session.post(url, data=BODY, headers=HEADERS) as response:
                    return dict(json.loads(await response.read()))

            return await _drive(call, n, concurrency)
    sys.path.insert(0, str(ROOT))
    from proxy.config import FallbackSettings
    from proxy.upstream.client import Upstream

    body = json.loads(BODY)
    async with Upstream(FallbackSettings(api_base=base, api_key_env="")) as upstream:

        async def call() -> dict[str, Any]:
            return (await upstream.chat(body, request_id="bench")).body

        return await _drive(call, n, concurrency)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=4000)
    parser.add_argument("--connections", default="1,16")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--child", nargs=4, metavar=("KIND", "BASE", "N", "C"), help=argparse.SUPPRESS
    )
    args = parser.parse_args(argv)
    if args.child:
        kind, base, n, c = args.child
        print(asyncio.run(_one(kind, base, int(n), int(c))))
        return 0

    pin = len(os.sched_getaffinity(0)) >= 2
    with upstream_fast.started(9990 + os.getpid() % 9, cpu=1 if pin else None) as base:
        print("| client | connections | CPU µs per request (median of runs, min–max) |")
        print("|---|---:|---|")
        for conns in [int(c) for c in args.connections.split(",")]:
            for kind in CLIENTS:
                runs = []
                for _ in range(args.repeat):
                    child = [sys.executable, __file__, "--child", kind, base]
                    child += [str(args.requests), str(conns)]
                    out = subprocess.run(
                        (["taskset", "-c", "0"] if pin else []) + child,
                        capture_output=True,
                        text=True,
                        check=True,
                    )
                    runs.append(float(out.stdout.strip().splitlines()[-1]))
                print(
                    f"| {kind} | {conns} | {statistics.median(runs):.0f} "
                    f"({min(runs):.0f}–{max(runs):.0f}) |",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
