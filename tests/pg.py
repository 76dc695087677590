"""A real PostgreSQL server for the tests: initdb and pg_ctl in a temporary folder, on a free
loopback port, with fsync off (the tests need no durability across a power cut).

PostgreSQL refuses to run as root; as root the server runs as the ``postgres`` user (created by
Debian's package, which ``./dev test`` installs) through ``runuser``. Without the binaries the
PostgreSQL half of the parametrised tests is skipped, saying what to install.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tests.loopback import free_port

BIN_DIRS = (
    "/usr/lib/postgresql/15/bin",
    "/usr/lib/postgresql/16/bin",
    "/usr/lib/postgresql/17/bin",
)
USER = "frugal"


def binaries() -> Path | None:
    for folder in BIN_DIRS:
        if Path(folder, "initdb").is_file():
            return Path(folder)
    found = shutil.which("initdb")
    return Path(found).parent if found else None


@dataclass
class Server:
    """A running server; :meth:`database` makes an empty database and returns its URL."""

    root: Path
    port: int
    bin: Path
    runner: list[str]
    _names: Iterator[int] = field(default_factory=itertools.count)

    @property
    def admin_url(self) -> str:
        return f"postgresql://{USER}@127.0.0.1:{self.port}/postgres"

    def database(self) -> str:
        import psycopg

        name = f"t{os.getpid()}_{next(self._names)}"
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return f"postgresql://{USER}@127.0.0.1:{self.port}/{name}"

    def pg_ctl(self, *args: str) -> None:
        data = str(self.root / "data")
        subprocess.run(
            [*self.runner, str(self.bin / "pg_ctl"), "-D", data, *args],
            check=True,
            capture_output=True,
            timeout=60,
        )

    def start(self) -> None:
        options = f"-k {self.root} -h 127.0.0.1 -p {self.port} -c fsync=off -c max_connections=200"
        self.pg_ctl("-o", options, "-l", str(self.root / "log"), "-w", "start")

    def stop(self) -> None:
        self.pg_ctl("-m", "immediate", "-w", "stop")


@contextlib.contextmanager
def running() -> Iterator[Server | None]:
    """A started server (stopped and removed afterwards), or None without the binaries."""
    folder = binaries()
    if folder is None:
        yield None
        return
    runner: list[str] = []
    owner = None
    if os.geteuid() == 0:
        owner = pwd.getpwnam("postgres")
        runner = ["runuser", "-u", "postgres", "--"]
    top = Path(tempfile.mkdtemp(prefix="frugal-pg-"))
    top.chmod(0o755)
    root = top / "pg"
    root.mkdir()
    if owner is not None:
        os.chown(root, owner.pw_uid, owner.pw_gid)
    subprocess.run(
        [*runner, str(folder / "initdb"), "-D", str(root / "data"), "-U", USER]
        + ["--auth=trust", "-E", "UTF8", "--no-sync"],
        check=True,
        capture_output=True,
        timeout=120,
    )
    server = Server(root, free_port(), folder, runner)
    server.start()
    try:
        yield server
    finally:
        with contextlib.suppress(subprocess.SubprocessError):
            server.stop()
        shutil.rmtree(top, ignore_errors=True)
