"""Codex CLI (npm ``@openai/codex``, whose native binary comes from the npm registry) through a
real ``frugal serve``: ``codex exec`` with a provider whose ``base_url`` is the proxy, streaming
its ``/v1/responses`` turns, as its users run it.

The fake API plays the model: it asks Codex to run ``cat answer.txt`` (its ``tool_call`` knob
names Codex's own ``exec_command`` function), Codex runs it in its working directory and sends
the output back, and the fake API answers in text. So a task completes only if both turns get
through, and the second carries what the command printed.

- **As Codex ships**, every turn offers built-in tools (``web_search``, a ``namespace`` of
  multi-agent tools): the API route, reason ``unsupported``, each tool sent as it was given.
- **With those turned off** and no reasoning summary asked (``reasoning: {}``), the local model
  is considered; Codex's own instructions are far past what the bundled SmolLM2 can read in
  time, so the router sends the turn to the API for that reason, never ``unsupported``. Forced
  local (``x-frugal-route: local`` in Codex's ``http_headers``), the proxy answers 400
  ``context_length_exceeded``, which Codex reports as a full context window; the API is not
  called.

Codex sends ``client_metadata`` on every request (``/v1/responses`` must accept it, as OpenAI's
does: its ``x-codex-turn-metadata`` value is a JSON text of about 750 characters).
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import module_api
from tests.fake_api import FakeAPI
from tests.load_factor import scaled, wait_until
from tests.server.test_openai_compat import npm_install
from tests.server.test_serve import Served, module_served

pytestmark = pytest.mark.serve

CODEX = "0.171.0"  # @openai/codex, the newest release when this was written; pinned
MODEL = "gpt-4o-mini"
SECRET = "the secret number is 42"
API_REPLY = "The file says 42."
WITHOUT_BUILT_INS = ("--disable", "multi_agent", "-c", 'web_search="disabled"')
NO_SUMMARY = ("-c", 'model_reasoning_summary="none"')
LOCAL = {"x-frugal-route": "local", "x-frugal-min-quality": "0"}

api = module_api(
    reply=API_REPLY, tool_call={"name": "exec_command", "arguments": {"cmd": "cat answer.txt"}}
)


@pytest.fixture(scope="module")
def codex() -> Path:
    """The ``codex`` launcher of ``@openai/codex`` (with its linux binary, 420 MB), installed
    from the npm registry once into ``~/.cache/frugal-proxy`` and reused."""
    npm = shutil.which("npm")
    if npm is None or shutil.which("node") is None:
        pytest.fail("node and npm are needed for the Codex CLI test (apt-get install nodejs npm)")
    root = Path.home() / ".cache" / "frugal-proxy" / f"codex-{CODEX}"
    launcher = root / "node_modules" / ".bin" / "codex"
    if not (root / "installed").exists():
        root.mkdir(parents=True, exist_ok=True)
        (root / "package.json").write_text('{"private": true}')
        npm_install(npm, root, f"@openai/codex@{CODEX}", timeout_s=600)
        (root / "installed").write_text(CODEX)
    version = subprocess.run([launcher, "--version"], capture_output=True, text=True, check=True)
    assert CODEX in version.stdout, version.stdout
    return launcher


served = module_served("codex", timeout_s=120)


@pytest.fixture(autouse=True)
def fresh_requests(api: FakeAPI) -> None:
    api.requests.clear()


def run_codex(
    codex: Path,
    served: Served,
    tmp_path: Path,
    *options: str,
    headers: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """``codex exec`` in a fresh working directory holding ``answer.txt``, with a Codex home of
    its own whose only provider is the proxy."""
    home, work = tmp_path / "codex-home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    (work / "answer.txt").write_text(SECRET + "\n")
    sent = ", ".join(f"{json.dumps(k)} = {json.dumps(v)}" for k, v in (headers or {}).items())
    (home / "config.toml").write_text(
        f"""model = "{MODEL}"
model_provider = "frugal"

[model_providers.frugal]
name = "frugal-proxy"
base_url = "{served.base}/v1"
env_key = "FRUGAL_CODEX_KEY"
wire_api = "responses"
http_headers = {{ {sent} }}
"""
    )
    env = {**os.environ, "CODEX_HOME": str(home), "FRUGAL_CODEX_KEY": "sk-client-unused"}
    env.pop("OPENAI_API_KEY", None)
    return subprocess.run(
        [str(codex), "exec", "--skip-git-repo-check", "-s", "danger-full-access", *options]
        + ["What does answer.txt say?"],
        cwd=work,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=scaled(300),
        check=False,
    )


def responses_rows(served: Served) -> list[dict[str, Any]]:
    conn = sqlite3.connect(served.db)
    conn.row_factory = sqlite3.Row
    try:
        query = "SELECT * FROM requests WHERE endpoint = 'responses' ORDER BY id"
        return [dict(r) for r in conn.execute(query)]
    finally:
        conn.close()


def new_rows(served: Served, before: int, count: int) -> list[dict[str, Any]]:
    """The ``count`` rows written after the first ``before`` (the writer flushes in batches)."""
    return wait_until(
        lambda: rows if len(rows := responses_rows(served)[before:]) >= count else None,
        f"{count} new responses rows",
        every_s=0.1,
    )


def _tool_loop_went_through(api: FakeAPI, done: subprocess.CompletedProcess[str]) -> None:
    """Two streamed turns reached the API; the second carries the command Codex ran and what
    it printed; Codex printed the API's answer."""
    assert done.returncode == 0, done.stderr[-3000:]
    assert API_REPLY in done.stdout
    assert [path for path, _h, _b in api.requests] == ["/v1/responses", "/v1/responses"]
    first, second = (body for _p, _h, body in api.requests)
    assert first["stream"] is True and second["stream"] is True
    assert first["model"] == MODEL
    outputs = [i for i in second["input"] if i.get("type") == "function_call_output"]
    assert len(outputs) == 1 and SECRET in json.dumps(outputs[0]["output"])


def test_codex_as_shipped_completes_its_task_on_the_api_route(
    codex: Path, served: Served, api: FakeAPI, tmp_path: Path
) -> None:
    before = len(responses_rows(served))
    done = run_codex(codex, served, tmp_path)
    _tool_loop_went_through(api, done)
    first = api.requests[0].body
    types = {tool["type"] for tool in first["tools"]}
    print("Codex's tool types:", sorted(types))
    assert {"function", "namespace", "web_search"} <= types  # sent as Codex gave them
    rows = new_rows(served, before, 2)
    assert [(r["route"], r["reason"], r["status"], r["stream"]) for r in rows] == [
        ("api", "unsupported", 200, 1),
        ("api", "unsupported", 200, 1),
    ]


def test_codex_without_built_in_tools_is_considered_for_the_local_model(
    codex: Path, served: Served, api: FakeAPI, tmp_path: Path
) -> None:
    before = len(responses_rows(served))
    done = run_codex(codex, served, tmp_path, *WITHOUT_BUILT_INS, *NO_SUMMARY)
    _tool_loop_went_through(api, done)
    first = api.requests[0].body
    assert {tool["type"] for tool in first["tools"]} == {"function"}
    assert first["reasoning"] == {}  # asks for nothing: no reason to skip the local model
    rows = new_rows(served, before, 2)
    print("reasons:", [r["reason"] for r in rows])
    assert [(r["route"], r["status"]) for r in rows] == [("api", 200), ("api", 200)]
    # planned for the local model, which cannot take Codex's ~10,000-token prompt in time
    assert {r["reason"] for r in rows} <= {"predicted_slow", "context_overflow", "local_timeout"}


def test_codex_forced_local_is_told_its_context_is_too_long_and_the_api_is_not_called(
    codex: Path, served: Served, api: FakeAPI, tmp_path: Path
) -> None:
    before = len(responses_rows(served))
    done = run_codex(codex, served, tmp_path, *WITHOUT_BUILT_INS, *NO_SUMMARY, headers=LOCAL)
    assert done.returncode != 0
    assert "context window" in done.stdout + done.stderr
    assert api.requests == []
    rows = new_rows(served, before, 1)
    assert rows and {(r["route"], r["status"], r["error"]) for r in rows} == {
        ("none", 400, "context_length_exceeded")
    }
