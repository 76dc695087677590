"""Time to first token of a stream through a remote backend, against calling that backend
directly, in one run (issue 28).

    .venv/bin/python bench/remote_stream.py                 # 8 rounds of 64 tokens
    .venv/bin/python bench/remote_stream.py --rounds 12 --max-tokens 128

The backend is ``python -m llama_cpp.server`` (llama-cpp-python's own server, 1 thread) serving
the bundled SmolLM2, started as the tests start it (``tests/llama_cpp_server.py``). In front of
it run two ``frugal serve`` processes, each with that server as its only fast backend
(``kind = "llama-cpp-python"``, assumed rates that make it every request's first choice) and the
quality gate at 0: one with ``[router] stream_mode = "live"``, one with ``"verify"``. Each round
streams one chat request to each of the three (the order rotating), one at a time, and notes
when the first content byte and the last event came.

Printed: per path, the median and max time to the first content token, the median time to the
last one and to the end (``[DONE]``: the proxy scores the answer before its finish event), and
the rows' backend (every answer must come from the server, else the figures compare nothing).
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import httpx  # noqa: E402

from bench.overhead_servers import FRUGAL, Server, free_port, start  # noqa: E402
from tests import llama_cpp_server  # noqa: E402

STORY = [{"role": "user", "content": "Write a long story about a dragon."}]


def serve(tmp: Path, name: str, mode: str, api_base: str) -> tuple[Server, str, Path]:
    port = free_port()
    folder = tmp / name
    folder.mkdir()
    db = folder / "ledger.db"
    (folder / "frugal.toml").write_text(
        f"""
[server]
port = {port}
log_format = "json"
api_keys_env = ""

[local]
n_threads = 1

[[local.backends]]
name = "srv"
kind = "llama-cpp-python"
api_base = "{api_base}"
prefill_tok_s = 1000000.0
decode_tok_s = 1000000.0

[fallback]
api_base = ""
api_key_env = ""

[router]
stream_mode = "{mode}"

[quality]
threshold = 0.0

[audit]
rate = 0

[ledger]
path = "{db}"
"""
    )
    base = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        health = httpx.get(base + "/healthz", timeout=2).json()
        backends = health.get("routing", {}).get("backends", [])
        return any(b["name"] == "srv" and b["state"] == "up" for b in backends)

    argv = [FRUGAL, "serve", "--config", str(folder / "frugal.toml")]
    env = {"PATH": os.environ["PATH"], "HOME": str(folder), "PYTHONPATH": str(ROOT)}
    env["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
    return start(name, argv, folder, env, ready), base + "/v1", db


def one(api_base: str, max_tokens: int) -> tuple[float, float, float]:
    """Seconds to the first content token, to the last, and to the stream's end."""
    body = {
        "model": "gpt-4o-mini",
        "messages": STORY,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
    }
    started = time.perf_counter()
    first = last = None
    with httpx.stream("POST", api_base + "/chat/completions", json=body, timeout=120) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith("data: {") and '"content"' in line:
                event = json.loads(line[6:])
                if any((c.get("delta") or {}).get("content") for c in event["choices"]):
                    last = time.perf_counter() - started
                    first = last if first is None else first
    end = time.perf_counter() - started
    return (first or end), (last or end), end


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="frugal-remote-stream-") as tmp_name:
        tmp = Path(tmp_name)
        backend = llama_cpp_server.start(tmp)
        servers: list[Server] = []
        try:
            live, live_base, live_db = serve(tmp, "live", "live", backend.api_base)
            servers.append(live)
            verify, verify_base, verify_db = serve(tmp, "verify", "verify", backend.api_base)
            servers.append(verify)
            paths = {"direct": backend.api_base, "live": live_base, "verify": verify_base}
            for base in paths.values():
                one(base, 8)  # warm-up, not counted
            times: dict[str, list[tuple[float, float, float]]] = {name: [] for name in paths}
            names = list(paths)
            for i in range(args.rounds):
                for name in names[i % 3 :] + names[: i % 3]:
                    times[name].append(one(paths[name], args.max_tokens))
            for name, db in (("live", live_db), ("verify", verify_db)):
                conn = sqlite3.connect(db)
                where = conn.execute("SELECT backend, route, count(*) FROM requests GROUP BY 1, 2")
                print(f"{name} rows (backend, route, n): {where.fetchall()}")
                conn.close()
        finally:
            for server in servers:
                server.stop()
            backend.stop()
    print(f"{args.rounds} rounds, {args.max_tokens} tokens, one request at a time")
    print(f"{'path':8} {'first token p50':>16} {'max':>8} {'last token p50':>15} {'end p50':>9}")
    for name, runs in times.items():
        firsts, lasts, ends = ([run[i] for run in runs] for i in range(3))
        print(
            f"{name:8} {statistics.median(firsts) * 1000:13.0f} ms {max(firsts) * 1000:5.0f} ms"
            f" {statistics.median(lasts) * 1000:12.0f} ms {statistics.median(ends) * 1000:6.0f} ms"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
