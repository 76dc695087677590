"""The measuring half of ``bench/overhead.py``: one wrk run per cell (a Lua script that stops
issuing requests at the end of the window and lets those in flight finish), the CPU the server
used over it, the ledger rows it wrote for that endpoint, and the report's tables and lines.

An endpoint is ``chat`` (``POST /v1/chat/completions``) or ``responses`` (``POST /v1/responses``,
``input`` a short string and ``max_output_tokens``; ``store`` left to its default, true, unless
``--no-store``): the same question either way. ``chat-stream`` and ``responses-stream`` are the
same bodies with ``"stream": true`` (wrk times each until its last event).
"""

from __future__ import annotations

import json
import sqlite3
import statistics
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from overhead_servers import MODEL, Server, pinned, proc_tree_cpu_s

QUESTION = "What is the capital of France?"
# endpoint -> (the path wrk posts to, the ledger's ``endpoint`` for its rows)
ENDPOINTS = {
    "chat": ("/v1/chat/completions", "chat.completions"),
    "responses": ("/v1/responses", "responses"),
    "chat-stream": ("/v1/chat/completions", "chat.completions"),
    "responses-stream": ("/v1/responses", "responses"),
}
UPSTREAM_KINDS = ("chat", "responses")


def upstream_kind(endpoint: str) -> str:
    """``chat`` or ``responses``: the upstream endpoint that ``direct`` posts to."""
    return endpoint.removesuffix("-stream")


def body(endpoint: str, store: bool = True) -> str:
    """The request body wrk posts to ``endpoint``; ``store`` only applies to Responses."""
    payload: dict[str, Any]
    if upstream_kind(endpoint) == "chat":
        payload = {
            "model": MODEL,
            "messages": [{"role": "user", "content": QUESTION}],
            "max_tokens": 16,
        }
    else:
        payload = {"model": MODEL, "input": QUESTION, "max_output_tokens": 16}
        if not store:
            payload["store"] = False
    if endpoint.endswith("-stream"):
        payload["stream"] = True
    return json.dumps(payload, separators=(",", ":"))


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
    endpoint: str = "chat"


@dataclass(frozen=True)
class Load:
    """One cell's load: ``connections`` kept busy for ``window`` seconds by wrk (pinned to
    ``cpus``, its script in ``tmp``), on ``endpoint``, with ``store`` for the Responses API."""

    connections: int
    window: float
    cpus: str | None
    tmp: Path
    endpoint: str = "chat"
    store: bool = True


@dataclass
class Run:
    cells: list[Cell] = field(default_factory=list)
    conditions: dict[str, Any] = field(default_factory=dict)


def lua_script(tmp: Path, target: Target, window: float, request_body: str, endpoint: str) -> Path:
    headers = "\n".join(f'wrk.headers["{k}"] = "{v}"' for k, v in target.headers.items())
    text = LUA.replace("BODY", request_body).replace("HEADERS", headers)
    text = text.replace("WINDOW", str(window))
    path = tmp / f"{target.name}-{endpoint}.lua"
    path.write_text(text)
    return path


def wrk(target: Target, load: Load) -> dict[str, Any]:
    endpoint = load.endpoint
    script = lua_script(load.tmp, target, load.window, body(endpoint, load.store), endpoint)
    duration = int(load.window + 3)
    argv = ["wrk", "-t1", f"-c{load.connections}", f"-d{duration}s", "--timeout", "10s"]
    argv += ["-s", str(script), target.url + ENDPOINTS[endpoint][0]]
    out = subprocess.run(pinned(load.cpus, argv), capture_output=True, text=True, check=False)
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            result: dict[str, Any] = json.loads(line[len("RESULT ") :])
            return result
    raise SystemExit(f"wrk gave no result for {target.name}:\n{out.stdout}\n{out.stderr}")


def ledger_rows(target: Target, endpoint: str = "chat") -> tuple[int, int]:
    """(rows, rows with a non-200 status) of ``endpoint`` once the ledger has written all it
    was handed."""
    kind = ENDPOINTS[endpoint][1]
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
                " FROM requests WHERE endpoint = %s",
                (kind,),
            ).fetchone()
        assert found is not None
        return int(found[0]), int(found[1])
    conn = sqlite3.connect(f"file:{target.ledger}?mode=ro", uri=True)
    try:
        rows, failed = conn.execute(
            "SELECT count(*), coalesce(sum(status != 200), 0) FROM requests WHERE endpoint = ?",
            (kind,),
        ).fetchone()
    finally:
        conn.close()
    return int(rows), int(failed)


def measure(target: Target, load: Load, round_: int) -> Cell:
    endpoint = load.endpoint
    before_rows = ledger_rows(target, endpoint) if target.ledger else None
    cpu_before = proc_tree_cpu_s(target.server.proc.pid) if target.server else None
    result = wrk(target, load)
    cpu_after = proc_tree_cpu_s(target.server.proc.pid) if target.server else None
    errors = sum(result[k] for k in ("connect", "read", "write", "status", "timeout"))
    cell = Cell(
        target=target.name,
        connections=load.connections,
        round=round_,
        requests=result["requests"],
        errors=errors,
        p50_ms=result["p50_us"] / 1000,
        p99_ms=result["p99_us"] / 1000,
        rps=result["requests"] / load.window,
        endpoint=endpoint,
    )
    if cpu_before is not None and cpu_after is not None and result["requests"]:
        cell.cpu_ms_per_request = (cpu_after - cpu_before) * 1000 / result["requests"]
    if before_rows is not None:
        after_rows = ledger_rows(target, endpoint)
        cell.ledger_rows = after_rows[0] - before_rows[0]
        cell.ledger_failed_rows = after_rows[1] - before_rows[1]
    return cell


# -- report --------------------------------------------------------------------------------------


def spread(values: list[float], fmt: str) -> str:
    mid = statistics.median(values)
    if len(values) == 1:
        return format(mid, fmt)
    return f"{format(mid, fmt)} ({format(min(values), fmt)}–{format(max(values), fmt)})"


def report(
    run: Run, names: list[str], connections: list[int], endpoints: tuple[str, ...] = ("chat",)
) -> str:
    cells = run.cells
    rounds = sorted({c.round for c in cells})
    both = len(endpoints) > 1

    def pick(name: str, conns: int, endpoint: str = "chat") -> list[Cell]:
        return [
            c
            for c in cells
            if c.target == name and c.connections == conns and c.endpoint == endpoint
        ]

    lines = [
        f"| path |{' endpoint |' if both else ''} conns | median ms | p99 ms | req/s | errors"
        " | CPU ms/req | ledger rows / requests |",
        f"|---|{'---|' if both else ''}---:|---:|---:|---:|---:|---:|---|",
    ]
    for conns in connections:
        for endpoint in endpoints:
            for name in names:
                got = pick(name, conns, endpoint)
                if not got:
                    continue
                cpu = [c.cpu_ms_per_request for c in got if c.cpu_ms_per_request is not None]
                rows = (
                    f"{sum(c.ledger_rows or 0 for c in got)} / {sum(c.requests for c in got)}"
                    if got[0].ledger_rows is not None
                    else "–"
                )
                lines.append(
                    f"| {name} |{f' {endpoint} |' if both else ''} {conns} "
                    f"| {spread([c.p50_ms for c in got], '.3f')} "
                    f"| {spread([c.p99_ms for c in got], '.2f')} "
                    f"| {spread([c.rps for c in got], ',.0f')} | {sum(c.errors for c in got)} "
                    f"| {spread(cpu, '.3f') if cpu else '–'} | {rows} |"
                )
    lines.append("")

    def per_round(f: Callable[[int], float | None]) -> list[float]:
        return [v for r in rounds if (v := f(r)) is not None]

    def one(name: str, conns: int, r: int, endpoint: str = "chat") -> Cell | None:
        return next((c for c in pick(name, conns, endpoint) if c.round == r), None)

    def added(name: str, r: int, conns: int = 1, endpoint: str = "chat") -> float | None:
        a, d = one(name, conns, r, endpoint), one("direct", conns, r, endpoint)
        return a.p50_ms - d.p50_ms if a and d else None

    def ratio(name: str, r: int) -> float | None:
        a, b = one(name, 16, r), one("litellm", 16, r)
        return a.rps / b.rps if a and b and b.rps else None

    for pair in (("chat", "responses"), ("chat-stream", "responses-stream")):
        if pair[0] in endpoints and pair[1] in endpoints:
            lines += side_by_side(names, connections, per_round, added, pair)
    for name in names:
        if name == "direct":
            continue
        label = f"{name} (chat)" if both else name
        if 1 in connections and (values := per_round(lambda r, n=name: added(n, r))):
            lines.append(
                f"- {label}: added median latency at 1 connection: {spread(values, '.3f')} ms"
            )
        if name != "litellm" and 16 in connections:
            values = per_round(lambda r, n=name: ratio(n, r))
            if values:
                lines.append(
                    f"- {label}: req/s at 16 connections ÷ LiteLLM proxy's: "
                    f"{spread(values, '.1f')}×"
                )
    bad = [c for c in cells if c.errors or (c.ledger_rows not in (None, c.requests))]
    bad += [c for c in cells if c.ledger_failed_rows]
    lines.append(
        "- every run: no errors, one ledger row per request (of its endpoint)"
        if not bad
        else f"- PROBLEMS in {len(bad)} runs: "
        + "; ".join(
            f"{c.target}/{c.endpoint}/c{c.connections}/r{c.round}: errors={c.errors} "
            f"rows={c.ledger_rows} requests={c.requests} failed_rows={c.ledger_failed_rows}"
            for c in bad
        )
    )
    return "\n".join(lines)


def side_by_side(
    names: list[str],
    connections: list[int],
    per_round: Callable[[Callable[[int], float | None]], list[float]],
    added: Callable[[str, int, int, str], float | None],
    pair: tuple[str, str] = ("chat", "responses"),
) -> list[str]:
    """Per proxy and connection count: the added median latency (proxy minus direct, same
    endpoint, same round) of chat and of Responses (``pair``: streamed or not), and Responses'
    ÷ chat's, median over rounds (range)."""
    first, second = pair
    lines = [
        f"| path | conns | added ms, {first} | added ms, {second} | {second} ÷ {first} |",
        "|---|---:|---:|---:|---:|",
    ]
    for name in names:
        if name == "direct":
            continue
        for conns in connections:

            def of_chat(r: int, n: str = name, c: int = conns) -> float | None:
                return added(n, r, c, first)

            def of_responses(r: int, n: str = name, c: int = conns) -> float | None:
                return added(n, r, c, second)

            def quotient(r: int) -> float | None:
                a, b = of_responses(r), of_chat(r)
                return a / b if a is not None and b else None

            chat, resp, ratios = per_round(of_chat), per_round(of_responses), per_round(quotient)
            if not chat or not resp:
                continue
            lines.append(
                f"| {name} | {conns} | {spread(chat, '.3f')} | {spread(resp, '.3f')} "
                f"| {spread(ratios, '.2f') + '×' if ratios else '–'} |"
            )
    return [*lines, ""] if len(lines) > 2 else []
