"""The proxy's handle on the engine worker process: start, queue, deadline, crash and restart.

``[local] parallel`` jobs run at a time (one, by default; more are decoded together by the worker,
see ``batch.py``); others wait in a FIFO queue bounded by ``[local] max_queue``. A job past
its deadline is asked to stop (the worker checks the deadline every token); if the worker has not
answered a second later it is killed and replaced, so the CPU is never left working on an answer
nobody will read. A worker that dies for any reason fails its current jobs with
:class:`EngineCrashed` and is restarted in the background.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import multiprocessing as mp
import os
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

import structlog

from proxy.config import LocalSettings
from proxy.engine import memory
from proxy.engine.batch_forecast import BatchCosts, Forecast, Work, forecast
from proxy.engine.generate import ModelLoadError, bundled_model_path
from proxy.engine.gguf import GGUFError, GGUFHeader, read_header
from proxy.engine.rates import PendingWork, Rates, WorkTracker
from proxy.engine.worker import worker_main
from proxy.engine.worker_env import WorkerProcess
from proxy.errors import EngineBusy, EngineCrashed, EngineError, EngineTimeout

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


@dataclass
class EngineStats:
    """What the engine has done so far; decode and prefill rates are moving averages."""

    completed: int = 0
    timeouts: int = 0
    crashes: int = 0
    restarts: int = 0
    prefill_tok_s: float | None = None
    decode_tok_s: float | None = None
    rates_source: str = "none"
    speculated: int = 0  # requests that went through the speculative loop
    drafted: int = 0
    accepted: int = 0
    prefix_cache: dict[str, Any] | None = None
    batch: dict[str, Any] | None = None  # the worker's batch loop, as of the last answer
    sequence_tok_s: float | None = None  # decode rate of one sequence in the batch (EWMA)
    alpha: float = field(default=0.2, repr=False)

    def calibrated(self, calibration: dict[str, Any] | None) -> None:
        """Start from the worker's start-up measurements until real requests say otherwise."""
        if not calibration or self.rates_source == "requests":
            return
        self.prefill_tok_s = float(calibration["prefill_tok_s"])
        self.decode_tok_s = float(calibration["decode_tok_s"])
        self.rates_source = "calibration"

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    def observe(self, completion: dict[str, Any]) -> None:
        info = completion.get("frugal") or {}
        spec = info.get("speculative")
        if spec:
            self.speculated += 1
            self.drafted += int(spec.get("drafted", 0))
            self.accepted += int(spec.get("accepted", 0))
        if info.get("prefix_cache") is not None:
            self.prefix_cache = info["prefix_cache"]
        batch = info.get("batch")
        if batch:
            self.batch = batch.get("engine")
            if batch.get("tok_s"):
                self.sequence_tok_s = self._ewma(self.sequence_tok_s, float(batch["tok_s"]))
        prefill_s, decode_s = info.get("prefill_s", 0.0), info.get("decode_s", 0.0)
        prefilled = info.get("prefilled_tokens", 0)
        decoded = (completion.get("usage") or {}).get("completion_tokens", 0)
        if decoded == 0 and info.get("stop_cause") in ("deadline", "cancelled"):
            # Stopped during the prompt (or before it, a job whose deadline had passed in the
            # queue): only part of it was evaluated, so its time says nothing of the rate.
            prefilled = 0
        if prefilled >= 16 and prefill_s > 0:
            self.prefill_tok_s = self._ewma(self.prefill_tok_s, prefilled / prefill_s)
        if decoded >= 4 and decode_s > 0:
            self.decode_tok_s = self._ewma(self.decode_tok_s, (decoded - 1) / decode_s)
        if (prefilled >= 16 and prefill_s > 0) or (decoded >= 4 and decode_s > 0):
            self.rates_source = "requests"

    def _ewma(self, old: float | None, new: float) -> float:
        return new if old is None else old + self.alpha * (new - old)


class LocalEngine:
    """Async client of one worker process."""

    def __init__(
        self,
        settings: LocalSettings,
        *,
        relevance: bool = True,
        private_env: Collection[str] = (),
        weights_path: str = "",
        weights_optional: bool = False,
    ) -> None:
        self.settings = settings
        # [quality] weights_path: the gate's calibrated weights, loaded and checked in the worker
        self.weights_path = weights_path
        self.weights_optional = weights_optional  # auto_calibrate: the file may come later
        # Variables the worker must not inherit beyond worker_env's own rules: the config's key
        # variables (the app passes [fallback] and [server] ones; the backends' are added here).
        self.private_env = (*private_env, *(b.api_key_env for b in settings.backends))
        self.relevance = relevance  # load the quality gate's embedding model in the worker
        self.model_path = settings.model_path or ""
        self.state = "stopped"
        self.error: str | None = None
        self.info: dict[str, Any] = {}
        self.stats = EngineStats()
        self.work = WorkTracker()
        self.n_ctx = settings.n_ctx  # after the memory guard, what the worker really uses
        self.memory: memory.MemoryPlan | None = None
        self.max_token_bytes = 0
        self._ctx = mp.get_context("spawn")
        self._cancel: Any = self._ctx.Value("q", 0, lock=False)
        self._ids = itertools.count(1)
        self.parallel = max(1, settings.parallel)
        self._slots = asyncio.Semaphore(self.parallel)
        self._waiting = 0
        self._jobs: dict[int, _Job] = {}
        # What a batched worker last reported of its jobs: prompt tokens left, answer tokens.
        self._progress: dict[int, tuple[int, int]] = {}
        self._proc: Any = None
        self._conn: Connection | None = None
        self._ready: asyncio.Event = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._generation = 0
        self._closing = False
        self._restart_task: asyncio.Task[None] | None = None
        self._crash_streak = 0
        self._killed_generation = 0  # a worker we stopped on purpose is not a crash

    # -- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the worker and wait until the model is loaded. Raises ModelLoadError."""
        self._loop = asyncio.get_running_loop()
        if not self.model_path:
            self.model_path = bundled_model_path()
        await asyncio.to_thread(self._guard_memory)
        await self._spawn()

    def _guard_memory(self) -> None:
        """Read the model's header, then fit n_ctx to the RAM available (see ``memory.py``)."""
        header = _header(self.model_path)
        draft: GGUFHeader | None = None
        if self.settings.speculative == "draft" and self.settings.draft_model_path:
            draft = _header(self.settings.draft_model_path)
        self.max_token_bytes = header.max_token_bytes
        plan = memory.plan(
            header,
            self.settings.n_ctx,
            mode=self.settings.memory_guard,
            draft=draft,
            prefix_cache_mb=self.settings.prefix_cache_mb,
            parallel=max(1, self.settings.parallel),
        )
        self.memory = plan
        if not plan.fits:
            self.state = "failed"
            self.error = (
                f"not enough memory for {self.model_path}: {'; '.join(plan.notes)}. To fix: "
                + memory.advice(
                    plan,
                    has_draft=draft is not None,
                    prefix_cache_mb=self.settings.prefix_cache_mb,
                )
                + ' (or set [local] memory_guard = "off" to start anyway)'
            )
            raise ModelLoadError(self.error)
        if plan.parallel < plan.requested_parallel:
            log.warning("engine_parallel_reduced", detail=plan.notes[0], parallel=plan.parallel)
            # Before the first job: no slot of the old count is held.
            self.parallel = plan.parallel
            self._slots = asyncio.Semaphore(self.parallel)
        if plan.shrunk:
            log.warning("engine_context_reduced", detail=plan.notes[-1], n_ctx=plan.n_ctx)
        self.n_ctx = plan.n_ctx

    async def _spawn(self) -> None:
        assert self._loop is not None
        self.state = "starting"
        self._ready.clear()
        self._generation += 1
        generation = self._generation
        parent, child = self._ctx.Pipe(duplex=True)
        options = {
            "model_path": self.model_path,
            "n_ctx": self.n_ctx,
            "n_threads": self.settings.threads,
            "seed": self.settings.seed,
            "speculative": self.settings.speculative,
            "default_max_tokens": self.settings.default_max_tokens,
            "draft_model_path": self.settings.draft_model_path,
            "draft_max_tokens": self.settings.draft_max_tokens,
            "lookup_ngram": self.settings.lookup_ngram,
            "prefix_cache_mb": self.settings.prefix_cache_mb,
            "flash_attn": self.settings.flash_attn,
            "relevance": self.relevance,
            "weights_path": self.weights_path,
            "weights_optional": self.weights_optional,
            "parallel": self.parallel,
        }
        # Started with an allow-listed environment, never the proxy's keys (worker_env.py).
        proc = WorkerProcess(
            target=worker_main,
            args=(child, self._cancel, options),
            name="frugal-engine",
            daemon=True,
            private_env=self.private_env,
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
        self.stats.calibrated(self.info.get("calibration"))
        self.state = "ready"
        self.error = None
        self._ready.set()
        log.info("engine_ready", **{k: v for k, v in self.info.items() if k != "model_path"})
        relevance = self.info.get("relevance") or {}
        if self.relevance and not relevance.get("enabled"):
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
            loop.call_soon_threadsafe(self._dispatch, generation, message)
        if not got_first:
            loop.call_soon_threadsafe(_resolve, first, ("exited",))
        else:
            loop.call_soon_threadsafe(self._on_exit, generation)

    def _dispatch(self, generation: int, message: tuple[Any, ...]) -> None:
        kind = message[0]
        if kind == "progress":
            if generation == self._generation:
                self._progress = message[1]["jobs"]
                self.stats.batch = message[1]["batch"]
            return
        job = self._jobs.get(message[1])
        if generation != self._generation or job is None:
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

    def _on_exit(self, generation: int) -> None:
        if generation != self._generation or self._closing:
            return
        self.state = "restarting"
        self._ready.clear()
        code = self._proc.exitcode if self._proc is not None else None
        if generation != self._killed_generation:
            self.stats.crashes += 1
            self._crash_streak += 1
            log.warning("engine_exited", exitcode=code, restarts=self.stats.restarts)
        for job in list(self._jobs.values()):
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
        return bool(self._jobs)

    @property
    def active(self) -> int:
        """Jobs running in the worker now (at most ``parallel``)."""
        return len(self._jobs)

    async def chat(
        self,
        request: dict[str, Any],
        *,
        deadline: float,
        on_token: Callable[[str], None] | None = None,
        kind: str = "chat",
    ) -> dict[str, Any]:
        """Run one chat completion before ``deadline`` (a ``time.monotonic()`` value).

        ``kind="complete"`` runs a legacy text completion instead (see :meth:`complete`).

        A prompt that certainly cannot fit the context fails at once with ContextOverflow, and a
        full queue with EngineBusy, without waiting. Cancelling the call (the client went away)
        takes the request out of the queue, or stops its generation.
        """
        too_long = self.work.certainly_too_long(request, self.n_ctx, self.max_token_bytes)
        if too_long is not None:
            raise ContextOverflow(
                f"a prompt of about {too_long} tokens does not fit a {self.n_ctx}-token context"
            )
        if self._waiting >= self.settings.max_queue:
            raise EngineBusy(f"the local queue is full ({self._waiting} waiting)")
        ticket = self.work.admit(request, self._answer_budget(request))
        completion: dict[str, Any] | None = None
        try:
            completion = await self._queued(request, deadline, on_token, kind, ticket)
            return completion
        finally:
            self.work.finish(ticket, request, completion)

    def _answer_budget(self, request: dict[str, Any]) -> int:
        asked = request.get("max_completion_tokens") or request.get("max_tokens")
        return min(int(asked or self.settings.default_max_tokens), self.n_ctx)

    async def _queued(
        self,
        request: dict[str, Any],
        deadline: float,
        on_token: Callable[[str], None] | None,
        kind: str,
        ticket: int,
    ) -> dict[str, Any]:
        self._waiting += 1
        try:
            await asyncio.wait_for(self._slots.acquire(), timeout=_left(deadline))
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
            self.work.start(ticket)
            return await self._run(request, deadline, on_token, kind, ticket)
        finally:
            self._slots.release()

    async def complete(
        self,
        request: dict[str, Any],
        *,
        deadline: float,
        on_token: Callable[[str], None] | None = None,
    ) -> dict[str, Any]:
        """Run one legacy text completion (``/v1/completions``) before ``deadline``."""
        return await self.chat(request, deadline=deadline, on_token=on_token, kind="complete")

    async def _run(
        self,
        request: dict[str, Any],
        deadline: float,
        on_token: Callable[[str], None] | None,
        kind: str = "chat",
        ticket: int = 0,
    ) -> dict[str, Any]:
        assert self._loop is not None and self._conn is not None
        job = _Job(next(self._ids), self._loop.create_future(), on_token, deadline, ticket)
        self._jobs[job.job_id] = job
        try:
            self._conn.send(("job", job.job_id, request, on_token is not None, deadline, kind))
        except (OSError, ValueError) as exc:
            self._jobs.pop(job.job_id, None)
            raise EngineCrashed("the local engine is not reachable") from exc
        try:
            # The worker stops itself at the deadline and returns a partial answer; give it a
            # moment to do so before deciding it is stuck.
            return await asyncio.wait_for(
                asyncio.shield(job.future), timeout=_left(deadline) + self._grace_s()
            )
        except TimeoutError:
            self.stats.timeouts += 1
            self._kill("deadline")
            raise EngineTimeout("the local engine missed its deadline and was stopped") from None
        except asyncio.CancelledError:
            # The client went away: stop the generation, then let the next job run.
            self._cancel.value = job.job_id
            if self.parallel > 1:  # several jobs in flight: the shared value holds one id
                with contextlib.suppress(OSError, ValueError):
                    self._conn.send(("cancel", job.job_id))
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(asyncio.shield(job.future), timeout=KILL_GRACE_S)
            if not job.future.done():
                self._kill("cancelled")
            raise
        finally:
            self._jobs.pop(job.job_id, None)
            if not job.future.done():
                job.future.cancel()
            elif not job.future.cancelled():
                job.future.exception()  # mark retrieved

    def _grace_s(self) -> float:
        """How long past its deadline a job may take to stop by itself.

        Alone, a job checks its deadline at every token. In a batch it is checked before each
        step, and one step may be another sequence's prompt chunk of ``n_batch`` (512) tokens:
        killing the worker then would fail every sequence in the batch, so the grace covers the
        longest such step at the measured prefill rate.
        """
        if self.parallel == 1:
            return KILL_GRACE_S
        rate = self.stats.prefill_tok_s
        chunk_s = 512 / rate if rate else 10.0
        return KILL_GRACE_S + 2.0 * chunk_s

    def _kill(self, why: str) -> None:
        proc = self._proc
        if proc is not None and proc.is_alive():
            log.warning("engine_killed", why=why, pid=proc.pid)
            self._killed_generation = self._generation
            proc.kill()

    @property
    def rates(self) -> Rates:
        """Prefill and decode tok/s: calibrated at start, then a moving average of requests."""
        return Rates(
            prefill_tok_s=self.stats.prefill_tok_s,
            decode_tok_s=self.stats.decode_tok_s,
            source=self.stats.rates_source,
        )

    def pending_work(self) -> PendingWork:
        """Tokens still to prefill and decode for the running jobs and those queued."""
        return self.work.pending(self.rates)

    def batch_costs(self) -> BatchCosts | None:
        """The batch's measured prefill rate and decode-step costs (None while unknown)."""
        return BatchCosts.from_health(
            self.stats.batch,
            prefill_tok_s=self.stats.prefill_tok_s,
            decode_tok_s=self.stats.decode_tok_s,
        )

    def forecast(self, prompt_tokens: float, completion_tokens: float) -> Forecast | None:
        """With ``parallel`` > 1: when a new request with these tokens would get a slot and be
        done, played forward from the jobs in the engine (``batch_forecast.py``); None while
        the costs are unknown. ``completion_tokens`` 0 and ``prompt_tokens`` 0: no new
        request, the time until the work already in the engine is done."""
        costs = self.batch_costs()
        if costs is None:
            return None
        by_ticket = {
            job.ticket: self._progress[job_id]
            for job_id, job in self._jobs.items()
            if job_id in self._progress
        }
        running, queued = self.work.batch_work(by_ticket)
        new = Work(prompt_tokens, completion_tokens) if completion_tokens > 0 else None
        return forecast(running, queued, new, slots=self.parallel, costs=costs)

    def predicted_wait_s(self) -> float | None:
        """Seconds until the work already in the engine is done (None while rates are unknown)."""
        if self.parallel > 1:
            done = self.forecast(0.0, 0.0)
            return None if done is None else done.finish_s
        return self.pending_work().seconds(self.rates)

    def health(self) -> dict[str, Any]:
        pending = self.pending_work()
        acceptance = self.stats.acceptance_rate
        return {
            "state": self.state,
            "error": self.error,
            "model": self.info.get("model"),
            "pid": self.info.get("pid") if self.state == "ready" else None,
            "n_ctx": self.info.get("n_ctx", self.n_ctx),
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
            "rates_source": self.stats.rates_source,
            "calibration": self.info.get("calibration"),
            "relevance": self.info.get("relevance"),
            "pending": pending.as_dict(),
            "predicted_wait_s": _round(self.predicted_wait_s(), 2),
            "speculative": {
                "mode": self.settings.speculative,
                "requests": self.stats.speculated,
                "drafted": self.stats.drafted,
                "accepted": self.stats.accepted,
                "acceptance_rate": None if acceptance is None else round(acceptance, 3),
            },
            "prefix_cache": self.stats.prefix_cache,
            "parallel": self.parallel,
            "active_sequences": len(self._jobs),
            "batch": {
                **(self.stats.batch or {}),
                "sequence_tok_s": _round(self.stats.sequence_tok_s),
            },
            "memory": self.memory.as_dict() if self.memory is not None else None,
        }


def _left(deadline: float) -> float:
    return max(0.0, deadline - time.monotonic())


def _round(value: float | None, digits: int = 1) -> float | None:
    return None if value is None else round(value, digits)


def _header(path: str) -> GGUFHeader:
    if not os.path.isfile(path):
        raise ModelLoadError(f"model file not found: {path}")
    try:
        return read_header(path)
    except (GGUFError, OSError) as exc:
        raise ModelLoadError(f"cannot read model {path}: {exc}") from exc


def _resolve(future: asyncio.Future[Any], value: Any) -> None:
    if not future.done():
        future.set_result(value)


def _fail(future: asyncio.Future[Any], exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)
