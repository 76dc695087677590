"""A real ``frugal serve`` process on a loopback port, driven by the official ``openai`` client.

The fake API (a real HTTP server in this process) plays the external provider. Every chat request
sent to the module's server is counted, and the last test stops the server with SIGTERM and checks
that ``frugal report --format json`` counts exactly that many.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.conftest import FAKE_KEY, FAKE_KEY_ENV, module_api
from tests.fake_api import FakeAPI
from tests.load_factor import CEILING_S, scaled, wait_until
from tests.loopback import free_port, poll_ready, terminate

pytestmark = pytest.mark.serve

FRUGAL = str(Path(sys.executable).with_name("frugal"))
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
ACCEPT_ANY = {"x-frugal-min-quality": "0"}
REJECT_ALL = {"x-frugal-min-quality": "1"}


@dataclass
class Served:
    proc: subprocess.Popen[str]
    base: str
    config: Path
    db: Path
    log: Path
    sent: int = 0
    key: str | None = None  # the client key this server wants, if it has keys
    _client: openai.OpenAI | None = None

    def client(self) -> openai.OpenAI:
        if self._client is None:
            self._client = openai.OpenAI(
                base_url=self.base + "/v1", api_key=self.key or "sk-client-unused", max_retries=0
            )
        return self._client

    def health(self) -> dict[str, Any]:
        auth = {"authorization": f"Bearer {self.key}"} if self.key else None
        # 5 s on a quiet machine; a busy one (64 bodies of 8 MB arriving, row 10) takes longer.
        timeout = scaled(5)
        return dict(httpx.get(self.base + "/healthz", headers=auth, timeout=timeout).json())

    def engine_ready(self) -> bool:
        return self.health()["engine"]["state"] == "ready"

    def engine_now(self) -> dict[str, Any] | None:
        """/healthz's engine section, or None while /healthz does not answer in time."""
        try:
            return dict(self.health()["engine"])
        except (httpx.HTTPError, KeyError, ValueError):
            return None

    def running(self) -> bool:
        return self.proc.poll() is None

    def chat(self, headers: dict[str, str] | None = None, **kwargs: Any) -> Any:
        """One counted chat request; returns the raw response (headers + parsed body)."""
        self.sent += 1
        params: dict[str, Any] = {"model": "gpt-4o-mini", "messages": QUESTION, "max_tokens": 24}
        params.update(kwargs)
        return self.client().chat.completions.with_raw_response.create(
            **params, extra_headers=headers or {}
        )


def start_server(
    tmp: Path,
    api: FakeAPI,
    *,
    server_toml: str = "",
    router_toml: str = "",
    audit_toml: str = "rate = 0",
    env: dict[str, str] | None = None,
    client_key: str | None = None,
    **local: Any,
) -> Served:
    """``server_toml`` is added to [server], ``router_toml`` to [router], ``audit_toml`` is the
    [audit] section, ``env`` is added to the process's environment; ``client_key`` is the key the
    returned :class:`Served` sends.

    Shadow audits are off unless a test asks: the default 2% draw would add a random shadow or
    judge call to the fake API's count (as ``settings_for`` in conftest does for in-process apps).
    """
    port = free_port()
    db = tmp / "ledger.db"
    config = tmp / "frugal.toml"
    local_lines = "\n".join(f"{k} = {json.dumps(v)}" for k, v in local.items())
    config.write_text(
        f"""
[server]
port = {port}
log_format = "json"
{server_toml}

[local]
n_threads = 1
{local_lines}

[fallback]
api_base = "{api.url}"
api_key_env = "{FAKE_KEY_ENV}"
max_retries = 1
timeout_s = 10

[router]
{router_toml}

[audit]
{audit_toml}

[ledger]
path = "{db}"

[costs]
monthly_fixed_usd = 40
"""
    )
    log = tmp / "serve.log"
    env = {
        **{k: v for k, v in os.environ.items() if k != "FRUGAL_API_KEYS"},
        FAKE_KEY_ENV: FAKE_KEY,
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        **(env or {}),
    }
    with log.open("w") as sink:
        proc = subprocess.Popen(
            [FRUGAL, "serve", "--config", str(config)],
            stdout=sink,
            stderr=subprocess.STDOUT,
            env=env,
            text=True,
        )
    served = Served(proc, f"http://127.0.0.1:{port}", config, db, log, key=client_key)
    problem = poll_ready(proc, served.engine_ready, CEILING_S)
    if problem:
        raise AssertionError(f"frugal serve {problem}:\n{log.read_text()}")
    return served


def stop_server(served: Served) -> int:
    if served._client is not None:
        served._client.close()
        served._client = None
    grace_s = scaled(30)
    code = terminate(served.proc, timeout_s=grace_s)
    if code is None:
        raise AssertionError(
            f"frugal serve did not exit within {grace_s:g} s of SIGTERM:\n{served.log}"
        )
    return code


api = module_api(reply="The capital of France is Paris.")


@contextmanager
def serving(tmp: Path, api: FakeAPI, **options: Any) -> Iterator[Served]:
    """:func:`start_server`'s server for the block, stopped when it ends, however it ends."""
    served = start_server(tmp, api, **options)
    try:
        yield served
    finally:
        stop_server(served)


def module_served(folder: str, **options: Any) -> Any:
    """A ``served`` fixture for one module: :func:`start_server`'s server on the module's ``api``
    fixture, in a temp dir named ``folder``, started with ``options`` once and shared by the
    module's tests. Use: ``served = module_served("agents", timeout_s=120)``."""

    @pytest.fixture(scope="module", name="served")
    def module_server(api: FakeAPI, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
        with serving(tmp_path_factory.mktemp(folder), api, **options) as server:
            yield server

    return module_server


@pytest.fixture(scope="module")
def served(api: FakeAPI, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    # The naive cascade: the crash test's long answer must be tried locally, not predicted too
    # slow for the deadline and sent to the API at once (tests/routing/test_routing.py tests that).
    with serving(tmp_path_factory.mktemp("serve"), api, router_toml="predictive = false") as server:
        yield server


def test_plain_request_is_answered_locally(served: Served) -> None:
    raw = served.chat(headers=ACCEPT_ANY)
    completion = raw.parse()
    assert raw.headers["x-frugal-route"] == "local"
    assert raw.headers["x-frugal-reason"] == "accepted"
    assert completion.choices[0].message.content
    assert completion.usage is not None and completion.usage.completion_tokens > 0


def test_streaming_request_through_the_sdk(served: Served, api: FakeAPI) -> None:
    served.sent += 1
    stream = served.client().chat.completions.create(
        model="gpt-4o-mini",
        messages=QUESTION,
        max_tokens=24,
        stream=True,
        stream_options={"include_usage": True},
        extra_headers=ACCEPT_ANY,
    )
    pieces, usage = [], None
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            pieces.append(chunk.choices[0].delta.content)
        if chunk.usage is not None:
            usage = chunk.usage
    assert "".join(pieces).strip()
    assert usage is not None and usage.completion_tokens > 0


def test_low_quality_answer_falls_back_to_the_api(served: Served, api: FakeAPI) -> None:
    before = api.count
    raw = served.chat(headers=REJECT_ALL)
    assert (raw.headers["x-frugal-route"], raw.headers["x-frugal-reason"]) == (
        "api",
        "low_quality",
    )
    assert raw.parse().choices[0].message.content == "The capital of France is Paris."
    assert api.count == before + 1
    assert api.requests[-1].body["model"] == "gpt-4o-mini"


def test_streaming_fallback_through_the_sdk(served: Served) -> None:
    served.sent += 1
    stream = served.client().chat.completions.create(
        model="gpt-4o-mini", messages=QUESTION, stream=True, extra_headers=REJECT_ALL
    )
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text.split() == "The capital of France is Paris.".split()


def test_forced_routes(served: Served, api: FakeAPI) -> None:
    before = api.count
    to_api = served.chat(headers={"x-frugal-route": "api"})
    assert (to_api.headers["x-frugal-route"], to_api.headers["x-frugal-reason"]) == (
        "api",
        "forced",
    )
    to_local = served.chat(headers={"x-frugal-route": "local", **REJECT_ALL})
    assert (to_local.headers["x-frugal-route"], to_local.headers["x-frugal-reason"]) == (
        "local",
        "forced",
    )
    alias = served.chat(model="local", headers=REJECT_ALL)
    assert alias.headers["x-frugal-route"] == "local"
    assert api.count == before + 1


def test_bad_request_raises_the_sdks_own_error(served: Served) -> None:
    served.sent += 1
    with pytest.raises(openai.BadRequestError) as info:
        served.client().chat.completions.create(
            model="gpt-4o-mini", messages=QUESTION, temperature=5
        )
    assert info.value.status_code == 400
    assert info.value.body["param"] == "temperature"  # type: ignore[index]


def test_engine_crash_falls_back_and_the_engine_restarts(served: Served, api: FakeAPI) -> None:
    pid = served.health()["engine"]["pid"]
    result: dict[str, Any] = {}

    def long_request() -> None:
        result["raw"] = served.chat(
            messages=[{"role": "user", "content": "Write a very long story about the sea."}],
            max_tokens=1500,
        )

    worker = threading.Thread(target=long_request)
    worker.start()
    wait_until(
        lambda: (engine := served.engine_now()) and engine["busy"],
        "the engine busy with the long request",
        alive=served.running,
    )
    os.kill(pid, signal.SIGKILL)
    worker.join(timeout=CEILING_S)
    raw = result["raw"]
    assert (raw.headers["x-frugal-route"], raw.headers["x-frugal-reason"]) == ("api", "local_error")
    assert raw.parse().choices[0].message.content == "The capital of France is Paris."
    # The crash seen (not the old worker's pid) and the restart over: ready, or failed.
    health = wait_until(
        lambda: (
            (engine := served.engine_now())
            and engine["pid"] != pid
            and engine["state"] not in ("starting", "restarting")
            and engine
        ),
        "the engine restarted after its crash",
        alive=served.running,
    )
    assert health["state"] == "ready" and health["pid"] != pid
    assert health["crashes"] >= 1 and health["restarts"] >= 1
    after = served.chat(headers=ACCEPT_ANY)
    assert after.headers["x-frugal-route"] == "local"


def test_deadline_falls_back_and_frees_the_cpu(
    api: FakeAPI, tmp_path_factory: pytest.TempPathFactory
) -> None:
    quick = start_server(
        tmp_path_factory.mktemp("deadline"), api, router_toml="predictive = false", timeout_s=2.0
    )
    try:
        raw = quick.chat(
            messages=[{"role": "user", "content": "Write a very long story about the sea."}],
            max_tokens=2000,
        )
        assert (raw.headers["x-frugal-route"], raw.headers["x-frugal-reason"]) == (
            "api",
            "local_timeout",
        )
        engine = quick.health()["engine"]
        # The generation was stopped, not left running: the engine is idle and answers again.
        assert engine["busy"] is False and engine["state"] == "ready"
        assert quick.chat(headers=ACCEPT_ANY, max_tokens=4).headers["x-frugal-route"] == "local"
    finally:
        assert stop_server(quick) == 0


def test_a_stream_whose_client_leaves_is_stopped_and_still_counted(served: Served) -> None:
    """A client that sends a streamed request and leaves without reading a byte: its generation
    stops, and it still gets its ledger row (the report below counts it)."""
    served.sent += 1
    payload = json.dumps(
        {
            "model": "local",
            "messages": [{"role": "user", "content": "Write a very long story about the sea."}],
            "max_tokens": 1500,
            "stream": True,
        }
    ).encode()
    port = int(served.base.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\n"
            b"content-type: application/json\r\n"
            + f"content-length: {len(payload)}\r\n\r\n".encode()
            + payload
        )
        wait_until(
            lambda: (engine := served.engine_now()) and engine["busy"],
            "the engine busy with the request",
            alive=served.running,
            every_s=0.02,
        )
    deadline = time.monotonic() + scaled(30)
    while (engine := served.health()["engine"])["busy"] or engine["queue_depth"]:
        assert time.monotonic() < deadline, "the generation went on for nobody"
        time.sleep(0.02)
    assert engine["state"] == "ready"


def test_report_counts_exactly_the_requests_sent(served: Served) -> None:
    assert served.sent >= 8
    assert stop_server(served) == 0, served.log.read_text()
    out = subprocess.run(
        [FRUGAL, "report", "--config", str(served.config), "--format", "json"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["requests"] == served.sent
    assert report["local_requests"] + report["api_requests"] + report["failed_requests"] >= (
        served.sent
    )
    for key in (
        "month",
        "api_cost_usd",
        "counterfactual_cost_usd",
        "saved_usd",
        "fixed_cost_usd",
        "net_saved_usd",
        "local_share",
    ):
        assert key in report
    assert report["local_requests"] >= 4 and report["api_requests"] >= 4
    assert 0 < report["local_share"] < 1
    table = subprocess.run(
        [FRUGAL, "report", "--config", str(served.config)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert table.returncode == 0 and "Net saved" in table.stdout
    # The log holds no prompt text.
    assert "capital of France" not in served.log.read_text()
