"""32 clients for 60 s against a real ``frugal serve``: does every request become exactly one row?

    .venv/bin/python bench/ledger_load.py [--clients 32] [--seconds 60]

Starts the fake API (``python -m tests.fake_api``, no latency) and ``frugal serve`` on loopback
ports with a fresh ledger, then runs ``--clients`` concurrent clients, each sending chat requests
back to back with ``x-frugal-route: api`` (so the bench measures the proxy and its ledger, not
the local model) and its own ``x-request-id``. After ``--seconds`` it stops the clients, sends
SIGTERM, and compares the ledger with what the clients saw: the rows must be exactly the requests
sent, id for id, with no write failure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
FRUGAL = str(Path(sys.executable).with_name("frugal"))
sys.path.insert(0, str(ROOT))

from tests.ledger.load import Load  # noqa: E402
from tests.loopback import free_port, poll_ready  # noqa: E402


def wait_http(url: str, proc: subprocess.Popen[bytes], timeout: float = 120) -> None:
    problem = poll_ready(proc, lambda: httpx.get(url, timeout=2).status_code < 500, timeout)
    if problem:
        raise SystemExit(f"{proc.args} {problem} ({url})")


class Stack:
    """The fake API and ``frugal serve``, started in a temporary folder."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.db = folder / "ledger.db"
        api_port, self.port = free_port(), free_port()
        self.api = subprocess.Popen(
            [sys.executable, "-m", "tests.fake_api", "--port", str(api_port), "--latency", "0"],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_http(f"http://127.0.0.1:{api_port}/v1/models", self.api)
        config = folder / "frugal.toml"
        config.write_text(
            f'[server]\nport = {self.port}\nlog_format = "json"\n'
            f"[local]\nn_threads = 1\n"
            f'[fallback]\napi_base = "http://127.0.0.1:{api_port}/v1"\napi_key_env = ""\n'
            f'[ledger]\npath = "{self.db}"\n'
        )
        self.log = (folder / "serve.log").open("wb")
        env = {k: v for k, v in os.environ.items() if k != "FRUGAL_API_KEYS"}
        self.serve = subprocess.Popen(
            [FRUGAL, "serve", "--config", str(config)], stdout=self.log, stderr=self.log, env=env
        )
        self.base = f"http://127.0.0.1:{self.port}"
        wait_http(self.base + "/healthz", self.serve)

    def health(self) -> dict[str, object]:
        return dict(httpx.get(self.base + "/healthz", timeout=5).json())

    def stop(self) -> int:
        if self.serve.poll() is None:
            self.serve.send_signal(signal.SIGTERM)
            self.serve.wait(timeout=60)
        self.api.terminate()
        self.api.wait(timeout=10)
        self.log.close()
        return int(self.serve.returncode)

    def rows(self) -> set[str]:
        conn = sqlite3.connect(self.db)
        try:
            return {r[0] for r in conn.execute("SELECT request_id FROM requests")}
        finally:
            conn.close()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=60)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        stack = Stack(Path(tmp))
        load = Load(stack.base, args.clients)
        started = time.perf_counter()
        try:
            await load.run(args.seconds)
            elapsed = time.perf_counter() - started
            health = stack.health()["ledger"]
        finally:
            code = stack.stop()
        rows = stack.rows()
        sent = set(load.sent)
        print(
            f"{args.clients} clients, {args.seconds:g} s: {len(sent):,} requests sent "
            f"({len(sent) / elapsed:,.0f}/s), {len(load.completed):,} answered, "
            f"{load.errors} errors"
        )
        print(f"ledger before SIGTERM: {json.dumps(health)}")
        print(
            f"SIGTERM exit code {code}; rows {len(rows):,}; rows == requests: {rows == sent} "
            f"(missing {len(sent - rows)}, unknown {len(rows - sent)})"
        )
        if rows != sent or code != 0:
            raise SystemExit(1)


if __name__ == "__main__":
    asyncio.run(main())
