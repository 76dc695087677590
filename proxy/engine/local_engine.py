"""The proxy's handle on the local engine: its jobs, their queue and deadlines, its forecast.

:class:`LocalEngine` fits the settings to the memory there is (``memory.py``), starts the worker
process through a :class:`~proxy.engine.worker_link.WorkerLink` (which also restarts it when it
dies), and runs jobs on it. ``[local] parallel`` jobs run at a time (decoded together by the
worker when more than one, see ``batch/decode.py``); others wait in a queue bounded by
``[local] max_queue``, served in turn by client key (``fair_queue.py``: one key's many jobs
cannot hold another key's answer behind all of them). A job is interactive (the default) or
deferred (``priority="deferred"``: batch lines, background responses, flex): deferred jobs fill
the places interactive ones leave, pause while interactive ones run, and wait in a queue of their
own bounded by ``[local] max_deferred_queue`` (``priority.py``); they are left out of the
forecasts that route interactive requests, since they never hold those back. A job past its
deadline is asked to stop (the worker checks the deadline every token, or every step of a
batch); if the worker has not answered within a grace it is killed and replaced, so the CPU is
never left working on an answer nobody will read. A worker that dies for any reason fails its
current jobs with :class:`EngineCrashed`. What it has done is kept in
:class:`~proxy.engine.engine_stats.EngineStats`; what it will do is forecast from the work it
holds (``rates.py``, ``batch/forecast.py``).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

import structlog

from proxy.config import LocalSettings
from proxy.engine import memory
from proxy.engine.batch.forecast import BatchCosts, Forecast, Work, forecast
from proxy.engine.engine_stats import EngineStats
from proxy.engine.fair_queue import KEYLESS
from proxy.engine.gguf import GGUFError, GGUFHeader, read_header
from proxy.engine.model_files import ModelLoadError, bundled_model_path
from proxy.engine.priority import DEFERRED, INTERACTIVE, PRIORITIES, PrioritySlots
from proxy.engine.rates import PendingWork, Rates, WorkTracker
from proxy.engine.worker import batchable
from proxy.engine.worker_link import ContextOverflow, Unsupported, WorkerLink, seconds_left
from proxy.errors import EngineBusy, EngineCrashed, EngineTimeout

__all__ = ["Answering", "Ask", "ContextOverflow", "LocalEngine", "Unsupported"]

log = structlog.get_logger(__name__)


@dataclass(frozen=True, kw_only=True)
class Ask:
    """How one request is to be answered: before ``deadline`` (a ``time.monotonic()`` value),
    its text handed to ``on_token`` as it comes when that is set, as a chat completion or, with
    ``kind="complete"``, a legacy text completion (``/v1/completions``); waiting in the turn of
    ``share``, its client key's label (``fair_queue.share_label``; ``""``: no key); as
    ``priority`` ``"interactive"`` or ``"deferred"`` work (``priority.py``)."""

    deadline: float
    on_token: Callable[[str], None] | None = None
    kind: str = "chat"
    share: str = KEYLESS
    priority: str = INTERACTIVE


class Answering:
    """The one way to ask for an answer, shared by the engine and every routing backend:
    ``chat(request, deadline=..., on_token=..., kind=..., share=..., priority=...)``, which each
    of them implements as :meth:`answer` with the same five gathered in an :class:`Ask`."""

    async def chat(
        self,
        request: dict[str, Any],
        *,
        deadline: float,
        on_token: Callable[[str], None] | None = None,
        kind: str = "chat",
        share: str = KEYLESS,
        priority: str = INTERACTIVE,
    ) -> dict[str, Any]:
        """Answer ``request`` before ``deadline`` (a ``time.monotonic()`` value); with
        ``on_token``, its text is handed over as it comes; ``kind="complete"`` for a legacy
        text completion (``/v1/completions``); ``share``: the client key's label;
        ``priority="deferred"`` for work that can wait (``priority.py``)."""
        if priority not in PRIORITIES:
            raise ValueError(f"priority {priority!r}: expected one of {PRIORITIES}")
        ask = Ask(deadline=deadline, on_token=on_token, kind=kind, share=share, priority=priority)
        return await self.answer(request, ask)

    async def answer(self, request: dict[str, Any], ask: Ask) -> dict[str, Any]:
        raise NotImplementedError


class LocalEngine(Answering):
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
        self.stats = EngineStats()
        self.work = WorkTracker()
        self.n_ctx = settings.n_ctx  # after the memory guard, what the worker really uses
        self.memory: memory.MemoryPlan | None = None
        self.max_token_bytes = 0
        self.parallel = max(1, settings.parallel)
        self._slots = PrioritySlots(self.parallel)
        self._waiting = {INTERACTIVE: 0, DEFERRED: 0}
        self.worker = WorkerLink(stats=self.stats, private_env=self.private_env)
        self._failed: str | None = None  # the memory guard's refusal, before any worker

    @property
    def state(self) -> str:
        """stopped, starting, ready, restarting or failed."""
        return "failed" if self._failed else self.worker.state

    @property
    def error(self) -> str | None:
        return self._failed or self.worker.error

    @property
    def info(self) -> dict[str, Any]:
        """What the worker said when its model was loaded (pid, model, calibration, ...)."""
        return self.worker.info

    # -- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the worker and wait until the model is loaded. Raises ModelLoadError."""
        if not self.model_path:
            self.model_path = bundled_model_path()
        await asyncio.to_thread(self._guard_memory)
        await self.worker.start(self._options())

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
            self._failed = (
                f"not enough memory for {self.model_path}: {'; '.join(plan.notes)}. To fix: "
                + memory.advice(
                    plan,
                    has_draft=draft is not None,
                    prefix_cache_mb=self.settings.prefix_cache_mb,
                )
                + ' (or set [local] memory_guard = "off" to start anyway)'
            )
            raise ModelLoadError(self._failed)
        if plan.parallel < plan.requested_parallel:
            log.warning("engine_parallel_reduced", detail=plan.notes[0], parallel=plan.parallel)
            # Before the first job: no slot of the old count is held.
            self.parallel = plan.parallel
            self._slots = PrioritySlots(self.parallel)
        if plan.shrunk:
            log.warning("engine_context_reduced", detail=plan.notes[-1], n_ctx=plan.n_ctx)
        self.n_ctx = plan.n_ctx

    def _options(self) -> dict[str, Any]:
        """What ``worker_main`` needs: the settings, after the memory guard."""
        return {
            "model_path": self.model_path,
            "n_ctx": self.n_ctx,
            "n_threads": self.settings.threads,
            "seed": self.settings.seed,
            "speculative": self.settings.speculative,
            "default_max_tokens": self.settings.default_max_tokens,
            "thinking_budget": self.settings.thinking_budget,
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

    async def stop(self) -> None:
        """Stop the worker: politely first, then by force."""
        await self.worker.stop()

    # -- jobs -------------------------------------------------------------------------------

    @property
    def queue_depth(self) -> int:
        """Interactive jobs waiting for a place."""
        return self._waiting[INTERACTIVE]

    @property
    def deferred_depth(self) -> int:
        """Deferred jobs waiting for a place (their own queue, ``priority.py``)."""
        return self._waiting[DEFERRED]

    @property
    def busy(self) -> bool:
        return bool(self.worker.jobs)

    @property
    def active(self) -> int:
        """Jobs running in the worker now (at most ``parallel``)."""
        return len(self.worker.jobs)

    async def answer(self, request: dict[str, Any], ask: Ask) -> dict[str, Any]:
        """Run one chat completion before ``ask.deadline``.

        ``ask.kind="complete"`` runs a legacy text completion (``/v1/completions``) instead.

        A prompt that certainly cannot fit the context fails at once with ContextOverflow, and a
        full queue (``ask.priority``'s own) with EngineBusy, without waiting. Cancelling the
        call (the client went away) takes the request out of the queue, or stops its generation.
        """
        too_long = self.work.certainly_too_long(request, self.n_ctx, self.max_token_bytes)
        if too_long is not None:
            raise ContextOverflow(
                f"a prompt of about {too_long} tokens does not fit a {self.n_ctx}-token context"
            )
        waiting = self._waiting[ask.priority]
        if ask.priority == DEFERRED and waiting >= self.settings.max_deferred_queue:
            raise EngineBusy(f"the local deferred queue is full ({waiting} waiting)")
        if ask.priority == INTERACTIVE and waiting >= self.settings.max_queue:
            raise EngineBusy(f"the local queue is full ({waiting} waiting)")
        # Deferred work is no ticket of the forecast: it never holds an interactive job back.
        ticket = 0
        if ask.priority == INTERACTIVE:
            ticket = self.work.admit(request, self._answer_budget(request), ask.share)
        completion: dict[str, Any] | None = None
        try:
            completion = await self._queued(request, ask, ticket)
            return completion
        finally:
            self.work.finish(ticket, request, completion)

    def _answer_budget(self, request: dict[str, Any]) -> int:
        asked = request.get("max_completion_tokens") or request.get("max_tokens")
        return min(int(asked or self.settings.default_max_tokens), self.n_ctx)

    async def _queued(self, request: dict[str, Any], ask: Ask, ticket: int) -> dict[str, Any]:
        deadline = ask.deadline
        # The worker pauses deferred plain chat on its batch; anything else it runs to the end.
        pausable = self.parallel > 1 and batchable(ask.kind, request)
        self._waiting[ask.priority] += 1
        try:
            placed = await self._slots.acquire(
                ask.share, seconds_left(deadline), ask.priority, pausable=pausable
            )
        finally:
            self._waiting[ask.priority] -= 1
        if not placed:
            self.stats.timeouts += 1
            raise EngineTimeout("the deadline passed while waiting in the local queue")
        try:
            if not self.worker.ready.is_set():
                try:
                    await asyncio.wait_for(self.worker.ready.wait(), timeout=seconds_left(deadline))
                except TimeoutError as exc:
                    raise EngineCrashed(f"the local engine is not ready ({self.state})") from exc
            self.work.start(ticket)
            return await self.worker.run(
                request, deadline, ask.on_token, ask.kind, ticket, ask.priority
            )
        finally:
            self._slots.release(ask.priority, pausable=pausable)

    @property
    def rates(self) -> Rates:
        """Prefill and decode tok/s: calibrated at start, then a moving average of requests."""
        return Rates(
            prefill_tok_s=self.stats.prefill_tok_s,
            decode_tok_s=self.stats.decode_tok_s,
            source=self.stats.rates_source,
        )

    def pending_work(self, share: str | None = None) -> PendingWork:
        """Tokens still to prefill and decode for the running jobs and those queued; with
        ``share``, only the queued ones a new job of that share would follow."""
        ahead = None if share is None else self._slots.ahead(share)
        return self.work.pending(self.rates, ahead)

    def batch_costs(self) -> BatchCosts | None:
        """The batch's measured prefill rate and decode-step costs (None while unknown)."""
        return BatchCosts.from_health(
            self.stats.batch,
            prefill_tok_s=self.stats.prefill_tok_s,
            decode_tok_s=self.stats.decode_tok_s,
        )

    def forecast(
        self, prompt_tokens: float, completion_tokens: float, share: str | None = None
    ) -> Forecast | None:
        """With ``parallel`` > 1: when a new request with these tokens would get a slot and be
        done, played forward from the jobs in the engine (``batch/forecast.py``); None while
        the costs are unknown. ``completion_tokens`` 0 and ``prompt_tokens`` 0: no new
        request, the time until the work already in the engine is done. With ``share``, the
        new request follows only the queued jobs it would follow in turn (``fair_queue.py``),
        not every one."""
        costs = self.batch_costs()
        if costs is None:
            return None
        progress = self.worker.progress
        by_ticket = {
            job.ticket: progress[job_id]
            for job_id, job in self.worker.jobs.items()
            if job_id in progress
        }
        ahead = None if share is None else self._slots.ahead(share)
        running, queued = self.work.batch_work(by_ticket, ahead)
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
            "queue_depth": self._waiting[INTERACTIVE],
            "max_queue": self.settings.max_queue,
            "deferred": {
                "queue_depth": self._waiting[DEFERRED],
                "max_queue": self.settings.max_deferred_queue,
                "running": self._slots.running[DEFERRED],
            },
            "completed": self.stats.completed,
            "timeouts": self.stats.timeouts,
            "crashes": self.stats.crashes,
            "restarts": self.stats.restarts,
            "prefill_tok_s": _round(self.stats.prefill_tok_s),
            "decode_tok_s": _round(self.stats.decode_tok_s),
            "rates_source": self.stats.rates_source,
            "calibration": self.info.get("calibration"),
            "relevance": self.info.get("relevance"),
            "thinking": self.info.get("thinking"),  # the model's thinking format (reasoning.py)
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
            "active_sequences": len(self.worker.jobs),
            "batch": {
                **(self.stats.batch or {}),
                "sequence_tok_s": _round(self.stats.sequence_tok_s),
            },
            "memory": self.memory.as_dict() if self.memory is not None else None,
        }


def _round(value: float | None, digits: int = 1) -> float | None:
    return None if value is None else round(value, digits)


def _header(path: str) -> GGUFHeader:
    if not os.path.isfile(path):
        raise ModelLoadError(f"model file not found: {path}")
    try:
        return read_header(path)
    except (GGUFError, OSError) as exc:
        raise ModelLoadError(f"cannot read model {path}: {exc}") from exc
