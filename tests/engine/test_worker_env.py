"""The children the engine needs start with a clean environment (proxy/engine/worker_env.py):
the worker, and multiprocessing's resource tracker, which would otherwise inherit every secret."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

SECRET = "sk-tracker-secret-0123456789abcdef"

# A proxy-like parent: a secret in its environment, the tracker started as the worker's launch
# starts it, then a named semaphore registered with it (as a spawn context's locks are).
PARENT = textwrap.dedent(
    """
    import sys
    from multiprocessing import get_context, resource_tracker
    from proxy.engine.worker_env import start_tracker

    fd = start_tracker(("UPSTREAM_OF_MINE",))
    lock = get_context("spawn").Lock()  # registers its semaphore with the running tracker
    tracker = resource_tracker._resource_tracker
    assert resource_tracker.getfd() == fd == start_tracker()  # the same one, not another
    print(tracker._pid, flush=True)
    sys.stdin.readline()  # held open while the test reads the tracker's environment
    """
)


def test_the_resource_tracker_starts_without_the_proxys_secrets() -> None:
    env = {"PATH": "/usr/bin:/bin", "UPSTREAM_OF_MINE": SECRET, "OPENAI_API_KEY": SECRET[::-1]}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])
    parent = subprocess.Popen(
        [sys.executable, "-W", "error", "-c", PARENT],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert parent.stdout is not None and parent.stdin is not None
        line = parent.stdout.readline()
        assert line.strip().isdigit(), parent.communicate(timeout=30)
        pid = int(line)
        environ = Path(f"/proc/{pid}/environ").read_bytes()
        command = Path(f"/proc/{pid}/cmdline").read_bytes()
        parent_environ = Path(f"/proc/{parent.pid}/environ").read_bytes()
        _, errors = parent.communicate("\n", timeout=30)
    finally:
        if parent.poll() is None:
            parent.kill()
    entries = environ.split(b"\0")
    print(f"tracker {pid}: {command!r}; environment {sorted(entries)}")
    assert b"multiprocessing.resource_tracker" in command
    assert SECRET.encode() in parent_environ  # the parent did hold it
    assert SECRET.encode() not in environ and SECRET[::-1].encode() not in environ
    assert b"PATH=/usr/bin:/bin" in entries
    assert parent.returncode == 0 and errors == "", errors  # no warning, no leaked semaphore
