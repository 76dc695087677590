"""Every ``curl`` example in the README works against a real ``frugal serve``.

The README's ``sh`` blocks are parsed, each curl command (with its ``\\`` continuations) is
pointed at the test server's port, run with curl, and must answer 200 with the JSON (or SSE)
shape of its endpoint.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fake_api import FakeAPI
from tests.load_factor import scaled
from tests.server.test_serve import Served, serving

pytestmark = pytest.mark.serve

README = Path(__file__).resolve().parents[2] / "README.md"
README_BASE = "http://127.0.0.1:8080"


def readme_curls() -> list[str]:
    commands: list[str] = []
    for block in re.findall(r"```sh\n(.*?)```", README.read_text(), flags=re.S):
        joined = re.sub(r"\\\n\s*", " ", block)
        commands += [line.strip() for line in joined.splitlines() if line.startswith("curl ")]
    return commands


CURLS = readme_curls()


def check_shape(path: str, body: str) -> None:
    if body.startswith("data: "):
        events = [line[6:] for line in body.splitlines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]"
        chunks = [json.loads(e) for e in events[:-1]]
        assert chunks and all(c["object"] == "chat.completion.chunk" for c in chunks)
        return
    data: Any = json.loads(body)
    if path == "/v1/chat/completions":
        assert data["object"] == "chat.completion" and data["choices"]
    elif path == "/v1/completions":
        assert data["object"] == "text_completion" and data["choices"]
    elif path == "/v1/responses":
        assert data["object"] == "response" and data["output"][0]["type"] == "message"
    elif path == "/v1/embeddings":
        assert data["object"] == "list" and data["data"][0]["embedding"]
    elif path == "/v1/models":
        assert data["object"] == "list" and data["data"][0]["id"] == "local"
    elif path == "/healthz":
        assert data["status"] == "ok"
    elif path == "/openapi.json":
        assert data["openapi"].startswith("3.")
    elif path == "/v1/frugal/report":
        assert data["month"] and data["requests"] >= 0 and "net_saved_usd" in data
    else:  # pragma: no cover - a new example needs its shape here
        raise AssertionError(f"no shape check for {path}")


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    with FakeAPI() as api, serving(tmp_path_factory.mktemp("readme"), api) as server:
        yield server


def test_the_readme_has_a_curl_example_for_every_endpoint() -> None:
    paths = {re.search(r"127\.0\.0\.1:8080(/\S*)", c).group(1) for c in CURLS}  # type: ignore[union-attr]
    assert {
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/responses",
        "/v1/embeddings",
        "/v1/models",
        "/healthz",
        "/openapi.json",
        "/v1/frugal/report",
    } <= paths


@pytest.mark.parametrize("command", CURLS, ids=[f"curl{i}" for i in range(len(CURLS))])
def test_readme_curl_example_answers(served: Served, command: str) -> None:
    assert README_BASE in command
    path = re.search(r"127\.0\.0\.1:8080(/\S*)", command).group(1)  # type: ignore[union-attr]
    run = command.replace(README_BASE, served.base) + " -w '\\n%{http_code}'"
    out = subprocess.run(
        ["bash", "-c", run], capture_output=True, text=True, timeout=scaled(120), check=False
    )
    assert out.returncode == 0, out.stderr
    body, _, status = out.stdout.rstrip().rpartition("\n")
    assert status == "200", out.stdout
    check_shape(path, body.strip())
