"""The engine worker process as the proxy holds it, and the jobs running in it.

:class:`WorkerLink` owns one worker process at a time (``worker.py``, started with ``spawn`` and
an allow-listed environment, never the proxy's keys: ``worker_env.py``) and the duplex pipe to
it. Its start waits for the worker's first message: ``("ready", info)`` once the model is loaded,
or ``("fatal", message)``, which becomes :class:`ModelLoadError`. A reader thread then hands each
message to the event loop, tagged with the worker's generation so that a late message from a
replaced worker is told apart: a job's tokens, its answer or its error, and a batched worker's
progress report. :meth:`WorkerLink.run` sends a job and waits for its answer, asks it to stop
when its client goes away, and kills the worker when a job outlives its deadline by more than a
grace. When the worker exits, its jobs fail with :class:`EngineCrashed` and another worker is
started in the background, after a backoff that grows with consecutive crashes; one stopped on
purpose (:meth:`WorkerLink.kill`) is replaced too but is not counted as a crash.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import multiprocessing as mp
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import structlog

from proxy.engine.batch.forecast import CHUNK
from proxy.engine.engine_stats import EngineStats
from proxy.engine.model_files import ModelLoadError
from proxy.engine.worker import worker_main
from proxy.engine.worker_env import WorkerProcess
from proxy.errors import EngineCrashed, EngineError, EngineTimeout

__all__ = [
    "KILL_GRACE_S",
    "RESTART_BACKOFF_S",
    "ContextOverflow",
    "Unsupported",
    "WorkerLink",
    "seconds_left",
]

log = structlog.get_logger(__name__)

KILL_GRACE_S = 1.0
RESTART_BACKOFF_S = (0.5, 1.0, 2.0, 5.0, 10.0)


class ContextOverflow(EngineError):
    reason = "context_overflow"


class Unsupported(EngineError):
    """The worker could not build what the request needs (its grammar): the API must answer."""

    reason = "unsupported"


@dataclass
class _Job:
    job_id: int
    future: asyncio.Future[dict[str, Any]]
    on_token: Callable[[str], None] | None
    deadline: float
    ticket: int = 0  # its WorkTracker ticket


class WorkerLink:
    """One worker process at a time, and its pipe; see the module docstring."""

    def __init__(self, *, stats: EngineStats, private_env: Collection[str]) -> None:
        self.stats = stats
        self.private_env = tuple(private_env)
        self.jobs: dict[int, _Job] = {}
        # What a batched worker last reported of its jobs: prompt tokens left, answer tokens.
        self.progress: dict[int, tuple[int, int]] = {}
        self._ids = itertools.count(1)
        self.state = "stopped"
        self.error: str | None = None
        self.info: dict[str, Any] = {}
        self.ready = asyncio.Event()
        self.generation = 0
        self.proc: Any = None
        self.conn: Connection | None = None
        self._ctx = mp.get_context("spawn")
        # The id of the single-path job to cancel, shared with the worker (worker.py).
        self.cancel: Any = self._ctx.Value("q", 0, lock=False)
        self._options: dict[str, Any] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closing = False
        self._restart_task: asyncio.Task[None] | None = None
        self._crash_streak = 0
        self._killed_generation = 0  # a worker we stopped on purpose is not a crash

    async def start(self, options: dict[str, Any]) -> None:
        """Start the worker with these ``worker_main`` options and wait until its model is
        loaded. Raises ModelLoadError."""
        self._loop = asyncio.get_running_loop()
        self._options = dict(options)
        await self._spawn()

    def send(self, message: tuple[Any, ...]) -> None:
        """Write to the worker; OSError or ValueError when it is gone."""
        if self.conn is None:
            raise OSError("no engine worker")
        self.conn.send(message)

    async def _spawn(self) -> None:
        assert self._loop is not None
        self.state = "starting"
        self.ready.clear()
        self.generation += 1
        generation = self.generation
        parent, child = self._ctx.Pipe(duplex=True)
        proc = WorkerProcess(
            target=worker_main,
            args=(child, self.cancel, self._options),
            name="frugal-engine",
            daemon=True,
            private_env=self.private_env,
        )
        await asyncio.to_thread(proc.start)
        child.close()
        self.proc, self.conn = proc, parent
        first: asyncio.Future[tuple[Any, ...]] = self._loop.create_future()
        reader = threading.Thread(
            target=self._read, args=(parent, generation, first), daemon=True, name="engine-reader"
        )
        reader.start()
        message = await first
        if message[0] == "fatal":
            self.state = "failed"
            self.error = str(message[1])
            raise ModelLoadError(self.error)
        if message[0] != "ready":
            self.state = "failed"
            self.error = "the engine worker exited while loading the model"
            raise ModelLoadError(self.error)
        self.info = dict(message[1])
        self.stats.calibrated(self.info.get("calibration"))
        self.state = "ready"
        self.error = None
        self.ready.set()
        log.info("engine_ready", **{k: v for k, v in self.info.items() if k != "model_path"})
        relevance = self.info.get("relevance") or {}
        if self._options.get("relevance") and not relevance.get("enabled"):
            log.warning("quality_relevance_off", detail=relevance.get("reason"))

    def _read(
        self, conn: Connection, generation: int, first: asyncio.Future[tuple[Any, ...]]
    ) -> None:
        """Reader thread: forwards each message from the worker to the event loop."""
        assert self._loop is not None
        loop = self._loop
        got_first = False
        while True:
            try:
                message = conn.recv()
            except (EOFError, OSError):
                break
            if not got_first:
                got_first = True
                loop.call_soon_threadsafe(_resolve, first, message)
                continue
            loop.call_soon_threadsafe(self._message, generation, message)
        if not got_first:
            loop.call_soon_threadsafe(_resolve, first, ("exited",))
        else:
            loop.call_soon_threadsafe(self._exited, generation)

    def _exited(self, generation: int) -> None:
        if generation != self.generation or self._closing:
            return
        self.state = "restarting"
        self.ready.clear()
        code = self.proc.exitcode if self.proc is not None else None
        if generation != self._killed_generation:
            self.stats.crashes += 1
            self._crash_streak += 1
            log.warning("engine_exited", exitcode=code, restarts=self.stats.restarts)
        for job in list(self.jobs.values()):
            _fail(job.future, EngineCrashed(f"the engine worker exited (code {code})"))
        if self._restart_task is None or self._restart_task.done():
            self._restart_task = asyncio.ensure_future(self._restart())

    async def _restart(self) -> None:
        await asyncio.to_thread(self._reap)
        while not self._closing:
            if self._crash_streak:
                streak = min(self._crash_streak, len(RESTART_BACKOFF_S))
                await asyncio.sleep(RESTART_BACKOFF_S[streak - 1])
            try:
                self.stats.restarts += 1
                await self._spawn()
                return
            except ModelLoadError as exc:
                log.error("engine_restart_failed", error=str(exc))
                self._crash_streak += 1

    def _reap(self) -> None:
        proc = self.proc
        if proc is not None:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5)

    def _message(self, generation: int, message: tuple[Any, ...]) -> None:
        kind = message[0]
        if kind == "progress":
            if generation == self.generation:
                self.progress = message[1]["jobs"]
                self.stats.batch = message[1]["batch"]
            return
        job = self.jobs.get(message[1])
        if generation != self.generation or job is None:
            return
        if kind == "token":
            if job.on_token is not None:
                job.on_token(message[2])
        elif kind == "done":
            self.stats.completed += 1
            self.stats.observe(message[2])
            self._crash_streak = 0
            _resolve(job.future, message[2])
        elif kind == "error":
            errors = {"context_overflow": ContextOverflow, "unsupported": Unsupported}
            error: EngineError = errors.get(message[2], EngineCrashed)(message[3])
            _fail(job.future, error)

    async def run(
        self,
        request: dict[str, Any],
        deadline: float,
        on_token: Callable[[str], None] | None,
        kind: str = "chat",
        ticket: int = 0,
        priority: str = "interactive",
    ) -> dict[str, Any]:
        """Run one job on the worker: its answer, or the error it ended with; ``priority``
        ``"deferred"`` pauses it while interactive jobs run (``priority.py``). Past its
        deadline (and a grace, :meth:`grace_s`) the worker is killed; cancelled (the client
        went away), the job is asked to stop, and the worker is killed if it does not."""
        assert self._loop is not None
        job = _Job(next(self._ids), self._loop.create_future(), on_token, deadline, ticket)
        self.jobs[job.job_id] = job
        try:
            self.send(("job", job.job_id, request, on_token is not None, deadline, kind, priority))
        except (OSError, ValueError) as exc:
            self.jobs.pop(job.job_id, None)
            raise EngineCrashed("the local engine is not reachable") from exc
        try:
            # The worker stops itself at the deadline and returns a partial answer; give it a
            # moment to do so before deciding it is stuck.
            return await asyncio.wait_for(
                asyncio.shield(job.future), timeout=seconds_left(deadline) + self.grace_s()
            )
        except TimeoutError:
            self.stats.timeouts += 1
            self.kill("deadline")
            raise EngineTimeout("the local engine missed its deadline and was stopped") from None
        except asyncio.CancelledError:
            # The client went away: stop the generation, then let the next job run.
            self.cancel.value = job.job_id
            if self.parallel > 1:  # several jobs in flight: the shared value holds one id
                with contextlib.suppress(OSError, ValueError):
                    self.send(("cancel", job.job_id))
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(asyncio.shield(job.future), timeout=KILL_GRACE_S)
            if not job.future.done():
                self.kill("cancelled")
            raise
        finally:
            self.jobs.pop(job.job_id, None)
            if not job.future.done():
                job.future.cancel()
            elif not job.future.cancelled():
                job.future.exception()  # mark retrieved

    @property
    def parallel(self) -> int:
        return int(self._options.get("parallel", 1))

    def grace_s(self) -> float:
        """How long past its deadline a job may take to stop by itself.

        A job checks its deadline between steps: each token, and each prompt chunk of up to
        ``n_batch`` (512) tokens, alone (``generate.py`` reads a prompt chunk by chunk) as in a
        batch (where the step may be another sequence's chunk). Killing the worker in such a
        step would throw its model away (and, in a batch, fail every sequence), so the grace
        covers the longest step twice over at the measured prefill rate: a loaded machine can
        stretch a step well past its usual time.
        """
        rate = self.stats.prefill_tok_s
        chunk_s = CHUNK / rate if rate else 10.0
        return KILL_GRACE_S + 2.0 * chunk_s

    def kill(self, why: str) -> None:
        """Stop a worker that did not stop by itself; another one is started."""
        proc = self.proc
        if proc is not None and proc.is_alive():
            log.warning("engine_killed", why=why, pid=proc.pid)
            self._killed_generation = self.generation
            proc.kill()

    async def stop(self) -> None:
        """Stop the worker: politely first, then by force."""
        self._closing = True
        self.state = "stopped"
        if self._restart_task is not None:
            self._restart_task.cancel()
        conn, proc = self.conn, self.proc
        if conn is not None:
            with contextlib.suppress(OSError, ValueError):
                conn.send(("shutdown",))
        if proc is not None:
            await asyncio.to_thread(proc.join, 3)
            if proc.is_alive():
                proc.kill()
                await asyncio.to_thread(proc.join, 3)
        if conn is not None:
            conn.close()


def seconds_left(deadline: float) -> float:
    """Seconds from now to ``deadline`` (a ``time.monotonic()`` value), never below 0."""
    return max(0.0, deadline - time.monotonic())


def _resolve(future: asyncio.Future[Any], value: Any) -> None:
    if not future.done():
        future.set_result(value)


def _fail(future: asyncio.Future[Any], exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)
