"""The processes of ``bench/overhead.py``: the fast upstream, ``frugal serve`` (this checkout's,
or another commit's from a ``git worktree``), LiteLLM proxy from its own venv; each started on
a free loopback port, pinned to CPUs, waited for and stopped. Also the CPU a process tree has
used, read from ``/proc``.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
PYTHON = sys.executable
FRUGAL = str(Path(sys.executable).with_name("frugal"))
LITELLM_VENV = BENCH / ".venv-litellm"
LITELLM_CONFIG = BENCH / "litellm_config.yaml"
UPSTREAM_KEY = "sk-bench-upstream-" + "0" * 16
MODEL = "gpt-4o-mini"
CLK_TCK = os.sysconf("SC_CLK_TCK")

sys.path.insert(0, str(ROOT))
from tests.loopback import free_port, poll_ready, terminate  # noqa: E402

# -- processes -----------------------------------------------------------------------------------


def pinned(cpus: str | None, argv: list[str]) -> list[str]:
    return ["taskset", "-c", cpus, *argv] if cpus else argv


def proc_tree_cpu_s(pid: int) -> float:
    """User + system CPU seconds of ``pid`` and every process descended from it."""
    children: dict[int, list[int]] = {}
    ticks: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                stat = handle.read()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        ppid = int(fields[1])
        children.setdefault(ppid, []).append(int(entry))
        ticks[int(entry)] = int(fields[11]) + int(fields[12])  # utime, stime
    total, todo = 0, [pid]
    while todo:
        current = todo.pop()
        total += ticks.get(current, 0)
        todo.extend(children.get(current, []))
    return total / CLK_TCK


@dataclass
class Server:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path

    def check_alive(self) -> None:
        if self.proc.poll() is not None:
            tail = self.log.read_text(errors="replace")[-3000:]
            raise SystemExit(f"{self.name} exited with {self.proc.returncode}:\n{tail}")

    def stop(self) -> int:
        terminate(self.proc, timeout_s=30)
        return int(self.proc.returncode)


def start(
    name: str, argv: list[str], tmp: Path, env: dict[str, str], ready: Callable[[], bool]
) -> Server:
    log = tmp / f"{name}.log"
    with log.open("wb") as sink:
        proc = subprocess.Popen(argv, stdout=sink, stderr=subprocess.STDOUT, env=env, cwd=tmp)
    problem = poll_ready(proc, ready, 180, every_s=0.2)
    if problem:
        tail = log.read_text(errors="replace")[-3000:]
        raise SystemExit(f"{name} {problem}; see {log}:\n{tail}")
    return Server(name, proc, log)


def ok(url: str, headers: dict[str, str] | None = None) -> bool:
    return httpx.get(url, headers=headers, timeout=2).status_code == 200


@contextmanager
def upstream(kind: str, cpus: str | None, tmp: Path) -> Iterator[str]:
    port = free_port()
    if kind == "fast":
        argv = [PYTHON, str(BENCH / "upstream_fast.py"), "--port", str(port)]
    else:
        argv = [PYTHON, "-m", "tests.fake_api", "--port", str(port), "--latency", "0"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    base = f"http://127.0.0.1:{port}/v1"

    def ready() -> bool:
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
        return httpx.post(base + "/chat/completions", json=body, timeout=2).status_code == 200

    server = start(f"upstream-{kind}", pinned(cpus, argv), tmp, env, ready)
    try:
        yield base
    finally:
        server.stop()


def frugal_config(
    tmp: Path,
    name: str,
    base: str,
    port: int,
    models: dict[str, str],
    ledger_url: str = "",
    responses_fallback: str = "",
) -> Path:
    mapping = "".join(f'"{k}" = "{v}"\n' for k, v in models.items())
    url_line = f'url = "{ledger_url}"' if ledger_url else ""
    # left out unless asked for: a commit from before ``[fallback] responses`` would reject it
    mode_line = f'responses = "{responses_fallback}"' if responses_fallback else ""
    config = tmp / f"{name}.toml"
    config.write_text(
        f"""
[server]
port = {port}
log_format = "json"

[local]
n_threads = 1

[fallback]
api_base = "{base}"
api_key_env = "BENCH_UPSTREAM_KEY"
max_retries = 1
timeout_s = 30
{mode_line}

[fallback.models]
{mapping}
[ledger]
path = "{tmp / (name + ".db")}"
{url_line}
"""
    )
    return config


@contextmanager
def frugal(
    name: str,
    base: str,
    cpus: str | None,
    tmp: Path,
    models: dict[str, str],
    ledger_url: str = "",
    tree: Path | None = None,
    responses_fallback: str = "",
) -> Iterator[tuple[str, Server, Path]]:
    """A ``frugal serve``; with ``tree``, the ``proxy/`` of that checkout (another commit's, in
    a ``git worktree``) on ``PYTHONPATH`` instead of this one's, run with this venv."""
    port = free_port()
    config = frugal_config(tmp, name, base, port, models, ledger_url, responses_fallback)
    env = {
        **os.environ,
        "BENCH_UPSTREAM_KEY": UPSTREAM_KEY,
        "HOSTED_VLLM_API_BASE": base,
        "HOSTED_VLLM_API_KEY": UPSTREAM_KEY,
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    }
    if tree is not None:
        env["PYTHONPATH"] = str(tree)
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        health = httpx.get(url + "/healthz", timeout=2).json()
        # The ledger's token counter imports litellm on a thread at start-up (seconds of CPU):
        # measuring before it is done would measure that import.
        counter = health["ledger"].get("token_counter", "ready")
        return bool(health["engine"]["state"] == "ready" and counter != "loading")

    argv = [FRUGAL, "serve", "--config", str(config)]
    if tree is not None:
        argv = [PYTHON, "-m", "proxy", "serve", "--config", str(config)]
    server = start(name, pinned(cpus, argv), tmp, env, ready)
    try:
        yield url, server, tmp / (name + ".db")
    finally:
        code = server.stop()
        if code != 0:
            print(f"warning: {name} exited with {code}; see {server.log}", file=sys.stderr)


def runnable_tree(tree: Path) -> Path:
    """``tree`` made runnable from ``PYTHONPATH``: the SQL migrations install as
    ``proxy.migrations`` (pyproject's package-dir), so a link ``proxy/migrations`` to the tree's
    own ``migrations/`` is made, or the installed (newer) ones would be applied."""
    tree = tree.resolve()
    if not (tree / "proxy" / "__main__.py").is_file():
        raise SystemExit(f"--tree {tree}: no proxy/__main__.py there")
    link = tree / "proxy" / "migrations"
    if not link.exists():
        link.symlink_to(tree / "migrations", target_is_directory=True)
    return tree


def ensure_litellm_venv(venv: Path) -> Path:
    exe = venv / "bin" / "litellm"
    if not exe.exists():
        print(f"creating {venv} with pip install 'litellm[proxy]' ...", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "litellm[proxy]"], check=True)
    return exe


@contextmanager
def litellm_proxy(
    base: str, cpus: str | None, tmp: Path, venv: Path
) -> Iterator[tuple[str, Server, str]]:
    exe = ensure_litellm_venv(venv)
    port = free_port()
    master_key = "sk-" + secrets.token_urlsafe(32)
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "VIRTUAL_ENV")} | {
        "BENCH_UPSTREAM_BASE": base,
        "BENCH_UPSTREAM_KEY": UPSTREAM_KEY,
        "LITELLM_MASTER_KEY": master_key,
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "LITELLM_LOG": "ERROR",
    }
    url = f"http://127.0.0.1:{port}"
    argv = [str(exe), "--config", str(LITELLM_CONFIG), "--host", "127.0.0.1"]
    argv += ["--port", str(port), "--num_workers", "1"]
    server = start(
        "litellm-proxy",
        pinned(cpus, argv),
        tmp,
        env,
        lambda: ok(url + "/health/liveliness"),
    )
    try:
        yield url, server, master_key
    finally:
        server.stop()
