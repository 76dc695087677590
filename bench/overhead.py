"""API pass-through overhead: direct vs frugal vs LiteLLM proxy, side by side in one run.

    .venv/bin/python bench/overhead.py                      # 3 rounds of 8 s per cell
    .venv/bin/python bench/overhead.py --rounds 5 --window 10 --json /tmp/overhead.json
    git worktree add /tmp/before efff029 && git worktree add /tmp/after HEAD
    .venv/bin/python bench/overhead.py --targets direct,frugal-before,frugal-after \
        --tree before=/tmp/before --tree after=/tmp/after

What runs (all on loopback, started and stopped by this script):

- the upstream: ``bench/upstream_fast.py`` (raw asyncio, canned answers), or with
  ``--upstream fake`` the test suite's ``tests/fake_api.py`` (Starlette on uvicorn);
- ``direct``: wrk straight to the upstream;
- ``frugal``: a real ``frugal serve`` process (engine loaded, ledger on), every request forced to
  the API with ``x-frugal-route: api``, so it takes the direct aiohttp path;
- ``frugal-NAME``: the same from another checkout, ``--tree NAME=PATH`` (a ``git worktree`` of
  another commit, served with this venv), so that two commits are measured side by side;
- ``frugal-litellm``: a second ``frugal serve`` whose ``[fallback.models]`` maps the model to
  ``hosted_vllm/gpt-4o-mini``, so the same requests go through ``litellm.acompletion``;
- ``litellm``: LiteLLM proxy (``litellm --config bench/litellm_config.yaml``, 1 worker, no
  database, a random strong ``master_key``) from a separate venv, ``bench/.venv-litellm``,
  created with ``pip install 'litellm[proxy]'`` when it is missing.

Every cell (target x connections) is one wrk run of ``--window`` seconds. The wrk script stops
issuing requests at the end of the window and lets the ones in flight finish, so that the number
wrk completed is exactly the number the proxy served: the frugal ledger must then hold one row
per completed request, which is checked after each run. Requests per second = completed / window.
Rounds rotate the order of the targets; the tables show the median over rounds and the range.

With two or more CPUs the proxies are pinned to CPU 0 and the upstream and wrk to CPU 1
(``--no-pin`` turns that off), so the proxy under test has a core of its own; the machine may
still be shared with other work, which is why all targets are measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
PYTHON = sys.executable
FRUGAL = str(Path(sys.executable).with_name("frugal"))
LITELLM_VENV = BENCH / ".venv-litellm"
LITELLM_CONFIG = BENCH / "litellm_config.yaml"
UPSTREAM_KEY = "sk-bench-upstream-" + "0" * 16
MODEL = "gpt-4o-mini"
BODY = json.dumps(
    {
        "model": MODEL,
        "messages": [{"role": "user", "content": "What is the capital of France?"}],
        "max_tokens": 16,
    },
    separators=(",", ":"),
)
CLK_TCK = os.sysconf("SC_CLK_TCK")

LUA = r"""
wrk.method = "POST"
wrk.body = [==[BODY]==]
wrk.headers["content-type"] = "application/json"
HEADERS
local ffi = require("ffi")
ffi.cdef[[
typedef struct { long tv_sec; long tv_nsec; } bench_timespec;
int clock_gettime(int clk_id, bench_timespec *tp);
]]
local ts = ffi.new("bench_timespec")
local function now()
  ffi.C.clock_gettime(1, ts)
  return tonumber(ts.tv_sec) + tonumber(ts.tv_nsec) * 1e-9
end
local window = WINDOW
local first = nil
-- Called before every request: after the window, no new request is issued (the connection
-- idles until wrk's duration ends), so requests in flight complete and are counted.
function delay()
  local t = now()
  if first == nil then first = t end
  if t - first < window then return 0 end
  return 3600000
end
function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'RESULT {"requests":%d,"p50_us":%d,"p99_us":%d,"mean_us":%.1f,"max_us":%d,' ..
    '"connect":%d,"read":%d,"write":%d,"status":%d,"timeout":%d}\n',
    summary.requests, latency:percentile(50), latency:percentile(99), latency.mean, latency.max,
    e.connect, e.read, e.write, e.status, e.timeout))
end
"""


# -- processes -----------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pinned(cpus: str | None, argv: list[str]) -> list[str]:
    return ["taskset", "-c", cpus, *argv] if cpus else argv


def proc_tree_cpu_s(pid: int) -> float:
    """User + system CPU seconds of ``pid`` and every process descended from it."""
    children: dict[int, list[int]] = {}
    ticks: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                stat = handle.read()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        ppid = int(fields[1])
        children.setdefault(ppid, []).append(int(entry))
        ticks[int(entry)] = int(fields[11]) + int(fields[12])  # utime, stime
    total, todo = 0, [pid]
    while todo:
        current = todo.pop()
        total += ticks.get(current, 0)
        todo.extend(children.get(current, []))
    return total / CLK_TCK


@dataclass
class Server:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path

    def check_alive(self) -> None:
        if self.proc.poll() is not None:
            tail = self.log.read_text(errors="replace")[-3000:]
            raise SystemExit(f"{self.name} exited with {self.proc.returncode}:\n{tail}")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return int(self.proc.returncode)


def start(
    name: str, argv: list[str], tmp: Path, env: dict[str, str], ready: Callable[[], bool]
) -> Server:
    log = tmp / f"{name}.log"
    with log.open("wb") as sink:
        proc = subprocess.Popen(argv, stdout=sink, stderr=subprocess.STDOUT, env=env, cwd=tmp)
    server = Server(name, proc, log)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        server.check_alive()
        try:
            if ready():
                return server
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    server.stop()
    raise SystemExit(f"{name} did not become ready; see {log}")


def ok(url: str, headers: dict[str, str] | None = None) -> bool:
    return httpx.get(url, headers=headers, timeout=2).status_code == 200


@contextmanager
def upstream(kind: str, cpus: str | None, tmp: Path) -> Iterator[str]:
    port = free_port()
    if kind == "fast":
        argv = [PYTHON, str(BENCH / "upstream_fast.py"), "--port", str(port)]
    else:
        argv = [PYTHON, "-m", "tests.fake_api", "--port", str(port), "--latency", "0"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    base = f"http://127.0.0.1:{port}/v1"

    def ready() -> bool:
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
        return httpx.post(base + "/chat/completions", json=body, timeout=2).status_code == 200

    server = start(f"upstream-{kind}", pinned(cpus, argv), tmp, env, ready)
    try:
        yield base
    finally:
        server.stop()


def frugal_config(
    tmp: Path, name: str, base: str, port: int, models: dict[str, str], ledger_url: str = ""
) -> Path:
    mapping = "".join(f'"{k}" = "{v}"\n' for k, v in models.items())
    url_line = f'url = "{ledger_url}"' if ledger_url else ""
    config = tmp / f"{name}.toml"
    config.write_text(
        f"""
[server]
port = {port}
log_format = "json"

[local]
n_threads = 1

[fallback]
api_base = "{base}"
api_key_env = "BENCH_UPSTREAM_KEY"
max_retries = 1
timeout_s = 30

[fallback.models]
{mapping}
[ledger]
path = "{tmp / (name + ".db")}"
{url_line}
"""
    )
    return config


@contextmanager
def frugal(
    name: str,
    base: str,
    cpus: str | None,
    tmp: Path,
    models: dict[str, str],
    ledger_url: str = "",
    tree: Path | None = None,
) -> Iterator[tuple[str, Server, Path]]:
    """A ``frugal serve``; with ``tree``, the ``proxy/`` of that checkout (another commit's, in
    a ``git worktree``) on ``PYTHONPATH`` instead of this one's, run with this venv."""
    port = free_port()
    config = frugal_config(tmp, name, base, port, models, ledger_url)
    env = {
        **os.environ,
        "BENCH_UPSTREAM_KEY": UPSTREAM_KEY,
        "HOSTED_VLLM_API_BASE": base,
        "HOSTED_VLLM_API_KEY": UPSTREAM_KEY,
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    }
    if tree is not None:
        env["PYTHONPATH"] = str(tree)
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        health = httpx.get(url + "/healthz", timeout=2).json()
        # The ledger's token counter imports litellm on a thread at start-up (seconds of CPU):
        # measuring before it is done would measure that import.
        counter = health["ledger"].get("token_counter", "ready")
        return bool(health["engine"]["state"] == "ready" and counter != "loading")

    argv = [FRUGAL, "serve", "--config", str(config)]
    if tree is not None:
        argv = [PYTHON, "-m", "proxy", "serve", "--config", str(config)]
    server = start(name, pinned(cpus, argv), tmp, env, ready)
    try:
        yield url, server, tmp / (name + ".db")
    finally:
        code = server.stop()
        if code != 0:
            print(f"warning: {name} exited with {code}; see {server.log}", file=sys.stderr)


def runnable_tree(tree: Path) -> Path:
    """``tree`` made runnable from ``PYTHONPATH``: the SQL migrations install as
    ``proxy.migrations`` (pyproject's package-dir), so a link ``proxy/migrations`` to the tree's
    own ``migrations/`` is made, or the installed (newer) ones would be applied."""
    tree = tree.resolve()
    if not (tree / "proxy" / "__main__.py").is_file():
        raise SystemExit(f"--tree {tree}: no proxy/__main__.py there")
    link = tree / "proxy" / "migrations"
    if not link.exists():
        link.symlink_to(tree / "migrations", target_is_directory=True)
    return tree


def ensure_litellm_venv(venv: Path) -> Path:
    exe = venv / "bin" / "litellm"
    if not exe.exists():
        print(f"creating {venv} with pip install 'litellm[proxy]' ...", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "litellm[proxy]"], check=True)
    return exe


@contextmanager
def litellm_proxy(
    base: str, cpus: str | None, tmp: Path, venv: Path
) -> Iterator[tuple[str, Server, str]]:
    exe = ensure_litellm_venv(venv)
    port = free_port()
    master_key = "sk-" + secrets.token_urlsafe(32)
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "VIRTUAL_ENV")} | {
        "BENCH_UPSTREAM_BASE": base,
        "BENCH_UPSTREAM_KEY": UPSTREAM_KEY,
        "LITELLM_MASTER_KEY": master_key,
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "LITELLM_LOG": "ERROR",
    }
    url = f"http://127.0.0.1:{port}"
    argv = [str(exe), "--config", str(LITELLM_CONFIG), "--host", "127.0.0.1"]
    argv += ["--port", str(port), "--num_workers", "1"]
    server = start(
        "litellm-proxy",
        pinned(cpus, argv),
        tmp,
        env,
        lambda: ok(url + "/health/liveliness"),
    )
    try:
        yield url, server, master_key
    finally:
        server.stop()


# -- measuring -----------------------------------------------------------------------------------


@dataclass
class Target:
    name: str
    url: str
    headers: dict[str, str]
    server: Server | None = None
    ledger: Path | None = None
    health: str | None = None
    ledger_url: str = ""  # a PostgreSQL ledger, counted there instead of in ``ledger``


@dataclass
class Cell:
    target: str
    connections: int
    round: int
    requests: int
    errors: int
    p50_ms: float
    p99_ms: float
    rps: float
    cpu_ms_per_request: float | None = None
    ledger_rows: int | None = None
    ledger_failed_rows: int | None = None


@dataclass
class Run:
    cells: list[Cell] = field(default_factory=list)
    conditions: dict[str, Any] = field(default_factory=dict)


def lua_script(tmp: Path, target: Target, window: float) -> Path:
    headers = "\n".join(f'wrk.headers["{k}"] = "{v}"' for k, v in target.headers.items())
    text = LUA.replace("BODY", BODY).replace("HEADERS", headers).replace("WINDOW", str(window))
    path = tmp / f"{target.name}.lua"
    path.write_text(text)
    return path


def wrk(
    target: Target, connections: int, window: float, cpus: str | None, tmp: Path
) -> dict[str, Any]:
    script = lua_script(tmp, target, window)
    duration = int(window + 3)
    argv = ["wrk", "-t1", f"-c{connections}", f"-d{duration}s", "--timeout", "10s"]
    argv += ["-s", str(script), target.url + "/v1/chat/completions"]
    out = subprocess.run(pinned(cpus, argv), capture_output=True, text=True, check=False)
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            result: dict[str, Any] = json.loads(line[len("RESULT ") :])
            return result
    raise SystemExit(f"wrk gave no result for {target.name}:\n{out.stdout}\n{out.stderr}")


def ledger_rows(target: Target) -> tuple[int, int]:
    """(rows, rows with a non-200 status) once the ledger has written all it was handed."""
    assert target.ledger is not None and target.health is not None
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        ledger = httpx.get(target.health, timeout=5).json()["ledger"]
        if ledger["pending"] == 0:
            break
        time.sleep(0.05)
    time.sleep(0.3)  # the writer's last batch commits after it leaves the queue
    if target.ledger_url:
        import psycopg

        with psycopg.connect(target.ledger_url) as pg:
            found = pg.execute(
                "SELECT count(*), coalesce(sum(CASE WHEN status != 200 THEN 1 ELSE 0 END), 0)"
                " FROM requests"
            ).fetchone()
        assert found is not None
        return int(found[0]), int(found[1])
    conn = sqlite3.connect(f"file:{target.ledger}?mode=ro", uri=True)
    try:
        rows, failed = conn.execute(
            "SELECT count(*), coalesce(sum(status != 200), 0) FROM requests"
        ).fetchone()
    finally:
        conn.close()
    return int(rows), int(failed)


def measure(
    target: Target,
    connections: int,
    window: float,
    round_: int,
    cpus: str | None,
    tmp: Path,
) -> Cell:
    before_rows = ledger_rows(target) if target.ledger else None
    cpu_before = proc_tree_cpu_s(target.server.proc.pid) if target.server else None
    result = wrk(target, connections, window, cpus, tmp)
    cpu_after = proc_tree_cpu_s(target.server.proc.pid) if target.server else None
    errors = sum(result[k] for k in ("connect", "read", "write", "status", "timeout"))
    cell = Cell(
        target=target.name,
        connections=connections,
        round=round_,
        requests=result["requests"],
        errors=errors,
        p50_ms=result["p50_us"] / 1000,
        p99_ms=result["p99_us"] / 1000,
        rps=result["requests"] / window,
    )
    if cpu_before is not None and cpu_after is not None and result["requests"]:
        cell.cpu_ms_per_request = (cpu_after - cpu_before) * 1000 / result["requests"]
    if before_rows is not None:
        after_rows = ledger_rows(target)
        cell.ledger_rows = after_rows[0] - before_rows[0]
        cell.ledger_failed_rows = after_rows[1] - before_rows[1]
    return cell


# -- report --------------------------------------------------------------------------------------


def spread(values: list[float], fmt: str) -> str:
    mid = statistics.median(values)
    if len(values) == 1:
        return format(mid, fmt)
    return f"{format(mid, fmt)} ({format(min(values), fmt)}–{format(max(values), fmt)})"


def report(run: Run, names: list[str], connections: list[int]) -> str:
    cells = run.cells
    rounds = sorted({c.round for c in cells})

    def pick(name: str, conns: int) -> list[Cell]:
        return [c for c in cells if c.target == name and c.connections == conns]

    lines = [
        "| path | conns | median ms | p99 ms | req/s | errors | CPU ms/req | ledger rows"
        " / requests |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for conns in connections:
        for name in names:
            got = pick(name, conns)
            if not got:
                continue
            cpu = [c.cpu_ms_per_request for c in got if c.cpu_ms_per_request is not None]
            rows = (
                f"{sum(c.ledger_rows or 0 for c in got)} / {sum(c.requests for c in got)}"
                if got[0].ledger_rows is not None
                else "–"
            )
            lines.append(
                f"| {name} | {conns} | {spread([c.p50_ms for c in got], '.3f')} "
                f"| {spread([c.p99_ms for c in got], '.2f')} "
                f"| {spread([c.rps for c in got], ',.0f')} | {sum(c.errors for c in got)} "
                f"| {spread(cpu, '.3f') if cpu else '–'} | {rows} |"
            )
    lines.append("")

    def per_round(f: Callable[[int], float | None]) -> list[float]:
        return [v for r in rounds if (v := f(r)) is not None]

    def one(name: str, conns: int, r: int) -> Cell | None:
        return next((c for c in pick(name, conns) if c.round == r), None)

    def added(name: str, r: int) -> float | None:
        a, d = one(name, 1, r), one("direct", 1, r)
        return a.p50_ms - d.p50_ms if a and d else None

    def ratio(name: str, r: int) -> float | None:
        a, b = one(name, 16, r), one("litellm", 16, r)
        return a.rps / b.rps if a and b and b.rps else None

    for name in names:
        if name == "direct":
            continue
        if 1 in connections and (values := per_round(lambda r, n=name: added(n, r))):
            lines.append(
                f"- {name}: added median latency at 1 connection: {spread(values, '.3f')} ms"
            )
        if name != "litellm" and 16 in connections:
            values = per_round(lambda r, n=name: ratio(n, r))
            if values:
                lines.append(
                    f"- {name}: req/s at 16 connections ÷ LiteLLM proxy's: {spread(values, '.1f')}×"
                )
    bad = [c for c in cells if c.errors or (c.ledger_rows not in (None, c.requests))]
    bad += [c for c in cells if c.ledger_failed_rows]
    lines.append(
        "- every run: no errors, one ledger row per request"
        if not bad
        else f"- PROBLEMS in {len(bad)} runs: "
        + "; ".join(
            f"{c.target}/c{c.connections}/r{c.round}: errors={c.errors} "
            f"rows={c.ledger_rows} requests={c.requests} failed_rows={c.ledger_failed_rows}"
            for c in bad
        )
    )
    return "\n".join(lines)


# -- main ----------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--window", type=float, default=8.0, help="seconds of load per cell")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds per target, once")
    parser.add_argument("--connections", default="1,16")
    parser.add_argument("--upstream", choices=("fast", "fake"), default="fast")
    parser.add_argument(
        "--targets",
        default="direct,frugal,frugal-litellm,litellm",
        help="comma-separated; also frugal-pg (the proxy on a PostgreSQL ledger) and "
        "frugal-NAME for each --tree NAME=PATH",
    )
    parser.add_argument(
        "--tree",
        action="append",
        default=[],
        metavar="NAME=PATH",
        help="a checkout of some commit (git worktree add PATH REV): the frugal-NAME target "
        "serves its proxy/ with this venv; repeat it to compare commits side by side",
    )
    parser.add_argument("--litellm-venv", type=Path, default=LITELLM_VENV)
    parser.add_argument("--no-pin", action="store_true", help="do not pin processes to CPUs")
    parser.add_argument("--json", type=Path, help="also write every cell here")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    args = parser.parse_args(argv)

    if shutil.which("wrk") is None:
        raise SystemExit("wrk is missing: apt-get install -y wrk")
    names = [n.strip() for n in args.targets.split(",") if n.strip()]
    connections = [int(c) for c in args.connections.split(",")]
    multi = len(os.sched_getaffinity(0)) >= 2 and not args.no_pin
    proxy_cpus, load_cpus = ("0", "1") if multi else (None, None)
    tmp = Path(tempfile.mkdtemp(prefix="frugal-overhead-"))
    run = Run()
    run.conditions = {
        "cpus": os.cpu_count(),
        "pinned": multi,
        "upstream": args.upstream,
        "window_s": args.window,
        "rounds": args.rounds,
        "loadavg_start": os.getloadavg(),
        "python": sys.version.split()[0],
    }
    try:
        with ExitStack() as stack:
            base = stack.enter_context(upstream(args.upstream, load_cpus, tmp))
            direct_url = base.removesuffix("/v1")
            targets: dict[str, Target] = {
                "direct": Target("direct", direct_url, {"authorization": f"Bearer {UPSTREAM_KEY}"})
            }
            if "frugal" in names:
                url, server, db = stack.enter_context(frugal("frugal", base, proxy_cpus, tmp, {}))
                targets["frugal"] = Target(
                    "frugal", url, {"x-frugal-route": "api"}, server, db, url + "/healthz"
                )
            for spec in args.tree:
                label, _, path = spec.partition("=")
                name = f"frugal-{label}"
                if name not in names or not path:
                    raise SystemExit(f"--tree {spec}: expected NAME=PATH, and {name} in --targets")
                url, server, db = stack.enter_context(
                    frugal(name, base, proxy_cpus, tmp, {}, tree=runnable_tree(Path(path)))
                )
                targets[name] = Target(
                    name, url, {"x-frugal-route": "api"}, server, db, url + "/healthz"
                )
            if "frugal-pg" in names:
                # The same proxy on a PostgreSQL ledger (a real server in a temporary folder).
                sys.path.insert(0, str(ROOT))
                from tests import pg

                server_pg = stack.enter_context(pg.running())
                if server_pg is None:
                    raise SystemExit("frugal-pg needs PostgreSQL: apt-get install -y postgresql")
                pg_url = server_pg.database()
                url, server, db = stack.enter_context(
                    frugal("frugal-pg", base, proxy_cpus, tmp, {}, pg_url)
                )
                targets["frugal-pg"] = Target(
                    "frugal-pg", url, {"x-frugal-route": "api"}, server, db, url + "/healthz"
                )
                targets["frugal-pg"].ledger_url = pg_url
            if "frugal-litellm" in names:
                mapping = {MODEL: f"hosted_vllm/{MODEL}"}
                url, server, db = stack.enter_context(
                    frugal("frugal-litellm", base, proxy_cpus, tmp, mapping)
                )
                targets["frugal-litellm"] = Target(
                    "frugal-litellm", url, {"x-frugal-route": "api"}, server, db, url + "/healthz"
                )
            if "litellm" in names:
                url, server, key = stack.enter_context(
                    litellm_proxy(base, proxy_cpus, tmp, args.litellm_venv)
                )
                targets["litellm"] = Target(
                    "litellm", url, {"authorization": f"Bearer {key}"}, server
                )
            order = [n for n in names if n in targets]
            for name in order:  # warm-up: connection pools, caches, lazy imports
                cell = measure(targets[name], 16, args.warmup, 0, load_cpus, tmp)
                print(
                    f"warm-up {name}: {cell.requests} requests, {cell.errors} errors",
                    file=sys.stderr,
                )
                if cell.ledger_rows not in (None, cell.requests):
                    print(f"  ledger rows {cell.ledger_rows} != {cell.requests}", file=sys.stderr)
            for round_ in range(1, args.rounds + 1):
                shift = (round_ - 1) % len(order)
                rotated = order[shift:] + order[:shift]
                for conns in connections:
                    for name in rotated:
                        for server in (t.server for t in targets.values() if t.server):
                            server.check_alive()
                        cell = measure(targets[name], conns, args.window, round_, load_cpus, tmp)
                        run.cells.append(cell)
                        print(
                            f"round {round_} {name:>14} c={conns:<2} p50={cell.p50_ms:.3f}ms "
                            f"p99={cell.p99_ms:.2f}ms rps={cell.rps:,.0f} err={cell.errors} "
                            f"cpu/req={cell.cpu_ms_per_request or 0:.3f}ms "
                            f"rows={cell.ledger_rows}",
                            file=sys.stderr,
                        )
        run.conditions["loadavg_end"] = os.getloadavg()
        print(report(run, order, connections))
        print(f"\nconditions: {json.dumps(run.conditions)}")
        if args.json:
            args.json.write_text(
                json.dumps(
                    {"conditions": run.conditions, "cells": [c.__dict__ for c in run.cells]},
                    indent=1,
                )
            )
    finally:
        if args.keep:
            print(f"kept {tmp}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
