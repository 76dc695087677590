"""A real ``frugal serve`` with client keys and tight limits: auth, limits, timeouts, and logs
that never hold prompts, completions or keys.

One server serves the whole module; its keys are ``alice`` (from ``$FRUGAL_API_KEYS``) and
``bob`` (stored by ``frugal keys create`` before it starts). The last test stops it and searches
its whole output (the proxy's log, uvicorn's and the engine worker's) for every secret and
marker the module sent.
"""

from __future__ import annotations

import json
import os
import secrets
import select
import socket
import sqlite3
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import structlog

from tests.conftest import FAKE_KEY_ENV, module_api, settings_for
from tests.fake_api import FakeAPI
from tests.load_factor import CEILING_S
from tests.server.test_serve import (
    ACCEPT_ANY,
    FRUGAL,
    REJECT_ALL,
    Served,
    serving,
    stop_server,
)

ALICE = "alice-" + secrets.token_urlsafe(24)
CAROL = "carol-" + secrets.token_urlsafe(24)  # a third key: max_concurrency = 2 is a share of 1
UPSTREAM_KEY = "sk-upstream-" + secrets.token_urlsafe(24)
MAX_BODY = 4096
TO_API = {"x-frugal-route": "api"}
LIMITS = f"""
api_keys_env = "FRUGAL_TEST_CLIENT_KEYS"
max_body_bytes = {MAX_BODY}
max_concurrency = 2
header_timeout_s = 1.0
body_timeout_s = 1.0
"""


class Secrets:
    """Everything the log must never contain."""

    def __init__(self) -> None:
        self.values: dict[str, str] = {
            "alice's key": ALICE,
            "carol's key": CAROL,
            "upstream key": UPSTREAM_KEY,
        }

    def add(self, what: str, value: str | None = None) -> str:
        value = value or f"MARKER-{what.replace(' ', '-')}-{secrets.token_hex(6)}"
        self.values[what] = value
        return value


SECRETS = Secrets()


api = module_api()


@pytest.fixture(scope="module")
def guarded(api: FakeAPI, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    tmp = tmp_path_factory.mktemp("guarded")
    made = subprocess.run(
        [FRUGAL, "keys", "create", "bob", "--db", str(tmp / "ledger.db")],
        capture_output=True,
        text=True,
        check=True,
    )
    SECRETS.add("bob's key", made.stdout.strip())
    env = {
        # alice is an admin key (the full /healthz, /metrics); carol a client key.
        "FRUGAL_TEST_CLIENT_KEYS": f"alice;admin:{ALICE},carol:{CAROL}",
        FAKE_KEY_ENV: UPSTREAM_KEY,
    }
    with serving(tmp, api, server_toml=LIMITS, env=env, client_key=ALICE) as server:
        yield server


def post(served: Served, key: str | None = None, *, header: str = "bearer", **kw: Any) -> Any:
    headers = dict(kw.pop("headers", {}))
    if key is not None:
        headers.update(
            {"authorization": f"Bearer {key}"} if header == "bearer" else {"x-api-key": key}
        )
    body = kw.pop("json", {"model": "gpt-4o-mini", "messages": [], "max_tokens": 8})
    return httpx.post(
        served.base + "/v1/chat/completions", json=body, headers=headers, timeout=30, **kw
    )


def chat_body(text: str, **extra: Any) -> dict[str, Any]:
    return {
        "model": "gpt-4o-mini",
        "messages": [{"role": "user", "content": text}],
        "max_tokens": 16,
        **extra,
    }


def ledger_rows(served: Served, request_id: str) -> list[sqlite3.Row]:
    deadline = time.monotonic() + CEILING_S
    while True:
        with sqlite3.connect(served.db) as conn:
            conn.row_factory = sqlite3.Row
            rows = conn.execute(
                "SELECT * FROM requests WHERE request_id = ?", (request_id,)
            ).fetchall()
        if rows or time.monotonic() > deadline:
            return rows
        time.sleep(0.05)


def assert_openai_error(response: httpx.Response, status: int, type_: str, code: str) -> None:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert (error["type"], error["code"]) == (type_, code)
    assert error["message"]


# -- authentication -----------------------------------------------------------------------------


@pytest.mark.serve
def test_a_request_without_a_key_gets_openais_401(guarded: Served) -> None:
    response = post(guarded)
    assert_openai_error(response, 401, "authentication_error", "invalid_api_key")
    assert "didn't provide an API key" in response.json()["error"]["message"]
    assert response.headers["www-authenticate"] == "Bearer"
    assert response.headers["x-request-id"]
    assert httpx.get(guarded.base + "/v1/models", timeout=5).status_code == 401
    assert httpx.get(guarded.base + "/no/such/path", timeout=5).status_code == 401


@pytest.mark.serve
def test_a_wrong_key_gets_401_in_either_header(guarded: Served) -> None:
    wrong = SECRETS.add("wrong bearer key")
    assert_openai_error(post(guarded, wrong), 401, "authentication_error", "invalid_api_key")
    wrong = SECRETS.add("wrong x-api-key")
    response = post(guarded, wrong, header="x-api-key")
    assert_openai_error(response, 401, "authentication_error", "invalid_api_key")
    assert "Incorrect API key" in response.json()["error"]["message"]
    assert_openai_error(post(guarded, ALICE[:-1]), 401, "authentication_error", "invalid_api_key")
    bad = openai.OpenAI(base_url=guarded.base + "/v1", api_key=ALICE + "x", max_retries=0)
    with pytest.raises(openai.AuthenticationError), bad:
        bad.chat.completions.create(model="gpt-4o-mini", messages=[])


@pytest.mark.serve
def test_good_keys_are_accepted_and_the_ledger_names_them(guarded: Served) -> None:
    marker = SECRETS.add("prompt via alice")
    raw = guarded.chat(
        headers={**ACCEPT_ANY, "x-request-id": "by-alice"},
        messages=[{"role": "user", "content": f"Say hello. {marker}"}],
    )
    assert raw.headers["x-frugal-route"] == "local"
    by_bob = post(
        guarded,
        SECRETS.values["bob's key"],
        header="x-api-key",
        json=chat_body(f"Say hi. {SECRETS.add('prompt via bob')}"),
        headers={**TO_API, "x-request-id": "by-bob"},
    )
    assert by_bob.status_code == 200, by_bob.text
    [alice_row] = ledger_rows(guarded, "by-alice")
    [bob_row] = ledger_rows(guarded, "by-bob")
    assert (alice_row["key_name"], bob_row["key_name"]) == ("alice", "bob")
    stored = b"".join(p.read_bytes() for p in guarded.db.parent.glob("ledger.db*"))
    assert ALICE.encode() not in stored
    assert SECRETS.values["bob's key"].encode() not in stored


@pytest.mark.serve
def test_the_clients_key_is_never_sent_upstream(guarded: Served, api: FakeAPI) -> None:
    before = api.count
    raw = guarded.chat(headers={"x-frugal-route": "api"})
    assert raw.headers["x-frugal-route"] == "api" and api.count == before + 1
    sent = api.requests[-1].headers
    assert sent["authorization"] == f"Bearer {UPSTREAM_KEY}"
    assert "x-api-key" not in sent
    assert not any(ALICE in value for value in sent.values())


@pytest.mark.serve
def test_healthz_is_open_but_says_only_its_status_without_a_key(guarded: Served) -> None:
    bare = httpx.get(guarded.base + "/healthz", timeout=5)
    assert bare.status_code == 200 and bare.json() == {"status": "ok"}
    full = guarded.health()
    assert full["engine"]["state"] == "ready" and "ledger" in full
    wrong = httpx.get(guarded.base + "/healthz", headers={"x-api-key": "nope"}, timeout=5)
    assert wrong.json() == {"status": "ok"}
    client = httpx.get(guarded.base + "/healthz", headers={"x-api-key": CAROL}, timeout=5)
    assert client.status_code == 200 and client.json() == {"status": "ok"}  # an admin's view


@pytest.mark.serve
def test_metrics_need_an_admin_key_when_keys_are_configured(guarded: Served) -> None:
    bare = httpx.get(guarded.base + "/metrics", timeout=5)
    assert_openai_error(bare, 401, "authentication_error", "invalid_api_key")
    scraped = httpx.get(
        guarded.base + "/metrics", headers={"authorization": f"Bearer {ALICE}"}, timeout=5
    )
    assert scraped.status_code == 200 and "frugal_requests_total" in scraped.text
    assert 'frugal_rejected_requests_total{reason="unauthorized"}' in scraped.text
    client = httpx.get(
        guarded.base + "/metrics", headers={"authorization": f"Bearer {CAROL}"}, timeout=5
    )
    assert_openai_error(client, 403, "invalid_request_error", "permission_denied")
    assert "--admin" in client.json()["error"]["message"]


@pytest.mark.serve
def test_keys_created_and_revoked_on_a_running_server_take_effect(guarded: Served) -> None:
    made = subprocess.run(
        [FRUGAL, "keys", "create", "carol", "--db", str(guarded.db)],
        capture_output=True,
        text=True,
        check=True,
    )
    carol = SECRETS.add("carol's key", made.stdout.strip())

    def status() -> int:
        r = httpx.get(
            guarded.base + "/v1/models", headers={"authorization": f"Bearer {carol}"}, timeout=5
        )
        return r.status_code

    deadline = time.monotonic() + 10
    while status() != 200:
        assert time.monotonic() < deadline, "a new key was not picked up"
        time.sleep(0.2)
    subprocess.run(
        [FRUGAL, "keys", "revoke", "carol", "--db", str(guarded.db)], check=True, text=True
    )
    deadline = time.monotonic() + 10
    while status() != 401:
        assert time.monotonic() < deadline, "a revoked key still works"
        time.sleep(0.2)
    listed = subprocess.run(
        [FRUGAL, "keys", "list", "--db", str(guarded.db)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "carol" in listed and "revoked" in listed and carol not in listed


# -- limits -------------------------------------------------------------------------------------


@pytest.mark.serve
def test_a_body_over_the_limit_gets_413_declared_or_not(guarded: Served) -> None:
    marker = SECRETS.add("oversized body")
    big = chat_body(marker + " " + "x" * (MAX_BODY * 2))
    declared = post(guarded, ALICE, json=big)
    assert_openai_error(declared, 413, "invalid_request_error", "request_too_large")
    assert declared.headers["connection"] == "close"
    payload = json.dumps(big).encode()

    def chunks() -> Iterator[bytes]:
        for i in range(0, len(payload), 1024):
            yield payload[i : i + 1024]

    streamed = httpx.post(
        guarded.base + "/v1/chat/completions",
        content=chunks(),
        headers={"authorization": f"Bearer {ALICE}", "content-type": "application/json"},
        timeout=30,
    )
    assert "content-length" not in streamed.request.headers
    assert_openai_error(streamed, 413, "invalid_request_error", "request_too_large")
    # just under the limit is fine
    fits = chat_body("x" * (MAX_BODY - 200))
    assert len(json.dumps(fits)) <= MAX_BODY
    assert post(guarded, ALICE, json=fits, headers=TO_API).status_code == 200


@pytest.mark.serve
def test_one_request_over_the_concurrency_limit_gets_429_with_retry_after(
    guarded: Served, api: FakeAPI
) -> None:
    # Two keys fill the two slots (each key's share is one of them, max_concurrency // 4 at
    # least 1); a third key gets the server's 429, and a key at its share gets its own.
    api.set(latency_s=2.0)
    results: list[int] = []

    def slow(key: str) -> None:
        results.append(post(guarded, key, json=chat_body("hi"), headers=TO_API).status_code)

    bob = SECRETS.values["bob's key"]
    workers = [threading.Thread(target=slow, args=(key,)) for key in (ALICE, bob)]
    try:
        for worker in workers:
            worker.start()
        deadline = time.monotonic() + CEILING_S
        while in_flight(guarded) < 2:
            assert time.monotonic() < deadline, "the two slow requests never got in flight"
            time.sleep(0.05)
        third = post(guarded, CAROL, json=chat_body("hi"))
        assert_openai_error(third, 429, "requests", "rate_limit_exceeded")
        assert third.headers["retry-after"] == "1"
        assert "its limit of 2 requests at once" in third.json()["error"]["message"]
        own = post(guarded, ALICE, json=chat_body("hi"))
        assert_openai_error(own, 429, "requests", "rate_limit_exceeded")
        assert own.headers["retry-after"] == "1"
        assert "the key 'alice' holds its share of this proxy's 2 slots (1 in" in own.text
        # monitoring is neither counted nor refused
        assert httpx.get(guarded.base + "/healthz", timeout=5).status_code == 200
    finally:
        for worker in workers:
            worker.join(timeout=30)
        api.set(latency_s=0.0)
    assert results == [200, 200]
    assert post(guarded, ALICE, json=chat_body("hi"), headers=TO_API).status_code == 200


def in_flight(served: Served) -> float:
    text = httpx.get(
        served.base + "/metrics", headers={"authorization": f"Bearer {ALICE}"}, timeout=5
    ).text
    for line in text.splitlines():
        if line.startswith("frugal_in_flight_requests "):
            return float(line.split()[1])
    return 0.0


def _connect(served: Served) -> socket.socket:
    port = int(served.base.rsplit(":", 1)[1])
    return socket.create_connection(("127.0.0.1", port), timeout=10)


def _read_until_closed(sock: socket.socket, limit_s: float) -> bytes:
    sock.settimeout(limit_s)
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


@pytest.mark.serve
def test_a_client_dribbling_its_headers_is_cut_off(guarded: Served) -> None:
    with _connect(guarded) as sock:
        started = time.monotonic()
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n")
        closed_after = None
        for i in range(40):  # a header line every 0.2 s: 8 s in all, if nobody stops it
            readable, _, _ = select.select([sock], [], [], 0.2)
            try:
                if readable:
                    sock.recv(65536)  # the 408, or the end of the connection
                    closed_after = time.monotonic() - started
                    break
                sock.sendall(f"x-slow-{i}: y\r\n".encode())
            except (BrokenPipeError, ConnectionResetError):
                closed_after = time.monotonic() - started
                break
        assert closed_after is not None, "still connected after 8 s of dribbled headers"
        assert 0.9 <= closed_after < 3.0


@pytest.mark.serve
def test_idle_and_kept_alive_connections_must_send_headers_in_time(guarded: Served) -> None:
    with _connect(guarded) as idle:
        started = time.monotonic()
        answer = _read_until_closed(idle, 5)
        assert 0.9 <= time.monotonic() - started < 3.0
        assert answer.startswith(b"HTTP/1.1 408 ")
        assert json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"]["code"] == "request_timeout"
    with _connect(guarded) as kept:
        kept.sendall(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
        time.sleep(0.3)
        assert kept.recv(65536).startswith(b"HTTP/1.1 200 ")
        started = time.monotonic()
        kept.sendall(b"GET /healthz HTTP/1.1\r\n")  # the next request, begun and never ended
        _read_until_closed(kept, 5)
        assert time.monotonic() - started < 3.0


@pytest.mark.serve
def test_a_body_that_comes_too_slowly_gets_408(guarded: Served) -> None:
    with _connect(guarded) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"content-length: 200\r\nauthorization: Bearer " + ALICE.encode() + b"\r\n\r\n{"
        )
        started = time.monotonic()
        answer = _read_until_closed(sock, 5)
    assert 0.9 <= time.monotonic() - started < 3.0
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408 ") and b"connection: close" in head.lower()
    assert json.loads(body)["error"]["code"] == "request_timeout"


@pytest.mark.serve
def test_a_public_address_without_keys_is_refused(tmp_path: Path) -> None:
    cfg = tmp_path / "frugal.toml"
    cfg.write_text(f'[server]\napi_keys_env = ""\n\n[ledger]\npath = "{tmp_path / "l.db"}"\n')
    env = {k: v for k, v in os.environ.items() if k != "FRUGAL_API_KEYS"}
    out = subprocess.run(
        [FRUGAL, "serve", "--config", str(cfg), "--host", "0.0.0.0", "--port", "1"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert out.returncode == 2
    assert out.stderr.startswith("frugal: config error: [server] host = '0.0.0.0' is not a")
    assert "frugal keys create NAME" in out.stderr and "--insecure-public" in out.stderr


# -- the log ------------------------------------------------------------------------------------


@pytest.mark.serve
def test_the_log_holds_no_prompt_completion_or_key(guarded: Served, api: FakeAPI) -> None:
    """Secrets and markers through every path, both routes, streams, errors and 4xx; then the
    whole output of the server is searched for each of them."""
    client = guarded.client()
    api.set(reply=f"Upstream says {SECRETS.add('api completion')} twice.")
    local_answers = []
    for route_headers, stream in (
        (ACCEPT_ANY, False),
        (ACCEPT_ANY, True),
        (REJECT_ALL, False),
        (REJECT_ALL, True),
    ):
        text = f"Tell me a fact. {SECRETS.add(f'prompt {len(local_answers)} {stream}')}"
        kwargs: dict[str, Any] = {
            "model": "gpt-4o-mini",
            "messages": [{"role": "system", "content": SECRETS.add(f"system {text[-6:]}")}]
            + [{"role": "user", "content": text}],
            "max_tokens": 24,
            "extra_headers": route_headers,
        }
        if stream:
            answer = "".join(
                c.choices[0].delta.content or ""
                for c in client.chat.completions.create(stream=True, **kwargs)
                if c.choices
            )
        else:
            answer = client.chat.completions.create(**kwargs).choices[0].message.content or ""
        if route_headers is ACCEPT_ANY:
            local_answers.append(answer)
    for i, answer in enumerate(local_answers):
        if len(answer.strip()) >= 12:
            SECRETS.add(f"local completion {i}", answer.strip())
    # errors: a bad parameter, a body that is not JSON, the API refusing and failing
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(
            model="gpt-4o-mini",
            messages=[{"role": "user", "content": SECRETS.add("bad request prompt")}],
            temperature=5,
        )
    not_json = httpx.post(
        guarded.base + "/v1/chat/completions",
        content=b'{"model": "' + SECRETS.add("not json").encode() + b'", oops',
        headers={"authorization": f"Bearer {ALICE}", "content-type": "application/json"},
        timeout=10,
    )
    assert not_json.status_code == 400
    api.set(fail_status=400, fail_times=1, error_message=SECRETS.add("upstream 400 message"))
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(
            model="gpt-4o-mini",
            messages=[{"role": "user", "content": SECRETS.add("refused prompt")}],
            extra_headers={"x-frugal-route": "api"},
        )
    api.set(fail_status=500, fail_times=-1, error_message=SECRETS.add("upstream 500 message"))
    with pytest.raises(openai.APIStatusError) as failed:
        client.chat.completions.create(
            model="gpt-4o-mini",
            messages=[{"role": "user", "content": SECRETS.add("failed prompt")}],
            extra_headers={"x-frugal-route": "api"},
        )
    assert failed.value.status_code == 502
    api.reset()
    anonymous = post(guarded, json=chat_body(SECRETS.add("unauthenticated prompt")))
    assert anonymous.status_code == 401

    assert stop_server(guarded) == 0
    log = guarded.log.read_text(errors="replace")
    leaked = {what: value for what, value in SECRETS.values.items() if value in log}
    assert not leaked, f"the log holds {sorted(leaked)}"
    # ...while it does say, once per request, what happened
    events = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    requests = [e for e in events if e.get("event") == "request"]
    by_id = {e["request_id"]: e for e in requests}
    alice = by_id["by-alice"]
    assert alice["key"] == "alice" and alice["route"] == "local"
    for field in ("reason", "quality", "latency_ms", "prompt_tokens", "completion_tokens"):
        assert alice[field] is not None, field
    assert alice["cost_usd"] == 0 and alice["counterfactual_usd"] > 0
    assert by_id["by-bob"]["key"] == "bob"
    api_rows = [e for e in requests if e["route"] == "api" and e["status"] == 200]
    assert api_rows and all("cost_usd" in e for e in api_rows)
    assert any(e["cost_usd"] for e in api_rows)
    rejected = [e for e in events if e.get("event") == "rejected"]
    assert {e["status"] for e in rejected} >= {401, 413, 429}
    assert not [e for e in events if e.get("event") == "request_content"]


# -- content logging, opted into -----------------------------------------------------------------


async def test_content_logging_is_off_by_default_and_logs_text_when_on(
    tmp_path: Path, make_client: Any, fake_api: FakeAPI
) -> None:
    marker = "MARKER-content-" + secrets.token_hex(4)
    fake_api.set(reply=f"Answer {marker}-out")
    body = chat_body(f"Question {marker}-in")
    for on in (False, True):
        settings = settings_for(tmp_path, fake_api, server={"log_content": on})
        async with make_client(settings) as client:
            with structlog.testing.capture_logs() as captured:
                plain = await client.post("/v1/chat/completions", json=body, headers=TO_API)
                streamed = await client.post(
                    "/v1/chat/completions", json={**body, "stream": True}, headers=TO_API
                )
                local = await client.post(
                    "/v1/chat/completions", json={**body, "max_tokens": 8}, headers=ACCEPT_ANY
                )
        assert plain.status_code == streamed.status_code == local.status_code == 200
        assert local.headers["x-frugal-route"] == "local"
        content = [e for e in captured if e["event"] == "request_content"]
        if not on:
            assert not content and marker not in repr(captured)
            continue
        assert [e["log_level"] for e in content] == ["debug"] * 3
        for event in content:
            assert event["messages"] == body["messages"]
        assert content[0]["completion"].split() == f"Answer {marker}-out".split()
        assert content[1]["completion"].split() == f"Answer {marker}-out".split()
        assert content[2]["completion"] == local.json()["choices"][0]["message"]["content"]
