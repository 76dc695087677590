"""schemathesis over ``/openapi.json`` against a real ``frugal serve``: no 5xx, and every answer
fits the document (status codes, content types, headers, JSON schemas).

Two runs, both bounded and seeded so they are repeatable and fit CI's time:

- **API route** (``x-frugal-route: api``, the fake API behind): every operation, positive and
  negative data, ~1,500 requests.
- **Local route** (``x-frugal-min-quality: 0``: every local answer is accepted): a few
  generated chat and legacy completions on the real model, with a 3-second local deadline so
  that a generated ``max_tokens`` cannot keep the CPU busy. A local attempt that misses the
  deadline falls back to the API, as in production; forcing ``local`` would turn that into a
  documented 503 (the local model could not answer and the API was not allowed).

``positive_data_acceptance`` is left out: some rules join two fields in ways a schema cannot say
(a named ``tool_choice`` must be one of the ``tools``, a ``json_schema`` must be a valid JSON
Schema), so a schema-valid request may rightly get a 400.

That the document and the validator read one description (``proxy.protocol.params``) is checked
without a server in ``tests/protocol/test_request_schema.py``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fake_api import FakeAPI
from tests.load_factor import scaled
from tests.server.test_serve import Served, serving

pytestmark = pytest.mark.serve

ST = str(Path(sys.executable).with_name("st"))
CHECKS = ",".join(
    [
        "not_a_server_error",
        "status_code_conformance",
        "content_type_conformance",
        "response_headers_conformance",
        "response_schema_conformance",
        "negative_data_rejection",
        "missing_required_header",
        "unsupported_method",
        "allow_header_conformance",
    ]
)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    tmp = tmp_path_factory.mktemp("openapi")
    with FakeAPI() as api, serving(tmp, api, timeout_s=3.0, default_max_tokens=8) as server:
        yield server


def schemathesis(served: Served, report_dir: Path, *args: str) -> dict[str, Any]:
    """Run ``st run`` over the served document; returns its JSON report."""
    out = subprocess.run(
        [
            ST,
            "run",
            served.base + "/openapi.json",
            "--checks",
            CHECKS,
            "--seed",
            "7",
            "--workers",
            "1",
            "--request-timeout",
            f"{scaled(30):g}",
            "--report",
            "json",
            "--report-dir",
            str(report_dir),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=scaled(600),
        check=False,
        cwd=report_dir,  # st keeps a .schemathesis cache in its working directory
    )
    [path] = report_dir.glob("json-*.json")
    report: dict[str, Any] = json.loads(path.read_text())
    summary = report["test_cases"]
    print(f"schemathesis {' '.join(args)}: {summary}")
    assert out.returncode == 0, out.stdout[-8000:]
    assert summary["with_failures"] == 0 and summary["errored"] == 0, out.stdout[-8000:]
    return report


def test_schemathesis_finds_no_server_error_on_the_api_route(
    served: Served, tmp_path: Path
) -> None:
    report = schemathesis(
        served, tmp_path, "--header", "x-frugal-route: api", "--max-examples", "60"
    )
    assert report["operations"]["tested"] >= 5
    assert report["test_cases"]["generated"] >= 500
    # The positive data really reached the API route, not only the validator's 400s.
    chat = report["valid_rates"]["POST /v1/chat/completions"]["fuzzing"]
    assert chat["accepted"] >= 20


def test_schemathesis_on_the_local_route(served: Served, tmp_path: Path) -> None:
    report = schemathesis(
        served,
        tmp_path,
        "--header",
        "x-frugal-min-quality: 0",
        "--include-path",
        "/v1/chat/completions",
        "--include-path",
        "/v1/completions",
        "--phases",
        "fuzzing",
        "--mode",
        "positive",
        "--max-examples",
        "6",
    )
    assert report["test_cases"]["generated"] >= 6
    # Many generated requests are 400s or go to the API (logit_bias, unknown fields, a
    # max_tokens the router predicts cannot finish in 3 s...); some must reach the engine.
    assert served.health()["engine"]["completed"] >= 1
