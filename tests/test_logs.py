"""Library logs leave as JSON fields (issue 24): litellm, httpx, Python's warnings and llama.cpp,
in a fresh interpreter configured as ``frugal serve`` configures itself."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

# What a library may write: litellm with its own handler (imported for real, so that its handler
# is there to be taken away), a text that tries to start a forged JSON line, httpx below and at
# WARNING, a Python warning, an exception with a detail, and a real llama.cpp error.
PROBE = """
import logging, warnings
from proxy import logs
logs.configure("json")
from proxy.upstream.litellm_route import import_litellm
import_litellm()
logging.getLogger("LiteLLM").warning("bad image_url %s", FORGED)
logging.getLogger("httpx").warning("connection pool is full")
logging.getLogger("httpx").info("HTTP Request: POST http://127.0.0.1/v1 200")
warnings.warn("a library warning", UserWarning, stacklevel=1)
try:
    raise ValueError("DETAIL-" + "x" * 3)
except ValueError:
    logging.getLogger("LiteLLM").exception("call failed")
logging.getLogger("LiteLLM").warning("y" * 2000)
logs.route_llama_cpp_logs()
import llama_cpp
llama_cpp.llama_model_load_from_file(b"/nonexistent/m.gguf", llama_cpp.llama_model_default_params())
"""
FORGED = '"}\n{"event": "forged", "level": "info"}'


def run_probe(source: str, cwd: Path, timeout_s: float) -> subprocess.CompletedProcess[str]:
    """``source`` run in a fresh interpreter on this checkout (``LITELLM_LOG`` unset, litellm's
    bundled price map), which must exit 0: what it wrote."""
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": str(root), "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    env.pop("LITELLM_LOG", None)
    done = subprocess.run(
        [sys.executable, "-c", source],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=timeout_s,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done


def test_library_logs_are_json_lines_with_their_text_in_a_field(tmp_path: Path) -> None:
    done = run_probe(f"FORGED = {FORGED!r}\n" + PROBE, tmp_path, timeout_s=120)
    lines = [line for line in (done.stderr + done.stdout).splitlines() if line.strip()]
    events = [json.loads(line) for line in lines]  # every line is one JSON object
    assert not any(e.get("event") == "forged" for e in events)
    library = [e for e in events if e.get("event") == "library_log"]
    by_logger = {(e["logger"], e["level"]) for e in library}
    assert {
        ("LiteLLM", "warning"),
        ("httpx", "warning"),
        ("py.warnings", "warning"),
        ("LiteLLM", "error"),
        ("llama.cpp", "error"),
    } <= by_logger, by_logger
    assert any(e["message"] == "bad image_url " + FORGED for e in library)
    assert not any("HTTP Request" in e["message"] for e in library)  # httpx's INFO: dropped
    failed = next(e for e in library if e["message"] == "call failed")
    assert failed["error"] == "ValueError" and "DETAIL" not in json.dumps(events)
    long = next(e for e in library if e["message"].startswith("yyy"))
    assert len(long["message"]) == 501  # cut at 500 characters and an ellipsis
    assert any("failed to open GGUF file" in e["message"] for e in library)


def test_shown_escapes_what_would_not_show_as_itself_and_nothing_else() -> None:
    from proxy.logs import invisible, shown

    hostile = "\x1b[2J\x1b]0;t\x07a\u202eb\u2066c\u200bd\u3164e\u115f\u1160\uffa0\u00a0\u3000"
    assert shown(hostile) == (
        "\\x1b[2J\\x1b]0;t\\x07a\\u202eb\\u2066c\\u200bd\\u3164e\\u115f\\u1160\\uffa0\\xa0\\u3000"
    )
    assert shown("\ue000\U000e0001\u0378\n\r\u2028") == (
        "\\ue000\\U000e0001\\u0378\\x0a\\x0d\\u2028"
    )
    plain = "Qwen2.5-7B-Instruct Q4_K_M Ünïcödé 日本語 ü"
    assert shown(plain) == plain and not any(invisible(c) for c in plain)


def test_console_log_lines_show_outside_text_escaped(tmp_path: Path) -> None:
    """The console renderer (a terminal's) writes a field as it is: a model name holding a
    screen clear or a bidi override reaches it escaped."""
    probe = (
        "import structlog\n"
        "from proxy import logs\n"
        "logs.configure('console')\n"
        "structlog.get_logger().warning('model\\x1b[2J', model='gpt\\u202e\\x1b]0;t\\x07')\n"
    )
    done = run_probe(probe, tmp_path, timeout_s=60)
    for raw in ("\x1b[2J", "\u202e", "\x1b]0;", "\x07"):
        assert raw not in done.stderr, done.stderr
    assert "model\\x1b[2J" in done.stderr and "gpt\\u202e\\x1b]0;t\\x07" in done.stderr
