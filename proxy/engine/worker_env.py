"""The engine worker's environment: what llama.cpp and Python need, never a secret.

The ``spawn`` start method execs a fresh interpreter that inherits the proxy's whole
environment, and that environment holds the upstream API key (``[fallback] api_key_env``), the
client keys (``[server] api_keys_env``) and whatever else the service was given. The worker,
which runs llama.cpp on text from strangers, needs none of it.

:class:`WorkerProcess` is a spawn-context ``Process`` whose launch hands the new interpreter an
explicit environment, built by :func:`worker_environment` at each start (restarts included):

- kept: the names in :data:`ALLOWED` and those starting with :data:`ALLOWED_PREFIXES` (locale,
  temp folder, thread and BLAS tuning, ``GGML_*``/``LLAMA*``, ``PYTHON*``, the cache folders);
- dropped, even when allowed above: any name holding :data:`SECRET_MARKERS` (``API_KEY``,
  ``TOKEN``, ``SECRET``, ``PASSWORD``, ...), and the names the config says hold keys.

The environment is given to the ``exec`` itself (through :class:`subprocess.Popen`, which passes
the pipe descriptors the child needs), rather than cleared in the child's bootstrap: a child that
deletes variables from ``os.environ`` still shows them in ``/proc/PID/environ``, which keeps the
environment the process was started with.

multiprocessing's resource tracker, the other child a spawn needs, is started the same way:
:func:`start_tracker` launches it with this environment before the first worker (multiprocessing
would start it lazily with the proxy's whole environment) and records it where multiprocessing
looks for it, so that every later spawn and named semaphore uses that one.
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import subprocess
from collections.abc import Collection, Iterable, Mapping
from multiprocessing import popen_spawn_posix, reduction, resource_tracker, spawn, util
from multiprocessing.context import SpawnProcess, set_spawning_popen
from typing import Any

from proxy.config.secrets import SECRET_MARKERS, is_secret_name

__all__ = [
    "ALLOWED",
    "ALLOWED_PREFIXES",
    "SECRET_MARKERS",
    "WorkerProcess",
    "is_secret",
    "start_tracker",
    "worker_environment",
]

ALLOWED = frozenset(
    {
        "PATH",
        "HOME",
        "USER",
        "LOGNAME",
        "SHELL",
        "LANG",
        "LANGUAGE",
        "TZ",
        "TERM",
        "NO_COLOR",
        "TMPDIR",
        "TEMP",
        "TMP",
        "LD_LIBRARY_PATH",
        "VIRTUAL_ENV",
        "FRUGAL_CACHE_DIR",
        "XDG_CACHE_HOME",
        "CUDA_VISIBLE_DEVICES",
    }
)
ALLOWED_PREFIXES = (
    "LC_",
    "PYTHON",
    "OMP_",
    "KMP_",
    "GOMP_",
    "OPENBLAS_",
    "GOTO_",
    "MKL_",
    "BLIS_",
    "GGML_",
    "LLAMA",
)


def is_secret(name: str) -> bool:
    """Whether a variable's name marks it as a secret (:data:`SECRET_MARKERS`)."""
    return is_secret_name(name)


def worker_environment(environ: Mapping[str, str], private: Iterable[str] = ()) -> dict[str, str]:
    """The allow-listed part of ``environ``, less secrets and the ``private`` names."""
    denied = {name for name in private if name}
    return {
        name: value
        for name, value in environ.items()
        if (name in ALLOWED or name.startswith(ALLOWED_PREFIXES))
        and not is_secret(name)
        and name not in denied
    }


class WorkerProcess(SpawnProcess):
    """A ``spawn`` process started with :func:`worker_environment` of the proxy's environment;
    ``private_env`` names more variables to leave out (the config's key variables)."""

    def __init__(self, *args: Any, private_env: Collection[str] = (), **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.private_env = tuple(private_env)

    @staticmethod
    def _Popen(process_obj: Any) -> Any:  # noqa: N802 - multiprocessing's name
        return _ScrubbedPopen(process_obj)


class _ScrubbedPopen(popen_spawn_posix.Popen):
    """multiprocessing's spawn launch (``popen_spawn_posix.Popen._launch``), with the exec
    given an environment; the child is reaped through the :class:`subprocess.Popen`."""

    _child: subprocess.Popen[bytes]
    _fds: list[int]  # set by the base class: the descriptors the child inherits

    def _launch(self, process_obj: Any) -> None:
        private = getattr(process_obj, "private_env", ())
        tracker_fd = start_tracker(private)
        self._fds.append(tracker_fd)
        prep_data = spawn.get_preparation_data(process_obj._name)
        fp = io.BytesIO()
        set_spawning_popen(self)
        try:
            reduction.dump(prep_data, fp)
            reduction.dump(process_obj, fp)
        finally:
            set_spawning_popen(None)
        env = worker_environment(os.environ, private)
        parent_r = child_w = child_r = parent_w = None
        try:
            parent_r, child_w = os.pipe()
            child_r, parent_w = os.pipe()
            cmd = spawn.get_command_line(tracker_fd=tracker_fd, pipe_handle=child_r)
            self._fds.extend([child_r, child_w])
            self._child = subprocess.Popen(
                cmd,
                executable=spawn.get_executable(),
                env=env,
                pass_fds=sorted(set(self._fds)),
                close_fds=True,
            )
            self.pid = self._child.pid
            self.sentinel = parent_r
            with open(parent_w, "wb", closefd=False) as f:
                f.write(fp.getbuffer())
        finally:
            to_close = [fd for fd in (parent_r, parent_w) if fd is not None]
            self.finalizer = util.Finalize(self, _close_fds, to_close)
            for fd in (child_r, child_w):
                if fd is not None:
                    os.close(fd)

    def poll(self, flag: int = os.WNOHANG) -> int | None:
        if self.returncode is None:
            code = self._child.poll() if flag == os.WNOHANG else self._child.wait()
            self.returncode = code
        return self.returncode


def start_tracker(private: Iterable[str] = ()) -> int:
    """The descriptor of multiprocessing's resource tracker, which is started first, when it is
    not running, with :func:`worker_environment` of the proxy's environment (``private``: more
    names to leave out).

    multiprocessing starts the tracker lazily, on the first spawn or named semaphore, with
    ``util.spawnv_passfds``, which hands it the parent's whole environment. Here it is started
    as multiprocessing starts it (its ``main`` given the read end of its pipe, SIGINT and SIGTERM
    blocked until it has set its handlers), by :func:`os.posix_spawn` with an explicit
    environment, and recorded in the tracker object where multiprocessing records its own, so
    that ``getfd``, ``register`` and later spawns find it running and use it. Its pid is bare,
    as multiprocessing's is: reaped by multiprocessing if it dies, never by a ``Popen``.
    """
    tracker: Any = getattr(resource_tracker, "_resource_tracker")  # noqa: B009 - private
    with tracker._lock:
        if tracker._fd is not None and tracker._check_alive():
            return int(tracker._fd)
        if tracker._fd is not None:  # it died: reap it, as multiprocessing does
            os.close(tracker._fd)
            with contextlib.suppress(ChildProcessError):
                if tracker._pid is not None:
                    os.waitpid(tracker._pid, 0)
            tracker._fd = tracker._pid = None
        env = worker_environment(os.environ, private)
        read_end, write_end = os.pipe()
        try:
            # Only the read end is inheritable (the write end, like every descriptor Python
            # opens, is closed on exec): another child started meanwhile could inherit a read
            # end, which keeps nothing open that the tracker waits to see closed.
            os.set_inheritable(read_end, True)
            exe = spawn.get_executable()
            flags: list[str] = getattr(util, "_args_from_interpreter_flags")()  # noqa: B009
            command = [exe, *flags, "-c", _TRACKER_MAIN % read_end]
            pid = os.posix_spawn(exe, command, env, setsigmask=(signal.SIGINT, signal.SIGTERM))
        except BaseException:
            os.close(write_end)
            raise
        finally:
            os.close(read_end)
        tracker._fd, tracker._pid = write_end, pid
        return write_end


_TRACKER_MAIN = "from multiprocessing.resource_tracker import main;main(%d)"


def _close_fds(*fds: int) -> None:
    for fd in fds:
        os.close(fd)
