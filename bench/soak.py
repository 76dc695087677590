"""Soak run: N minutes of mixed traffic against a real ``frugal serve`` with the fake API upstream.

    .venv/bin/python bench/soak.py --minutes 30 --out soak-30

The traffic, from ``--clients`` threads, each request picked at random: local answers, API
answers, local and API streams, clients that leave mid-request (injected), bad input (invalid
JSON, a wrong type, an unknown model: each must be a 4xx) and, every ``--kill-every`` seconds,
a SIGKILL of the engine worker (injected). Every request carries its own ``x-request-id``.

The server is keyed, as a shared one is (issue 24): the traffic comes with a client key, and
the tenants' attacks are in the mix too: 400 KB of ``functions`` from a key with a $0.001
budget (must be a 429 before any upstream call: ``over_budget``), an API stream cut after three
chunks (``cut_stream``: its row must be there, charged), a tool of 20,000 properties
(``wide_schema``: a 200, checked off the event loop), a body that stops after its first bytes
and is dropped (``stalled_body``: a 499 row), and the client key's own report (``own_report``:
a 200 that names no other key; a report has no ledger row). An admin key reads ``/healthz``.
Issue 39's attacks join them: 400 KB in an assistant ``refusal`` part and 200 prompts on
``/v1/completions`` from the $0.001 key (``refusal_burst``, ``prompt_list``: 429s, however the local
model counted them), and a 400 KB message ``name``, a 7.5 MB ``user`` and a lone surrogate on
``/v1/responses`` (``name_burst``, ``big_user``, ``surrogate``: 4xx, past the free-text bounds).

Reported (``summary.json`` and ``summary.md`` in ``--out``):

- the RSS of the proxy and of the engine worker, sampled every ``--sample-s`` seconds;
- requests sent and ledger rows, by request id: ids with no row and ids with more than one;
- the 5xx answers, split into injected ones (a request that overlapped a worker kill, until the
  engine was ready again) and the others, which must be 0;
- 4xx answers to good requests and good answers to bad input (both must be 0).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import secrets
import signal
import socket
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from proxy.ledger.tenants import keys as keys_mod  # noqa: E402
from tests.fake_api import FakeAPI  # noqa: E402
from tests.faults_support import (  # noqa: E402
    MB,
    engine_pid,
    launch,
    ledger_rows,
    read_events,
    rss_bytes,
    stop,
    wait_ready,
)
from tests.server.test_serve import QUESTION, Served  # noqa: E402

KINDS = {  # kind: weight
    "local": 3,
    "api": 4,
    "local_stream": 2,
    "api_stream": 3,
    "disconnect": 1,
    "bad_json": 1,
    "bad_type": 1,
    "bad_model": 1,
    "over_budget": 1,
    "cut_stream": 1,
    "wide_schema": 1,
    "stalled_body": 1,
    "own_report": 1,
    "refusal_burst": 1,
    "name_burst": 1,
    "prompt_list": 1,
    "big_user": 1,
    "surrogate": 1,
}
# each must be a 4xx: issue 39's kinds are a 7.5 MB `user` and a lone surrogate on
# /v1/responses, and a 400 KB message `name` (past the free-text bounds)
BAD = {"bad_json", "bad_type", "bad_model", "big_user", "surrogate", "name_burst"}
# each must be a 429 insufficient_quota from the $0.001 key, before any upstream call: issue 39's
# are 400 KB in an assistant `refusal` part with a certain fallback (`x-frugal-min-quality: 1`,
# reserved from the body sent, not the local count) and 200 prompts on /v1/completions
REFUSED = {"over_budget", "refusal_burst", "prompt_list"}
DROPPED = {"disconnect", "cut_stream", "stalled_body"}  # the client leaves: no status to check
NO_ROW = {"own_report"}  # not a model request: no ledger row
WIDE_TOOL = [
    {
        "type": "function",
        "function": {
            "name": "wide",
            "parameters": {
                "type": "object",
                "properties": {f"p{i}": {"type": "string"} for i in range(20_000)},
            },
        },
    }
]
BIG_FUNCTIONS = [
    {"name": f"f{i}", "description": "d" * 2000, "parameters": {"type": "object"}}
    for i in range(200)
]
BIG_REFUSAL = [
    {"role": "user", "content": "Say hi."},
    {"role": "assistant", "content": [{"type": "refusal", "refusal": "no " * 133_000}]},
    {"role": "user", "content": "Say hi again."},
]
BIG_NAME = [{"role": "user", "name": "n" * 400_000, "content": "Say hi."}]
PROMPTS = [f"Write a haiku about the number {i}." for i in range(200)]
BIG_USER = "u" * 7_500_000
# a lone surrogate, as a JSON escape: json.dumps writes it as it is, and the server must refuse it
SURROGATE = b'{"model": "gpt-4o-mini", "input": "Say \\ud800 hi.", "max_output_tokens": 16}'
TO_API = {"x-frugal-route": "api"}
TO_LOCAL = {"x-frugal-route": "local", "x-frugal-min-quality": "0"}


class Soak:
    def __init__(
        self, served: Served, args: argparse.Namespace, keys: dict[str, str] | None = None
    ) -> None:
        self.served = served
        self.keys = keys or {}
        self.foreign_names = ("soak-tight", "soak-ops")  # what the client key must never see
        self.args = args
        self.lock = threading.Lock()
        self.results: list[dict[str, Any]] = []
        self.kills: list[tuple[float, float]] = []  # (killed at, ready again at), monotonic
        self.rss: list[dict[str, Any]] = []
        self.stop_at = time.monotonic() + args.minutes * 60
        self.port = int(served.base.rsplit(":", 1)[1])
        self.started = time.monotonic()

    # -- one request -------------------------------------------------------------------------

    def body(self, **extra: Any) -> dict[str, Any]:
        return {"model": "gpt-4o-mini", "messages": QUESTION, "max_tokens": 16, **extra}

    def auth(self, key: str = "client") -> dict[str, str]:
        return {"authorization": f"Bearer {self.keys[key]}"} if key in self.keys else {}

    def one(self, client: httpx.Client, kind: str) -> None:
        request_id = f"soak-{kind}-{secrets.token_hex(8)}"
        headers = {"content-type": "application/json", "x-request-id": request_id, **self.auth()}
        content: bytes
        path = "/v1/chat/completions"
        if kind == "own_report":
            self.own_report(client, request_id)
            return
        if kind in ("cut_stream", "stalled_body"):
            self.raw(request_id, kind)
            return
        if kind in ("local", "local_stream"):
            headers.update(TO_LOCAL)
            content = json.dumps(self.body(stream=kind == "local_stream")).encode()
        elif kind in ("api", "api_stream"):
            headers.update(TO_API)
            content = json.dumps(self.body(stream=kind == "api_stream")).encode()
        elif kind == "bad_json":
            content = b'{"model": "gpt-4o-mini", "messages": [}'
        elif kind == "bad_type":
            content = json.dumps(self.body(max_tokens="many")).encode()
        elif kind == "bad_model":
            content = json.dumps(self.body(model="x" * 5000)).encode()
        elif kind == "over_budget":
            headers.update({**TO_API, **self.auth("tight")})
            content = json.dumps(self.body(max_tokens=5, functions=BIG_FUNCTIONS)).encode()
        elif kind == "refusal_burst":
            headers.update({"x-frugal-min-quality": "1", **self.auth("tight")})
            content = json.dumps(self.body(messages=BIG_REFUSAL)).encode()
        elif kind == "name_burst":
            headers.update({"x-frugal-min-quality": "1", **self.auth("tight")})
            content = json.dumps(self.body(messages=BIG_NAME)).encode()
        elif kind == "prompt_list":
            headers.update({**TO_API, **self.auth("tight")})
            path = "/v1/completions"
            body = {"model": "gpt-4o-mini", "prompt": PROMPTS, "max_tokens": 50}
            content = json.dumps(body).encode()
        elif kind == "big_user":
            path = "/v1/responses"
            body = {"model": "gpt-4o-mini", "input": "Say hi.", "user": BIG_USER}
            content = json.dumps(body).encode()
        elif kind == "surrogate":
            path = "/v1/responses"
            content = SURROGATE
        elif kind == "wide_schema":
            headers.update(TO_API)
            content = json.dumps(self.body(tools=WIDE_TOOL)).encode()
        else:
            self.disconnect(request_id)
            return
        started = time.monotonic()
        status: int
        try:
            with client.stream(
                "POST", self.served.base + path, content=content, headers=headers
            ) as response:
                for _ in response.iter_bytes():
                    pass
                status = response.status_code
        except httpx.HTTPError:
            status = -1
        self.note(request_id, kind, status, started)

    def own_report(self, client: httpx.Client, request_id: str) -> None:
        """The client key's report by key: a 200 holding its own name and no other key's."""
        started = time.monotonic()
        try:
            got = client.get(self.served.base + "/v1/frugal/report?by=key", headers=self.auth())
            status = got.status_code
            if status == 200 and any(name in got.text for name in self.foreign_names):
                status = -2  # another key's figures leaked: counted as a failure
        except httpx.HTTPError:
            status = -1
        self.note(request_id, "own_report", status, started)

    def head(self, request_id: str, length: int, route: str) -> str:
        """A chat request's head, written by hand (the client leaves in the middle)."""
        key = self.keys.get("client")
        return (
            f"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1:{self.port}\r\n"
            f"content-type: application/json\r\ncontent-length: {length}\r\n"
            f"x-request-id: {request_id}\r\nx-frugal-route: {route}\r\n"
            + (f"authorization: Bearer {key}\r\n" if key else "")
            + "\r\n"
        )

    def raw(self, request_id: str, kind: str) -> None:
        """cut_stream: an API stream read for three chunks, then the socket closed.
        stalled_body: the headers and 8 bytes of the body, then the socket closed."""
        data = json.dumps(self.body(max_tokens=64, stream=True)).encode()
        head = self.head(request_id, len(data), "api")
        started = time.monotonic()
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=10) as sock:
                if kind == "stalled_body":
                    sock.sendall(head.encode() + data[:8])
                    time.sleep(random.uniform(0.05, 0.5))
                else:
                    sock.sendall(head.encode() + data)
                    read_events(sock, 3)
        except OSError:
            pass
        self.note(request_id, kind, 0, started)

    def disconnect(self, request_id: str) -> None:
        data = json.dumps(self.body(max_tokens=200, stream=random.random() < 0.5)).encode()
        head = self.head(request_id, len(data), "local")
        started = time.monotonic()
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=10) as sock:
                sock.sendall(head.encode() + data)
                time.sleep(random.uniform(0.05, 0.5))
        except OSError:
            pass
        self.note(request_id, "disconnect", 0, started)

    def note(self, request_id: str, kind: str, status: int, started: float) -> None:
        with self.lock:
            self.results.append(
                {
                    "id": request_id,
                    "kind": kind,
                    "status": status,
                    "start": started,
                    "end": time.monotonic(),
                }  # fmt: skip
            )

    # -- the threads -------------------------------------------------------------------------

    def client(self) -> None:
        kinds, weights = list(KINDS), list(KINDS.values())
        with httpx.Client(timeout=60) as client:
            while time.monotonic() < self.stop_at:
                self.one(client, random.choices(kinds, weights)[0])

    def killer(self) -> None:
        next_kill = self.started + self.args.kill_every
        while time.monotonic() < self.stop_at:
            time.sleep(0.5)
            if time.monotonic() < next_kill:
                continue
            next_kill += self.args.kill_every
            try:
                pid = engine_pid(self.served)
            except httpx.HTTPError:
                continue
            if not pid:
                continue
            killed = time.monotonic()
            os.kill(pid, signal.SIGKILL)
            print(f"[{killed - self.started:7.1f} s] SIGKILL engine worker {pid}", flush=True)
            ready = killed
            while time.monotonic() < killed + 120:
                time.sleep(0.1)
                try:
                    engine = self.served.health()["engine"]
                except (httpx.HTTPError, KeyError, ValueError):
                    continue
                if engine["state"] == "ready" and engine.get("pid") not in (None, pid):
                    ready = time.monotonic()
                    break
            with self.lock:
                self.kills.append((killed, max(ready, killed)))

    def sampler(self) -> None:
        while time.monotonic() < self.stop_at + 1:
            try:
                worker = engine_pid(self.served)
            except (httpx.HTTPError, KeyError, ValueError):
                worker = None
            proxy = rss_bytes(self.served.proc.pid)
            point = {
                "t_s": round(time.monotonic() - self.started, 1),
                "proxy_mb": round((proxy or 0) / MB, 1),
                "worker_mb": round((rss_bytes(worker) or 0) / MB, 1) if worker else None,
            }
            self.rss.append(point)
            with self.lock:
                done = len(self.results)
            print(f"[{point['t_s']:7.1f} s] rss {point} requests {done}", flush=True)
            time.sleep(self.args.sample_s)

    def run(self) -> None:
        threads = [threading.Thread(target=self.client) for _ in range(self.args.clients)]
        threads += [threading.Thread(target=self.killer), threading.Thread(target=self.sampler)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    # -- the summary -------------------------------------------------------------------------

    def injected(self, result: dict[str, Any]) -> bool:
        return any(result["start"] <= ready + 1 and result["end"] >= killed
                   for killed, ready in self.kills)  # fmt: skip

    def summary(self) -> dict[str, Any]:
        ids = [r["id"] for r in self.results if r["kind"] not in NO_ROW]
        rows = ledger_rows(self.served.db)
        per_id = Counter(row["request_id"] for row in rows)
        missing = [i for i in ids if per_id[i] == 0]
        doubled = [i for i in ids if per_id[i] > 1]
        bad = BAD
        five = [r for r in self.results if r["status"] >= 500]
        five_injected = [r for r in five if self.injected(r)]
        good_refused = [
            r for r in self.results if r["kind"] not in bad | REFUSED | DROPPED
            and 400 <= r["status"] < 500
        ]  # fmt: skip
        bad_taken = [r for r in self.results if r["kind"] in bad and not 400 <= r["status"] < 500]
        over_budget_taken = [r for r in self.results if r["kind"] in REFUSED and r["status"] != 429]
        leaked = [r for r in self.results if r["kind"] == "own_report" and r["status"] == -2]
        cut = {r["id"] for r in self.results if r["kind"] == "cut_stream"}
        cut_rows = [row for row in rows if row["request_id"] in cut]
        cut_charged = sum(1 for row in cut_rows if (row.get("api_cost_pusd") or 0) > 0)
        proxy = [p["proxy_mb"] for p in self.rss]
        statuses = Counter(r["status"] for r in self.results)
        return {
            "minutes": self.args.minutes,
            "clients": self.args.clients,
            "requests": len(ids),
            "by_kind": dict(Counter(r["kind"] for r in self.results)),
            "statuses": {str(k): v for k, v in sorted(statuses.items())},
            "client_errors_no_status": sum(1 for r in self.results if r["status"] == -1),
            "rows": sum(per_id[i] for i in set(ids)),
            "missing_rows": len(missing),
            "missing_examples": missing[:10],
            "duplicate_rows": len(doubled),
            "worker_kills": len(self.kills),
            "recovery_s": [round(ready - killed, 2) for killed, ready in self.kills],
            "5xx_total": len(five),
            "5xx_injected": len(five_injected),
            "5xx_not_injected": len(five) - len(five_injected),
            "good_requests_refused_4xx": len(good_refused),
            "bad_input_not_4xx": len(bad_taken),
            "over_budget_not_429": len(over_budget_taken),
            "tight_key_spent_usd": self.spent("soak-tight"),
            "reports_naming_another_key": len(leaked),
            "cut_streams": len(cut),
            "cut_streams_charged": cut_charged,
            "proxy_rss_mb": {
                "first": proxy[0] if proxy else None,
                "max": max(proxy, default=None),
                "last": proxy[-1] if proxy else None,
            },
            "rss": self.rss,
        }  # fmt: skip

    def spent(self, name: str) -> float | None:
        """A key's spend this month, as the ledger's budget table holds it (USD)."""
        import sqlite3

        with sqlite3.connect(self.served.db) as conn:
            got = conn.execute(
                "SELECT COALESCE(SUM(spent_pusd), 0) FROM key_spend WHERE key_name = ?", (name,)
            ).fetchone()
        return None if got is None else int(got[0]) / 10**12


def markdown(s: dict[str, Any]) -> str:
    lines = [
        f"# Soak run: {s['minutes']} min, {s['clients']} clients",
        "",
        "| figure | value |",
        "|---|---|",
    ]
    for key in (
        "requests", "rows", "missing_rows", "duplicate_rows", "worker_kills", "recovery_s",
        "5xx_total", "5xx_injected", "5xx_not_injected", "good_requests_refused_4xx",
        "bad_input_not_4xx", "over_budget_not_429", "tight_key_spent_usd",
        "reports_naming_another_key", "cut_streams", "cut_streams_charged",
        "client_errors_no_status", "statuses", "by_kind", "proxy_rss_mb",
    ):  # fmt: skip
        lines.append(f"| {key} | {json.dumps(s[key])} |")
    lines += ["", "| t (s) | proxy RSS (MB) | worker RSS (MB) |", "|---|---|---|"]
    lines += [f"| {p['t_s']} | {p['proxy_mb']} | {p['worker_mb']} |" for p in s["rss"]]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--clients", type=int, default=4, help="client threads")
    parser.add_argument("--kill-every", type=float, default=300.0, help="seconds between kills")
    parser.add_argument("--sample-s", type=float, default=10.0, help="seconds between RSS samples")
    parser.add_argument("--out", type=Path, default=None, help="directory for the summary")
    args = parser.parse_args(argv)
    out: Path = args.out or Path(tempfile.mkdtemp(prefix="frugal-soak-"))
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="frugal-soak-server-"))
    db = work / "ledger.db"
    keys = {
        "client": keys_mod.create(str(db), "soak-client", max_concurrency=64),
        "tight": keys_mod.create(str(db), "soak-tight", monthly_budget_pusd=10**9),  # $0.001
        "ops": keys_mod.create(str(db), "soak-ops", admin=True),
    }
    reply = "The capital of France is Paris."
    with FakeAPI(record=False, reply=reply, bill_prompt_bytes=True) as api:
        served = launch(work, api, db=db, config={"fallback": {"timeout_s": 10.0}})
        served.key = keys["ops"]  # /healthz (the engine's pid and state) for the admin key
        wait_ready(served)
        print(f"frugal serve at {served.base}, ledger {served.db}", flush=True)
        soak = Soak(served, args, keys)
        try:
            soak.run()
        finally:
            rc = stop(served)
        summary = soak.summary()
        summary["exit_status"] = rc
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    (out / "summary.md").write_text(markdown(summary))
    print(markdown(summary))
    print(f"summary in {out}/summary.json and summary.md; server log {served.log}")
    ok = (
        summary["missing_rows"] == 0
        and summary["duplicate_rows"] == 0
        and summary["5xx_not_injected"] == 0
        and summary["bad_input_not_4xx"] == 0
        and summary["over_budget_not_429"] == 0
        and summary["reports_naming_another_key"] == 0
        and (summary["tight_key_spent_usd"] or 0) <= 0.001
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
