"""The HTTP edge: JSON-only POSTs, a loopback Host in keyless mode, request ids, the 500 for an
unexpected error, stored keys that fail closed, and the engine worker's environment.

In-process through ``httpx.ASGITransport`` first; then against a real ``frugal serve`` (marked
``serve``): a keyless one with secrets in its environment, and one whose keys table is damaged.
"""

from __future__ import annotations

import os
import secrets
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.routing import Route
from structlog.testing import capture_logs

from proxy import config
from proxy.engine.worker_env import worker_environment
from proxy.errors import ConfigError
from proxy.ledger.tenants import keys
from proxy.server import auth
from proxy.serving import clients
from tests.conftest import FAKE_KEY, module_api, settings_for
from tests.fake_api import FakeAPI
from tests.in_process import http_scope
from tests.server.test_serve import FRUGAL, Served, serving

GOOD = "edge-key-" + "k" * 16
BAD_BODY = {"model": "m", "messages": "not a list"}  # a 400 from validation: past the edge
JSON = {"content-type": "application/json"}


@pytest.fixture
def keyed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The settings of a proxy whose one client key is GOOD (named ``ops``)."""
    monkeypatch.setenv("FRUGAL_TEST_EDGE_KEYS", f"ops:{GOOD}")
    return settings_for(tmp_path, server={"api_keys_env": "FRUGAL_TEST_EDGE_KEYS"})


def assert_openai_error(response: httpx.Response, status: int, code: str) -> None:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == code and error["param"] is None and error["message"]


def corrupt_keys_table(db: Path) -> bytes:
    """Overwrite the api_keys table's root page with garbage; returns the page, to restore it."""
    conn = sqlite3.connect(db)
    page_size = conn.execute("PRAGMA page_size").fetchone()[0]
    root = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = 'api_keys'").fetchone()[0]
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    with db.open("r+b") as f:
        f.seek((root - 1) * page_size)
        page = f.read(page_size)
        f.seek((root - 1) * page_size)
        f.write(b"\xff" * page_size)
    return page


def restore_keys_table(db: Path, page: bytes) -> None:
    conn = sqlite3.connect(db)
    root = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = 'api_keys'").fetchone()[0]
    conn.close()
    with db.open("r+b") as f:
        f.seek((root - 1) * len(page))
        f.write(page)


# -- Content-Type ---------------------------------------------------------------------------------


@pytest.mark.parametrize("content_type", [None, "text/plain", "application/x-www-form-urlencoded"])
async def test_a_post_that_is_not_json_gets_415(
    tmp_path: Path, make_client: Any, content_type: str | None
) -> None:
    headers = {"content-type": content_type} if content_type else {}
    async with make_client(settings_for(tmp_path)) as client:
        r = await client.post(
            "/v1/chat/completions", content=b'{"model": "m", "messages": []}', headers=headers
        )
    assert_openai_error(r, 415, "unsupported_media_type")
    assert r.json()["error"]["type"] == "invalid_request_error"
    assert "application/json" in r.json()["error"]["message"]
    assert len(r.headers["x-request-id"]) == 32


@pytest.mark.parametrize(
    "content_type", ["application/json", "application/json; charset=utf-8", "Application/JSON"]
)
async def test_json_with_or_without_parameters_passes(
    tmp_path: Path, make_client: Any, content_type: str
) -> None:
    async with make_client(settings_for(tmp_path)) as client:
        r = await client.post(
            "/v1/chat/completions",
            content=b'{"model": "m", "messages": "x"}',
            headers={"content-type": content_type},
        )
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages"


async def test_json_is_required_with_keys_too_but_a_stranger_gets_401_first(
    keyed: Any, make_client: Any
) -> None:
    plain = {"content-type": "text/plain"}
    async with make_client(keyed) as client:
        stranger = await client.post("/v1/chat/completions", content=b"{}", headers=plain)
        keyed = await client.post(
            "/v1/chat/completions",
            content=b"{}",
            headers={**plain, "authorization": f"Bearer {GOOD}"},
        )
    assert stranger.status_code == 401
    assert_openai_error(keyed, 415, "unsupported_media_type")


# -- Host -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "host", ["localhost", "localhost:8080", "127.0.0.1", "127.3.4.5:9", "[::1]", "[::1]:8080"]
)
async def test_keyless_mode_serves_loopback_host_names(
    tmp_path: Path, make_client: Any, host: str
) -> None:
    async with make_client(settings_for(tmp_path)) as client:
        health = await client.get("/healthz", headers={"host": host})
        bad = await client.post("/v1/chat/completions", json=BAD_BODY, headers={"host": host})
    assert health.status_code == 200 and "engine" in health.json()
    assert bad.status_code == 400


@pytest.mark.parametrize(
    "host", ["evil.example", "evil.example:8080", "127.0.0.1.evil.example", "10.0.0.1", "[::2]"]
)
async def test_keyless_mode_refuses_a_foreign_host_on_every_endpoint(
    tmp_path: Path, make_client: Any, host: str
) -> None:
    async with make_client(settings_for(tmp_path)) as client:
        for method, path in (
            ("POST", "/v1/chat/completions"),
            ("GET", "/healthz"),
            ("GET", "/v1/models"),
            ("GET", "/metrics"),
        ):
            r = await client.request(method, path, json=BAD_BODY, headers={"host": host})
            assert_openai_error(r, 421, "misdirected_request")
            assert "frugal keys create" in r.json()["error"]["message"]
        metrics = (await client.get("/metrics")).text
    assert 'reason="misdirected"' in metrics


async def test_with_keys_a_foreign_host_is_served(keyed: Any, make_client: Any) -> None:
    """Behind a TLS proxy the Host is the public name; a key is what keeps pages out."""
    host = {"host": "llm.example.com"}
    async with make_client(keyed) as client:
        keyed = await client.post(
            "/v1/chat/completions",
            json=BAD_BODY,
            headers={**host, "authorization": f"Bearer {GOOD}"},
        )
        stranger = await client.post("/v1/chat/completions", json=BAD_BODY, headers=host)
    assert keyed.status_code == 400
    assert stranger.status_code == 401


# -- request ids and the 500 ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sent", "kept"),
    [
        ("client-id_1.2", True),
        ("a" * 128, True),
        ("a" * 129, False),
        ("has space", False),
        ("new\\nline", False),
        ("semi;colon", False),
        ("ünïcode", False),
    ],
)
async def test_a_clients_request_id_is_kept_only_when_short_and_plain(
    tmp_path: Path, make_client: Any, sent: str, kept: bool
) -> None:
    async with make_client(settings_for(tmp_path)) as client:
        r = await client.get("/healthz", headers={"x-request-id": sent.encode("utf-8")})
    got = r.headers["x-request-id"]
    if kept:
        assert got == sent
    else:
        assert got != sent and len(got) == 32 and int(got, 16) >= 0


async def test_a_client_gone_mid_body_of_a_service_outside_the_cascade_is_no_error(
    tmp_path: Path, make_client: Any
) -> None:
    # The body is read through the call (proxy/server/calls.py), which says a client that left
    # in the middle of it as BodyCut: /v1/responses/input_tokens writes no row, so the app
    # itself logs it as a client gone, never as an unexpected error.
    pieces: list[dict[str, Any]] = [
        {"type": "http.request", "body": b'{"model": "gpt-4o-mini", "inp', "more_body": True},
        {"type": "http.disconnect"},
    ]

    async def receive() -> dict[str, Any]:
        return pieces.pop(0) if pieces else {"type": "http.disconnect"}

    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    headers = {
        "host": "127.0.0.1",
        "content-type": "application/json",
        "content-length": "500",
        "x-request-id": "req-cut",
    }
    async with make_client(settings_for(tmp_path)) as client:
        scope = http_scope("POST", "/v1/responses/input_tokens", headers)
        with capture_logs() as logs:
            await client.app(scope, receive, send)
    said = [(e["event"], e.get("request_id")) for e in logs]
    assert ("client_gone", "req-cut") in said, said
    assert all(event != "unhandled_error" for event, _ in said), said
    assert [m for m in sent if m["type"] == "http.response.start"] == []


async def test_an_unexpected_error_is_an_openai_500_with_the_request_id_logged_once(
    tmp_path: Path, make_client: Any
) -> None:
    secret = "SECRET-PROMPT-" + secrets.token_hex(4)

    async def broken(request: Any) -> Any:
        raise RuntimeError(f"failed on {secret}")

    async with make_client(settings_for(tmp_path)) as client:
        # The chat route's place (proxy/server/endpoints.py's Mounted) hands requests to broken.
        [mounted] = {
            route.endpoint.__self__
            for route in client.app.routes
            if isinstance(route, Route) and route.path == "/v1/chat/completions"
        }
        mounted.handler = broken
        with capture_logs() as logs:
            r = await client.post(
                "/v1/chat/completions",
                json={"model": "m", "messages": [{"role": "user", "content": secret}]},
                headers={"x-request-id": "req-500"},
            )
    assert r.status_code == 500
    assert r.headers["x-request-id"] == "req-500"
    assert r.json() == {
        "error": {
            "message": "internal error; look up request id req-500 in the server log",
            "type": "server_error",
            "param": None,
            "code": "internal_error",
        }
    }
    errors = [e for e in logs if e["event"] == "unhandled_error"]
    assert len(errors) == 1
    assert errors[0]["request_id"] == "req-500" and errors[0]["error"] == "RuntimeError"
    assert "test_edge.py" in errors[0]["where"]
    assert secret not in repr(logs) and secret not in r.text


# -- keys that cannot be read ---------------------------------------------------------------------


async def test_stored_keys_unreadable_at_start_lock_the_proxy(
    tmp_path: Path, make_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FRUGAL_TEST_EDGE_KEYS", f"ops:{GOOD}")
    db = tmp_path / "ledger.db"
    stored = keys.create(str(db), "bob")
    page = corrupt_keys_table(db)
    for env in ("", "FRUGAL_TEST_EDGE_KEYS"):
        settings = settings_for(tmp_path, server={"api_keys_env": env})
        with pytest.raises(ConfigError, match="stored client keys cannot be read"):
            auth.check_bind(settings)
        async with make_client(settings) as client:
            for key in (None, stored, "some-guess-0123456789"):
                headers = {"authorization": f"Bearer {key}"} if key else {}
                r = await client.post("/v1/chat/completions", json=BAD_BODY, headers=headers)
                assert r.status_code == 401, (env, key)
            health = await client.get("/healthz")
            assert health.json() == {"status": "ok"}  # its status, not the details
            if env:
                ok = await client.post(
                    "/v1/chat/completions",
                    json=BAD_BODY,
                    headers={"authorization": f"Bearer {GOOD}"},
                )
                assert ok.status_code == 400  # the environment's keys still work
    restore_keys_table(db, page)
    settings = settings_for(tmp_path)
    assert auth.check_bind(settings) is True


@pytest.fixture
def bobs_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, str]:
    """A ledger (``tmp_path/ledger.db``) that holds one key, bob's, and no keys in the
    environment: the ledger's path and the key."""
    monkeypatch.delenv("FRUGAL_API_KEYS", raising=False)
    db = tmp_path / "ledger.db"
    return db, keys.create(str(db), "bob")


async def test_a_failed_reload_keeps_the_last_keys_and_a_later_one_recovers(
    bobs_key: tuple[Path, str],
) -> None:
    db, stored = bobs_key
    authn = clients.Authenticator(config.from_dict({"ledger": {"path": str(db)}}))
    await authn.refresh()
    assert authn.enabled and authn.name_of(stored) == "bob"
    page = corrupt_keys_table(db)
    with capture_logs() as logs:
        await authn.refresh()
    assert [e["event"] for e in logs] == ["keys_refresh_failed"]
    assert authn.enabled and authn.name_of(stored) == "bob"
    restore_keys_table(db, page)
    keys.revoke(str(db), "bob")
    await authn.refresh()
    assert authn.enabled and authn.name_of(stored) is None


async def test_a_first_read_that_fails_locks_until_a_read_succeeds(
    bobs_key: tuple[Path, str],
) -> None:
    db, stored = bobs_key
    page = corrupt_keys_table(db)
    authn = clients.Authenticator(config.from_dict({"ledger": {"path": str(db)}}))
    with capture_logs() as logs:
        await authn.refresh()
        await authn.refresh()
    assert [e["event"] for e in logs] == ["keys_unreadable"]  # said once, not every 2 s
    assert authn.enabled and authn.name_of(stored) is None
    restore_keys_table(db, page)
    await authn.refresh()
    assert authn.enabled and authn.name_of(stored) == "bob"


def test_a_database_path_that_is_a_folder_is_not_taken_for_no_keys(tmp_path: Path) -> None:
    folder = tmp_path / "ledger.db"
    folder.mkdir()
    with pytest.raises(ConfigError, match="stored client keys cannot be read"):
        keys.stored_count(str(folder))


# -- the worker's environment ---------------------------------------------------------------------


def test_the_worker_environment_is_an_allow_list_without_secrets() -> None:
    parent = {
        "PATH": "/usr/bin",
        "HOME": "/home/x",
        "LANG": "C.UTF-8",
        "LC_ALL": "C",
        "TMPDIR": "/tmp",
        "OMP_NUM_THREADS": "3",
        "GGML_CUDA": "0",
        "LLAMA_LOG": "1",
        "FRUGAL_CACHE_DIR": "/c",
        "PYTHONPATH": "/p",
        "OPENAI_API_KEY": "sk-1",
        "FRUGAL_API_KEYS": "a:b",
        "LLAMA_API_KEY": "sk-2",
        "GGML_TOKEN": "t",
        "PYTHON_SECRET": "s",
        "OMP_PASSWORD": "p",
        "MY_UPSTREAM": "sk-3",
        "LLAMA_UPSTREAM": "sk-4",
        "AWS_SESSION_TOKEN": "t",
        "DATABASE_URL": "postgres://u:p@h/d",
    }
    env = worker_environment(parent, private=("LLAMA_UPSTREAM", ""))
    assert env == {
        k: parent[k]
        for k in (
            "PATH",
            "HOME",
            "LANG",
            "LC_ALL",
            "TMPDIR",
            "OMP_NUM_THREADS",
            "GGML_CUDA",
            "LLAMA_LOG",
            "FRUGAL_CACHE_DIR",
            "PYTHONPATH",
        )
    }


# -- against a real frugal serve ------------------------------------------------------------------


OPENAI_SECRET = "sk-test-secret-" + secrets.token_hex(8)
OTHER_SECRET = "tok-" + secrets.token_hex(8)


api = module_api(reply="Paris.")


@pytest.fixture(scope="module")
def keyless(api: FakeAPI, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    env = {"OPENAI_API_KEY": OPENAI_SECRET, "LLAMA_DEPLOY_TOKEN": OTHER_SECRET}
    with serving(tmp_path_factory.mktemp("keyless"), api, env=env) as server:
        yield server


@pytest.mark.serve
def test_a_real_keyless_server_refuses_text_plain_and_foreign_hosts(keyless: Served) -> None:
    url = keyless.base + "/v1/chat/completions"
    body = b'{"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}'
    plain = httpx.post(url, content=body, headers={"content-type": "text/plain"}, timeout=10)
    assert_openai_error(plain, 415, "unsupported_media_type")
    for method, target in (("POST", url), ("GET", keyless.base + "/healthz")):
        foreign = httpx.request(
            method,
            target,
            content=body,
            headers={**JSON, "host": "attacker.example:8080"},
            timeout=10,
        )
        assert_openai_error(foreign, 421, "misdirected_request")
    port = keyless.base.rsplit(":", 1)[1]
    ok = httpx.post(
        url,
        content=body,
        headers={"content-type": "application/json; charset=utf-8", "host": f"localhost:{port}"},
        timeout=30,
    )
    assert ok.status_code == 200, ok.text


@pytest.mark.serve
def test_the_real_engine_worker_holds_none_of_the_proxys_secrets(keyless: Served) -> None:
    pid = keyless.health()["engine"]["pid"]
    assert pid and pid != keyless.proc.pid
    environ = Path(f"/proc/{pid}/environ").read_bytes()
    names = {entry.split(b"=", 1)[0] for entry in environ.split(b"\0") if entry}
    assert b"PATH" in names
    for secret in (OPENAI_SECRET, OTHER_SECRET, FAKE_KEY):
        assert secret.encode() not in environ
    assert not names & {b"OPENAI_API_KEY", b"LLAMA_DEPLOY_TOKEN", b"FRUGAL_TEST_UPSTREAM_KEY"}
    parent = Path(f"/proc/{keyless.proc.pid}/environ").read_bytes()
    assert OPENAI_SECRET.encode() in parent  # the test did put it where the worker could inherit


@pytest.mark.serve
def test_a_real_serve_with_an_unreadable_keys_table_does_not_start(tmp_path: Path) -> None:
    db = tmp_path / "ledger.db"
    keys.create(str(db), "bob")
    corrupt_keys_table(db)
    cfg = tmp_path / "frugal.toml"
    cfg.write_text(f'[server]\napi_keys_env = ""\nport = 1\n\n[ledger]\npath = "{db}"\n')
    env = {k: v for k, v in os.environ.items() if k != "FRUGAL_API_KEYS"}
    out = subprocess.run(
        [FRUGAL, "serve", "--config", str(cfg)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert out.returncode == 2, out.stderr
    assert out.stderr.startswith("frugal: config error: [ledger] path = ")
    assert "stored client keys cannot be read" in out.stderr
