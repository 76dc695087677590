"""Loopback servers, on a thread or in another process: a bare TCP listener, an ASGI app under
uvicorn, and the helpers that start and stop a server process.

:class:`ThreadedServer` serves an app (the fake API, the judge, the proxy itself) with uvicorn on
a thread of the test process, on a socket it binds first, so the port is known before the
server runs; :func:`quiet_config` is the uvicorn set-up the stand-in servers share.

:class:`OnThread` is a loop on a thread of its own inside a ``with`` block. :class:`Listener`
is one: it accepts each connection, counts it and closes it at once; a subclass gives a
connection another end by overriding :meth:`Listener.handle`
(``tests/upstream/test_upstream.py`` reads the whole request first). ``url`` is the listener as
an API base (``http://…/v1``).

For a server in another process (``frugal serve``, llama.cpp's server, PostgreSQL), tests and
benchmarks alike: :func:`free_port` finds it a port, :func:`poll_ready` waits until it answers,
:func:`terminate` stops it (SIGTERM, then SIGKILL), and :func:`outlived` reaps the engine worker
of a server killed with SIGKILL. :func:`in_terminal` runs a command in a pseudo-terminal, as a
user at a shell runs it, and returns what it showed there (a progress bar draws only to one).
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import pty
import select
import signal
import socket
import struct
import subprocess
import termios
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Self

import httpx
import uvicorn

from tests.load_factor import CEILING_S


def free_port() -> int:
    """A loopback port free at the time of asking, for a server that binds it itself."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def terminate(proc: subprocess.Popen[Any], timeout_s: float = 30.0) -> int | None:
    """SIGTERM, then SIGKILL after ``timeout_s``: the exit status, or None if it had to be
    killed."""
    if proc.poll() is not None:
        return proc.returncode
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return None


def poll_ready(
    proc: subprocess.Popen[Any], ready: Callable[[], bool], timeout_s: float, every_s: float = 0.1
) -> str | None:
    """Ask ``ready()`` every ``every_s`` (an HTTP error or an unexpected answer counts as not
    yet) until it says yes: None. Otherwise what went wrong: ``proc`` exited first, or was not
    ready within ``timeout_s`` (then it is killed)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return f"exited early with status {proc.returncode}"
        try:
            if ready():
                return None
        except (httpx.HTTPError, KeyError, ValueError):
            pass
        time.sleep(every_s)
    proc.kill()
    proc.wait()
    return f"was not ready within {timeout_s:g} s"


async def outlived(pid: int, wait_s: float = 10.0) -> bool:
    """Wait up to ``wait_s`` for process ``pid`` (the engine worker of a killed server) to end;
    SIGKILL it and return True if it did not."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        await asyncio.sleep(0.1)
    os.kill(pid, signal.SIGKILL)
    return True


def in_terminal(
    command: list[str],
    *,
    env: dict[str, str],
    cwd: Path,
    columns: int | None = None,
    wait_s: float | None = None,
) -> tuple[int, bytes]:
    """Run ``command`` with a pseudo-terminal as its stdout and stderr (``columns`` wide, where
    given), read all it shows until it exits, and wait up to ``wait_s`` for its status: the
    status and the bytes shown."""
    leader, follower = pty.openpty()
    if columns is not None:
        fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    with subprocess.Popen(
        command, stdin=subprocess.DEVNULL, stdout=follower, stderr=follower, env=env, cwd=cwd
    ) as proc:
        os.close(follower)
        shown = b""
        while True:
            try:
                chunk = os.read(leader, 1 << 16)
            except OSError:  # EIO: the command exited and the terminal closed
                break
            if not chunk:
                break
            shown += chunk
        os.close(leader)
        return proc.wait(timeout=wait_s), shown


def quiet_config(app: Any, *, graceful_s: float | None = None) -> uvicorn.Config:
    """uvicorn's settings for a stand-in server: asyncio and h11, no lifespan, no access log,
    warnings only; ``graceful_s`` bounds how long stopping waits for open requests."""
    return uvicorn.Config(
        app,
        loop="asyncio",
        http="h11",
        lifespan="off",
        log_config=None,
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=graceful_s,
    )


class ThreadedServer:
    """``config``'s app served on ``host``:``port`` (0: a free port) by uvicorn on a thread."""

    def __init__(
        self, config: uvicorn.Config, *, host: str = "127.0.0.1", port: int = 0, name: str = "asgi"
    ) -> None:
        self.config = config
        self.host, self.port, self.name = host, port, name
        self.server: uvicorn.Server | None = None
        self.thread: threading.Thread | None = None

    def start(self, timeout_s: float = CEILING_S) -> int:
        """Serve, and return the port once uvicorn says it has started."""
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
        self.port = int(sock.getsockname()[1])
        self.server = server = uvicorn.Server(self.config)
        self.thread = thread = threading.Thread(
            target=server.run, kwargs={"sockets": [sock]}, name=self.name, daemon=True
        )
        thread.start()
        deadline = time.monotonic() + timeout_s
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                sock.close()
                raise RuntimeError(f"{self.name} did not start")
            time.sleep(0.002)
        return self.port

    def stop(self, timeout_s: float = 10.0) -> None:
        if self.server is None or self.thread is None:
            return
        self.server.should_exit = True
        self.thread.join(timeout=timeout_s)
        self.server = self.thread = None


class OnThread:
    """A loop run on a daemon thread of its own inside a ``with`` block: :meth:`_run` goes on
    until ``_stop`` is set, which leaving the block does before it joins the thread (for at
    most ``join_s``). The listener below, and the RSS watch and health poller of
    ``tests/faults_support.py``, are one each."""

    join_s = 5.0

    def __init__(self, name: str) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def _run(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=self.join_s)


class Listener(OnThread):
    """A loopback socket that counts the connections made to it (``connections``) and hands
    each to :meth:`handle`, which closes it at once."""

    def __init__(self) -> None:
        super().__init__("loopback-listener")
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = int(self.sock.getsockname()[1])
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self.connections = 0

    def handle(self, conn: socket.socket) -> None:
        """What happens to an accepted connection: here, it is closed."""
        conn.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            ready, _, _ = select.select([self.sock], [], [], 0.05)
            if not ready:
                continue
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            self.handle(conn)

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)
        self.sock.close()
