"""A third-party inference server for the tests: ``python -m llama_cpp.server``, the
OpenAI-compatible server that llama-cpp-python ships (its ``server`` extra), serving the bundled
SmolLM2 on a free loopback port.

It runs in a subprocess with a scrubbed environment (no proxy variables, no keys, no
``CONFIG_FILE``): only ``PATH``, ``HOME`` and a temporary folder. :func:`start` waits until
``GET /v1/models`` answers (the model is loaded before uvicorn listens) and fails with the
server's own log when it exits or does not answer in time; :meth:`LlamaCppServer.stop` kills it
and waits for it. Without the server extra's packages the tests that need it are skipped, saying
what to install.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import httpx

from proxy.engine.model_files import bundled_model_path
from tests.load_factor import CEILING_S
from tests.loopback import free_port, poll_ready

READY_TIMEOUT_S = CEILING_S
EXTRA = ("fastapi", "sse_starlette", "starlette_context", "pydantic_settings")


def missing() -> str | None:
    """Why the server cannot run here, or None."""
    absent = [name for name in EXTRA if importlib.util.find_spec(name) is None]
    if absent:
        return "llama_cpp.server needs the test extra: " + ", ".join(absent) + " missing"
    return None


@dataclass
class LlamaCppServer:
    proc: subprocess.Popen[bytes]
    port: int
    log: Path

    @property
    def root(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def api_base(self) -> str:
        return self.root + "/v1"

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        """Kill the server (SIGKILL: as a box that dies) and wait for it."""
        if self.alive():
            self.proc.kill()
        self.proc.wait(timeout=30)


def start(folder: Path, *, n_ctx: int = 2048, threads: int = 1) -> LlamaCppServer:
    """Start the server in ``folder`` (its log is ``folder/llama_cpp_server.log``) and wait
    until it answers."""
    port = free_port()
    log = folder / "llama_cpp_server.log"
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(folder)}
    env["TMPDIR"] = str(folder)
    command = [
        sys.executable, "-m", "llama_cpp.server",
        "--model", str(bundled_model_path()),
        "--host", "127.0.0.1", "--port", str(port),
        "--n_ctx", str(n_ctx), "--n_threads", str(threads), "--n_threads_batch", str(threads),
        "--verbose", "false",
    ]  # fmt: skip
    with log.open("wb") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=folder)
    server = LlamaCppServer(proc=proc, port=port, log=log)

    def answers() -> bool:
        return httpx.get(server.api_base + "/models", timeout=2).status_code == 200

    problem = poll_ready(proc, answers, READY_TIMEOUT_S, every_s=0.2)
    if problem:
        raise RuntimeError(f"llama_cpp.server {problem}: {log.read_text(errors='replace')}")
    return server
