"""Helpers of the fault matrix (``tests/test_faults.py``) and the soak run (``bench/soak.py``).

- :func:`launch` (and :func:`wait_ready`): a real ``frugal serve`` subprocess on a free loopback
  port, with a config built from nested dicts (:func:`toml_of`) and an environment of our own;
  the returned :class:`~tests.server.test_serve.Served` is the one ``tests/server/test_serve.py``
  uses.
- :func:`rss_bytes` and :class:`RssWatch`: a process's resident memory from
  ``/proc/<pid>/status`` (``VmRSS``), sampled in a thread that keeps the peak and, past a hard
  cap, SIGKILLs the process so that a memory bomb cannot take the whole machine down.
- :class:`HealthPoller`: ``GET /healthz`` in a loop, counting failures and keeping latencies.
- :func:`ledger_rows` / :func:`wait_rows`: the ledger's rows, read from its SQLite file.
- :func:`start_batch`, :func:`batch_of` and :func:`file_lines`: a batch made, read and its
  output or error file read back through the proxy's own Files and Batch APIs.

The listener that counts the connections made to it (where a request must never go) is
:class:`tests.loopback.Listener`.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sqlite3
import subprocess
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import httpx

from tests.conftest import FAKE_KEY, FAKE_KEY_ENV
from tests.fake_api import FakeAPI
from tests.load_factor import CEILING_S, scaled
from tests.loopback import OnThread, free_port, poll_ready, terminate
from tests.server.test_serve import FRUGAL, Served

READY_S = CEILING_S
"""Longest wait for a server's engine to be ready: the wait ends when /healthz says so, or the
process exits; this ceiling is for a server that hangs (2 cores shared by many test runs)."""


# -- config ---------------------------------------------------------------------------------------


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    raise TypeError(f"no TOML for {type(value).__name__}")


def toml_of(config: Mapping[str, Any], prefix: str = "") -> str:
    """TOML text for nested dicts: tables, and lists of dicts as arrays of tables."""
    lines: list[str] = []
    tables: list[tuple[str, Mapping[str, Any]]] = []
    arrays: list[tuple[str, list[Mapping[str, Any]]]] = []
    for key, value in config.items():
        name = f"{prefix}.{json.dumps(key)}" if prefix else json.dumps(key)
        if isinstance(value, Mapping):
            tables.append((name, value))
        elif isinstance(value, list) and value and all(isinstance(v, Mapping) for v in value):
            arrays.append((name, value))
        else:
            lines.append(f"{json.dumps(key)} = {_value(value)}")
    out = "\n".join(lines) + ("\n" if lines else "")
    for name, table in tables:
        out += f"\n[{name}]\n" + toml_of(table, name)
    for name, items in arrays:
        for item in items:
            out += f"\n[[{name}]]\n" + toml_of(item, name)
    return out


def merge(base: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``extra`` merged in, table by table (a copy)."""
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def base_config(port: int, db: Path, api: FakeAPI | None) -> dict[str, Any]:
    """What every fault server has: keyless loopback, one engine thread running one request at
    a time (row 9 queues a request behind another), the fake API upstream, no audits."""
    return {
        "server": {"host": "127.0.0.1", "port": port, "log_format": "json", "api_keys_env": ""},
        "local": {"n_threads": 1, "timeout_s": 30.0, "parallel": 1},
        "fallback": (
            {
                "api_base": api.url,
                "api_key_env": FAKE_KEY_ENV,
                "max_retries": 1,
                "timeout_s": 5.0,
                "connect_timeout_s": 2.0,
            }
            if api is not None
            else {"api_base": "", "api_key_env": ""}
        ),
        "router": {"predictive": False},
        # No shadow audits: a random 2% of extra shadow or judge calls would blur what a fault
        # row counts upstream.
        "audit": {"rate": 0.0},
        "ledger": {"path": str(db), "flush_interval_s": 0.05},
    }


def server_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "FRUGAL_API_KEYS"}
    env.update({FAKE_KEY_ENV: FAKE_KEY, "LITELLM_LOCAL_MODEL_COST_MAP": "True"})
    env.update(extra or {})
    return env


# -- the server process ---------------------------------------------------------------------------


def launch(
    tmp: Path,
    api: FakeAPI | None,
    *,
    config: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    db: Path | None = None,
) -> Served:
    """Start ``frugal serve`` (not waiting for it): config and log in ``tmp``, the ledger at
    ``db`` (default ``tmp/ledger.db``); ``config`` is merged over :func:`base_config`."""
    port = free_port()
    db = db or tmp / "ledger.db"
    path = tmp / "frugal.toml"
    path.write_text(toml_of(merge(base_config(port, db, api), config or {})))
    log = tmp / "serve.log"
    with log.open("w") as sink:
        proc = subprocess.Popen(
            [FRUGAL, "serve", "--config", str(path)],
            stdout=sink,
            stderr=subprocess.STDOUT,
            env=server_env(env),
            text=True,
        )
    return Served(proc, f"http://127.0.0.1:{port}", path, db, log)


def wait_ready(served: Served, timeout_s: float = READY_S) -> Served:
    """Wait until /healthz says the engine is ready; the log is in the error if it never is."""
    problem = poll_ready(served.proc, served.engine_ready, timeout_s)
    if problem:
        raise AssertionError(f"frugal serve {problem}:\n{tail(served.log)}")
    return served


def stop(served: Served, timeout_s: float = 40.0) -> int | None:
    """SIGTERM, then SIGKILL after ``timeout_s``; the exit status (None if it had to be killed)."""
    return terminate(served.proc, timeout_s)


def read_events(sock: socket.socket, count: int) -> bytes:
    """Read an SSE answer from ``sock`` until ``count`` events (``data:`` lines) are in, or the
    server closes; what was read."""
    got = b""
    while got.count(b"data:") < count:
        chunk = sock.recv(65536)
        if not chunk:
            break
        got += chunk
    return got


def tail(path: Path, chars: int = 4000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return "(no log)"


def engine_pid(served: Served) -> int | None:
    pid = served.health()["engine"].get("pid")
    return int(pid) if pid else None


# -- memory ---------------------------------------------------------------------------------------


def rss_bytes(pid: int) -> int | None:
    """Resident memory of ``pid`` (``VmRSS``), or None once it has gone."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


MB = 1024 * 1024


class RssWatch(OnThread):
    """Samples the RSS of some pids every ``every_s`` in a thread, keeping each one's peak.

    A pid whose RSS passes ``kill_above`` bytes is SIGKILLed (and listed in ``killed``): a fault
    that really allocates gigabytes must fail its test, not take the shared machine down.
    """

    def __init__(
        self, pids: Iterable[int | None], *, every_s: float = 0.02, kill_above: int = 3072 * MB
    ) -> None:
        super().__init__("rss-watch")
        self.pids = [p for p in pids if p]
        self.every_s = every_s
        self.kill_above = kill_above
        self.start_rss = {p: rss_bytes(p) or 0 for p in self.pids}
        self.peak = dict(self.start_rss)
        self.killed: list[int] = []

    def _run(self) -> None:
        while not self._stop.is_set():
            for pid in self.pids:
                rss = rss_bytes(pid)
                if rss is None:
                    continue
                self.peak[pid] = max(self.peak[pid], rss)
                if rss > self.kill_above and pid not in self.killed:
                    self.killed.append(pid)
                    os.kill(pid, signal.SIGKILL)
            self._stop.wait(self.every_s)

    def growth(self, pid: int | None) -> int:
        """Peak minus the RSS at the start, in bytes (0 for an unknown pid)."""
        return self.peak.get(pid, 0) - self.start_rss.get(pid, 0) if pid else 0


# -- health ---------------------------------------------------------------------------------------


class HealthPoller(OnThread):
    """``GET /healthz`` back to back while it runs, each with a client timeout of ``timeout_s``
    times the load factor: a bound the rows keep ("never fails"), scaled to a busy machine."""

    def __init__(self, base: str, *, timeout_s: float = 5.0, pause_s: float = 0.05) -> None:
        super().__init__("health-poller")
        self.base = base
        self.timeout_s = scaled(timeout_s)
        self.join_s = self.timeout_s + 5  # a request under way ends first
        self.pause_s = pause_s
        self.latencies: list[float] = []
        self.failures: list[str] = []
        self.bodies: list[dict[str, Any]] = []

    def _run(self) -> None:
        with httpx.Client(timeout=self.timeout_s) as client:
            while not self._stop.is_set():
                started = time.perf_counter()
                try:
                    response = client.get(self.base + "/healthz")
                    self.latencies.append(time.perf_counter() - started)
                    if response.status_code >= 500 and response.status_code != 503:
                        self.failures.append(f"HTTP {response.status_code}")
                    else:
                        self.bodies.append(response.json())
                except (httpx.HTTPError, ValueError) as exc:
                    self.failures.append(type(exc).__name__)
                self._stop.wait(self.pause_s)

    @property
    def max_ms(self) -> float:
        return round(max(self.latencies, default=0.0) * 1000, 1)


def wait_idle(served: Served, timeout_s: float = CEILING_S) -> float | None:
    """Seconds until /healthz shows the engine neither busy nor queueing, None if it never did."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        try:
            engine = served.health()["engine"]
            if not engine.get("busy") and not engine.get("queue_depth"):
                return time.monotonic() - started
        except (httpx.HTTPError, KeyError, ValueError):
            pass
        time.sleep(0.02)
    return None


# -- the ledger -----------------------------------------------------------------------------------


def ledger_rows(db: Path, where: str = "1", params: Iterable[Any] = ()) -> list[dict[str, Any]]:
    """Rows of ``requests`` matching ``where``, as dicts, in the order they were written
    (read-only; [] without a file)."""
    if not db.exists():
        return []
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)
    conn.row_factory = sqlite3.Row
    try:
        rows = conn.execute(
            f"SELECT * FROM requests WHERE {where} ORDER BY id", tuple(params)
        ).fetchall()
    finally:
        conn.close()
    return [dict(r) for r in rows]


def rows_for(db: Path, request_id: str) -> list[dict[str, Any]]:
    return ledger_rows(db, "request_id = ?", (request_id,))


def wait_rows(db: Path, request_id: str, *, timeout_s: float = CEILING_S) -> list[dict[str, Any]]:
    """The rows of ``request_id`` once there is one, and a moment more (a second would show)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        rows = rows_for(db, request_id)
        if rows:
            time.sleep(0.5)
            return rows_for(db, request_id)
        time.sleep(0.05)
    return []


def columns(db: Path) -> set[str]:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)
    try:
        return {str(r[1]) for r in conn.execute("PRAGMA table_info(requests)")}
    finally:
        conn.close()


def spilled_text(db: Path) -> str:
    """Everything in the files next to the ledger where rows that could not be written are put
    aside (``*.rejected.jsonl``, ``*spill*``), or ''."""
    found: list[Path] = []
    for pattern in ("*.rejected.jsonl", "*.rejected*", "*spill*", "*.jsonl"):
        found.extend(p for p in db.parent.glob(pattern) if p.is_file() and p not in found)
    return "".join(p.read_text(errors="replace") for p in found)


# -- the Batch API --------------------------------------------------------------------------------


def start_batch(served: Served, lines: Iterable[Mapping[str, Any]]) -> str:
    """Uploads ``lines`` as one JSONL file (``POST /v1/files``, purpose ``batch``) and makes a
    chat batch of it with a 24 h window (``POST /v1/batches``); the batch's id."""
    content = "".join(json.dumps(line) + "\n" for line in lines).encode()
    uploaded = httpx.post(
        served.base + "/v1/files",
        data={"purpose": "batch"},
        files={"file": ("in.jsonl", content, "application/jsonl")},
        timeout=30,
    )
    assert uploaded.status_code == 200, uploaded.text
    made = httpx.post(
        served.base + "/v1/batches",
        json={
            "input_file_id": uploaded.json()["id"],
            "endpoint": "/v1/chat/completions",
            "completion_window": "24h",
        },
        timeout=30,
    )
    assert made.status_code == 200, made.text
    return str(made.json()["id"])


def batch_of(served: Served, batch_id: str) -> dict[str, Any]:
    """``GET /v1/batches/{batch_id}``: the batch as it stands."""
    reply = httpx.get(f"{served.base}/v1/batches/{batch_id}", timeout=30)
    assert reply.status_code == 200, reply.text
    return dict(reply.json())


def file_lines(served: Served, file_id: str | None) -> list[dict[str, Any]]:
    """The lines of a batch's output or error file (``GET /v1/files/{id}/content``); [] for a
    file the batch has not got."""
    if file_id is None:
        return []
    reply = httpx.get(f"{served.base}/v1/files/{file_id}/content", timeout=30)
    assert reply.status_code == 200, reply.text
    return [json.loads(x) for x in reply.text.splitlines()]
