"""The proxy's handle on the engine worker process: start, queue, deadline, crash and restart.

One job runs at a time; others wait in a FIFO queue bounded by ``[local] max_queue``. A job past
its deadline is asked to stop (the worker checks the deadline every token); if the worker has not
answered a second later it is killed and replaced, so the CPU is never left working on an answer
nobody will read. A worker that dies for any reason fails its current job with
:class:`EngineCrashed` and is restarted in the background.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import multiprocessing as mp
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

import structlog

from proxy.config import LocalSettings
from proxy.engine.generate import ModelLoadError, bundled_model_path
from proxy.engine.worker import worker_main
from proxy.errors import EngineBusy, EngineCrashed, EngineError, EngineTimeout

log = structlog.get_logger(__name__)

KILL_GRACE_S = 1.0
RESTART_BACKOFF_S = (0.5, 1.0, 2.0, 5.0, 10.0)


class ContextOverflow(EngineError):
    reason = "context_overflow"


@dataclass
class _Job:
    job_id: int
    future: asyncio.Future[dict[str, Any]]
    on_token: Callable[[str], None] | None
    deadline: float


@dataclass
class EngineStats:
    """What the engine has done so far; decode and prefill rates are moving averages."""

    completed: int = 0
    timeouts: int = 0
    crashes: int = 0
    restarts: int = 0
    prefill_tok_s: float | None = None
    decode_tok_s: float | None = None
    alpha: float = field(default=0.2, repr=False)

    def observe(self, completion: dict[str, Any]) -> None:
        info = completion.get("frugal") or {}
        prefill_s, decode_s = info.get("prefill_s", 0.0), info.get("decode_s", 0.0)
        prefilled = info.get("prefilled_tokens", 0)
        decoded = (completion.get("usage") or {}).get("completion_tokens", 0)
        if prefilled >= 16 and prefill_s > 0:
            self.prefill_tok_s = self._ewma(self.prefill_tok_s, prefilled / prefill_s)
        if decoded >= 4 and decode_s > 0:
            self.decode_tok_s = self._ewma(self.decode_tok_s, (decoded - 1) / decode_s)

    def _ewma(self, old: float | None, new: float) -> float:
        return new if old is None else old + self.alpha * (new - old)


class LocalEngine:
    """Async client of one worker process."""

    def __init__(self, settings: LocalSettings) -> None:
        self.settings = settings
        self.model_path = settings.model_path or ""
        self.state = "stopped"
        self.error: str | None = None
        self.info: dict[str, Any] = {}
        self.stats = EngineStats()
        self._ctx = mp.get_context("spawn")
        self._cancel: Any = self._ctx.Value("q", 0, lock=False)
        self._ids = itertools.count(1)
        self._lock = asyncio.Lock()
        self._waiting = 0
        self._job: _Job | None = None
        self._proc: Any = None
        self._conn: Connection | None = None
        self._ready: asyncio.Event = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._generation = 0
        self._closing = False
        self._restart_task: asyncio.Task[None] | None = None
        self._crash_streak = 0

    # -- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the worker and wait until the model is loaded. Raises ModelLoadError."""
        self._loop = asyncio.get_running_loop()
        if not self.model_path:
            self.model_path = bundled_model_path()
        await self._spawn()

    async def _spawn(self) -> None:
        assert self._loop is not None
        self.state = "starting"
        self._ready.clear()
        self._generation += 1
        generation = self._generation
        parent, child = self._ctx.Pipe(duplex=True)
        options = {
            "model_path": self.model_path,
            "n_ctx": self.settings.n_ctx,
            "n_threads": self.settings.threads,
            "seed": self.settings.seed,
            "speculative": self.settings.speculative,
            "default_max_tokens": self.settings.default_max_tokens,
        }
        proc = self._ctx.Process(
            target=worker_main,
            args=(child, self._cancel, options),
            name="frugal-engine",
            daemon=True,
        )
        await asyncio.to_thread(proc.start)
        child.close()
        self._proc, self._conn = proc, parent
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
        self.state = "ready"
        self.error = None
        self._ready.set()
        log.info("engine_ready", **{k: v for k, v in self.info.items() if k != "model_path"})

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
            loop.call_soon_threadsafe(self._dispatch, generation, message)
        if not got_first:
            loop.call_soon_threadsafe(_resolve, first, ("exited",))
        else:
            loop.call_soon_threadsafe(self._on_exit, generation)

    def _dispatch(self, generation: int, message: tuple[Any, ...]) -> None:
        job = self._job
        if generation != self._generation or job is None or message[1] != job.job_id:
            return
        kind = message[0]
        if kind == "token":
            if job.on_token is not None:
                job.on_token(message[2])
        elif kind == "done":
            self.stats.completed += 1
            self.stats.observe(message[2])
            self._crash_streak = 0
            _resolve(job.future, message[2])
        elif kind == "error":
            error: EngineError = (
                ContextOverflow(message[3])
                if message[2] == "context_overflow"
                else EngineCrashed(message[3])
            )
            _fail(job.future, error)

    def _on_exit(self, generation: int) -> None:
        if generation != self._generation or self._closing:
            return
        self.state = "restarting"
        self._ready.clear()
        self.stats.crashes += 1
        self._crash_streak += 1
        code = self._proc.exitcode if self._proc is not None else None
        log.warning("engine_exited", exitcode=code, restarts=self.stats.restarts)
        if self._job is not None:
            _fail(self._job.future, EngineCrashed(f"the engine worker exited (code {code})"))
        if self._restart_task is None or self._restart_task.done():
            self._restart_task = asyncio.ensure_future(self._restart())

    async def _restart(self) -> None:
        await asyncio.to_thread(self._reap)
        while not self._closing:
            delay = RESTART_BACKOFF_S[min(self._crash_streak, len(RESTART_BACKOFF_S)) - 1]
            await asyncio.sleep(delay)
            try:
                self.stats.restarts += 1
                await self._spawn()
                return
            except ModelLoadError as exc:
                log.error("engine_restart_failed", error=str(exc))
                self._crash_streak += 1

    def _reap(self) -> None:
        proc = self._proc
        if proc is not None:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5)

    async def stop(self) -> None:
        """Stop the worker: politely first, then by force."""
        self._closing = True
        self.state = "stopped"
        if self._restart_task is not None:
            self._restart_task.cancel()
        conn, proc = self._conn, self._proc
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

    # -- jobs -------------------------------------------------------------------------------

    @property
    def queue_depth(self) -> int:
        return self._waiting

    @property
    def busy(self) -> bool:
        return self._job is not None

    async def chat(
        self,
        request: dict[str, Any],
        *,
        deadline: float,
        on_token: Callable[[str], None] | None = None,
    ) -> dict[str, Any]:
        """Run one chat completion before ``deadline`` (a ``time.monotonic()`` value)."""
        if self._waiting >= self.settings.max_queue:
            raise EngineBusy(f"the local queue is full ({self._waiting} waiting)")
        self._waiting += 1
        try:
            await asyncio.wait_for(self._lock.acquire(), timeout=_left(deadline))
        except TimeoutError as exc:
            self.stats.timeouts += 1
            raise EngineTimeout("the deadline passed while waiting in the local queue") from exc
        finally:
            self._waiting -= 1
        try:
            if not self._ready.is_set():
                try:
                    await asyncio.wait_for(self._ready.wait(), timeout=_left(deadline))
                except TimeoutError as exc:
                    raise EngineCrashed(f"the local engine is not ready ({self.state})") from exc
            return await self._run(request, deadline, on_token)
        finally:
            self._lock.release()

    async def _run(
        self,
        request: dict[str, Any],
        deadline: float,
        on_token: Callable[[str], None] | None,
    ) -> dict[str, Any]:
        assert self._loop is not None and self._conn is not None
        job = _Job(next(self._ids), self._loop.create_future(), on_token, deadline)
        self._job = job
        try:
            self._conn.send(("job", job.job_id, request, on_token is not None, deadline))
        except (OSError, ValueError) as exc:
            self._job = None
            raise EngineCrashed("the local engine is not reachable") from exc
        try:
            # The worker stops itself at the deadline and returns a partial answer; give it a
            # moment to do so before deciding it is stuck.
            return await asyncio.wait_for(
                asyncio.shield(job.future), timeout=_left(deadline) + KILL_GRACE_S
            )
        except TimeoutError:
            self.stats.timeouts += 1
            self._kill("deadline")
            raise EngineTimeout("the local engine missed its deadline and was stopped") from None
        except asyncio.CancelledError:
            # The client went away: stop the generation, then let the next job run.
            self._cancel.value = job.job_id
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(asyncio.shield(job.future), timeout=KILL_GRACE_S)
            if not job.future.done():
                self._kill("cancelled")
            raise
        finally:
            self._job = None
            if not job.future.done():
                job.future.cancel()
            elif not job.future.cancelled():
                job.future.exception()  # mark retrieved

    def _kill(self, why: str) -> None:
        proc = self._proc
        if proc is not None and proc.is_alive():
            log.warning("engine_killed", why=why, pid=proc.pid)
            proc.kill()

    def health(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "error": self.error,
            "model": self.info.get("model"),
            "pid": self.info.get("pid") if self.state == "ready" else None,
            "n_ctx": self.info.get("n_ctx", self.settings.n_ctx),
            "n_threads": self.settings.threads,
            "busy": self.busy,
            "queue_depth": self._waiting,
            "max_queue": self.settings.max_queue,
            "completed": self.stats.completed,
            "timeouts": self.stats.timeouts,
            "crashes": self.stats.crashes,
            "restarts": self.stats.restarts,
            "prefill_tok_s": _round(self.stats.prefill_tok_s),
            "decode_tok_s": _round(self.stats.decode_tok_s),
        }


def _left(deadline: float) -> float:
    return max(0.0, deadline - time.monotonic())


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def _resolve(future: asyncio.Future[Any], value: Any) -> None:
    if not future.done():
        future.set_result(value)


def _fail(future: asyncio.Future[Any], exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)
