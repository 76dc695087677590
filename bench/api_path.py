"""The API pass-through path in process: CPU per request of the app alone, and where it goes.

    .venv/bin/python bench/api_path.py                          # 3,000 requests, this tree
    .venv/bin/python bench/api_path.py --profile /tmp/api.prof  # the same under cProfile
    PYTHONPATH=/tmp/old-tree .venv/bin/python bench/api_path.py # another commit's proxy/

One forced-API chat request (``x-frugal-route: api``), the body of ``bench/overhead.py``, is
handed to the Starlette app as ASGI messages, with no HTTP server in front: every middleware,
the validation, the key and budget hooks, the handler, the upstream call over aiohttp to
``bench/upstream_fast.py`` on loopback, the ledger's enqueue and the log line (to a file, as
``frugal serve`` writes JSON lines). The engine is the real one (loaded once; the API path asks
it nothing). The figure is the process's CPU time (``time.process_time``: every thread, the
ledger writer included) over the timed requests, divided by them; uvicorn's share is not in it
(``bench/overhead.py`` measures the whole server under wrk).

The script imports ``proxy`` from ``sys.path``, so that ``PYTHONPATH=<worktree>`` measures
another commit's code with the same harness (``bench/README.md``, "Rerun after the
restructure"). It prints one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import json
import logging
import os
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import upstream_fast  # a sibling in bench/, the script's folder

BODY = json.dumps(
    {
        "model": "gpt-4o-mini",
        "messages": [{"role": "user", "content": "What is the capital of France?"}],
        "max_tokens": 16,
    },
    separators=(",", ":"),
).encode()


PATH = "/v1/chat/completions"
SCOPE: dict[str, Any] = dict(  # the ASGI scope uvicorn would make for the request
    type="http",
    asgi={"version": "3.0", "spec_version": "2.3"},
    http_version="1.1",
    method="POST",
    scheme="http",
    path=PATH,
    raw_path=PATH.encode(),
    root_path="",
    query_string=b"",
    headers=[
        (b"host", b"127.0.0.1:8080"),
        (b"content-type", b"application/json"),
        (b"content-length", str(len(BODY)).encode()),
        (b"x-frugal-route", b"api"),
    ],
    client=("127.0.0.1", 50000),
    server=("127.0.0.1", 8080),
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def create_app(settings: Any) -> Any:
    try:
        from proxy.server.app import create_app as make
    except ImportError:  # a tree from before proxy/http/ (efff029)
        from proxy.app import create_app as make  # type: ignore[no-redef]
    return make(settings)


def thread_cpu() -> dict[str, float]:
    """CPU seconds of each live thread of this process, by the thread's name (the main thread,
    which runs the event loop, the ledger's writer, ...), read from ``/proc/self/task``."""
    import threading

    names = {t.native_id: t.name for t in threading.enumerate()}
    ticks = os.sysconf("SC_CLK_TCK")
    spent: dict[str, float] = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        name = names.get(int(tid), "other")
        spent[name] = spent.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / ticks
    return spent


class Lifespan:
    """Starlette's lifespan driven by hand: startup on enter, shutdown on exit."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.outbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Lifespan:
        async def receive() -> dict[str, Any]:
            return await self.inbox.get()

        async def send(message: dict[str, Any]) -> None:
            await self.outbox.put(message)

        scope = {"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}}
        self.task = asyncio.create_task(self.app(scope, receive, send))
        await self.inbox.put({"type": "lifespan.startup"})
        message = await self.outbox.get()
        if message["type"] != "lifespan.startup.complete":
            raise SystemExit(f"startup failed: {message}")
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.inbox.put({"type": "lifespan.shutdown"})
        await self.outbox.get()
        assert self.task is not None
        await self.task


async def one_request(app: Any, state: dict[str, Any]) -> int:
    """One POST /v1/chat/completions through the app; its status."""
    scope = {**SCOPE, "headers": list(SCOPE["headers"]), "state": dict(state), "app": app}
    sent = False
    status = 0

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": BODY, "more_body": False}
        await asyncio.Event().wait()  # the client never leaves
        raise AssertionError  # pragma: no cover

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]

    await app(scope, receive, send)
    return status


async def measure(args: argparse.Namespace, base: str, tmp: Path) -> dict[str, Any]:
    from proxy import config, logs

    settings = config.from_dict(upstream_fast.proxy_settings(base, tmp / "ledger.db"))
    log_file = (tmp / "serve.log").open("w")
    stderr = os.dup(2)
    os.dup2(log_file.fileno(), 2)  # the JSON log lines go to a file, as under systemd
    try:
        logs.configure("json", logging.INFO)
        return await _measure(args, settings, tmp)
    finally:
        os.dup2(stderr, 2)


async def _measure(args: argparse.Namespace, settings: Any, tmp: Path) -> dict[str, Any]:
    app = create_app(settings)
    async with Lifespan(app):
        state: dict[str, Any] = {}
        for _ in range(args.warmup):
            assert await one_request(app, state) == 200
        gc.collect()
        gc.freeze()  # as frugal serve does after start-up (proxy/server/run.py)
        profiler = cProfile.Profile() if args.profile else None
        threads0 = thread_cpu()
        cpu0, wall0 = time.process_time(), time.perf_counter()
        if profiler is not None:
            profiler.enable()
        for _ in range(args.requests):
            status = await one_request(app, state)
            if status != 200:
                raise SystemExit(f"status {status}; see {tmp / 'serve.log'}")
        if profiler is not None:
            profiler.disable()
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
        threads1 = thread_cpu()
        if profiler is not None:
            profiler.dump_stats(args.profile)
    import proxy

    return {
        "tree": str(Path(proxy.__file__).resolve().parents[1]),
        "requests": args.requests,
        "cpu_us_per_request": round(cpu * 1e6 / args.requests, 1),
        "wall_us_per_request": round(wall * 1e6 / args.requests, 1),
        "cpu_us_per_request_by_thread": {
            name: round((spent - threads0.get(name, 0.0)) * 1e6 / args.requests, 1)
            for name, spent in sorted(threads1.items())
            if spent - threads0.get(name, 0.0) > 0
        },
        "profiled": bool(args.profile),
    }


def loop_run(main: Any) -> Any:
    """On uvloop when it is installed, as uvicorn runs ``frugal serve``."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--warmup", type=int, default=300)
    parser.add_argument("--profile", help="write cProfile stats of the timed requests here")
    parser.add_argument("--cpu", default="0", help="pin this process to this CPU ('' for none)")
    args = parser.parse_args()
    os.environ["BENCH_UPSTREAM_KEY"] = upstream_fast.UPSTREAM_KEY
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    pinned = len(os.sched_getaffinity(0)) >= 2 and args.cpu
    with upstream_fast.started(free_port(), cpu=1 if pinned else None) as base:
        if args.cpu:
            os.sched_setaffinity(0, {int(args.cpu)})  # the engine worker is started after this
        with tempfile.TemporaryDirectory(prefix="frugal-api-path-") as tmp:
            result = loop_run(measure(args, base, Path(tmp)))
        print(json.dumps(result), file=sys.stdout, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
