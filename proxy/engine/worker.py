"""The engine worker: a separate process that owns ``llama_cpp.Llama``.

It is started with the ``spawn`` method and talks to the proxy over one duplex pipe:

    proxy -> worker   ("job", job_id, request, stream, deadline, kind, priority) | ("shutdown",)
                      ("cancel", job_id)   (with [local] parallel > 1)
    worker -> proxy   ("ready", info)  |  ("fatal", message)
                      ("token", job_id, text)  |  ("done", job_id, completion)
                      ("error", job_id, kind, message)
                      ("progress", {"jobs": {job_id: (prompt left, answer tokens)},
                                    "batch": batch health})   (parallel > 1, every 0.25 s)

A job stops early when its ``deadline`` (``time.monotonic()``, which is shared by every process on
the machine) passes, or when the proxy writes its id into the shared ``cancel`` value. If the
worker ever fails to stop, the proxy kills it and starts another; see ``client.py``.

With ``parallel`` > 1 several jobs are in flight at once: plain chat jobs run as sequences of one
:class:`~proxy.engine.batch.decode.BatchEngine` (one decode step over all of them at a time, new
jobs joining at the next step; with ``speculative = "prompt-lookup"`` a greedy sequence's drafts are
rows of the same step), and the others (tools, ``n`` > 1, legacy completions) run alone on the
single path once the batch has drained. A job's ``priority`` is ``"interactive"`` or
``"deferred"`` (``priority.py``): waiting interactive jobs join first, deferred sequences pause
while interactive ones run (``batch/decode.py``), and an interactive job on the single path runs
while deferred sequences are paused, without waiting for them to drain. Each job is cancelled
by its own ("cancel", job_id) message, the shared value being able to hold one id only.

A batched answer is scored by the gate on a thread of its own (:class:`_Scorer`), interactive
answers before deferred ones, while the loop goes on stepping the batch: the gate costs about
160 ms of CPU an answer on the bundled models (the relevance model and the checks; measured on
the 2-core build machine), and in the loop each finished batch line held every other sequence,
an interactive one included, for that long. llama.cpp and the embedding model release the GIL
while they compute, so the two overlap on a second core. Messages to the proxy go through one
lock (:class:`_Pipe`), since both threads send. The relevance model gets the cores the engine's
``n_threads`` leave (at least one), so that the two threads never ask for more cores than there
are.
"""

from __future__ import annotations

import itertools
import os
import queue
import signal
import threading
import time
from collections import deque
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from proxy import logs
from proxy.engine import grammar as grammar_mod
from proxy.engine import tasks, tools
from proxy.engine.batch.decode import BatchEngine, BatchError
from proxy.engine.batch.sequence import Sequence
from proxy.engine.gate import Gate
from proxy.engine.generate import LocalModel, PromptTooLong
from proxy.engine.model_files import ModelLoadError
from proxy.engine.priority import DEFERRED
from proxy.engine.speculative import PromptLookup

PROGRESS_S = 0.25  # how often a batched worker reports its jobs' progress


def worker_main(conn: Connection, cancel: Any, options: dict[str, Any]) -> None:
    """Entry point of the worker process."""
    # The proxy decides when the worker stops; a Ctrl-C in the terminal reaches the whole
    # process group, and the worker must not die before the proxy has drained.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logs.configure()  # JSON lines on the proxy's stderr (a pipe, journald), as its own
    logs.route_llama_cpp_logs()
    started = time.perf_counter()
    try:
        model = LocalModel.load(
            options["model_path"],
            n_ctx=options["n_ctx"],
            n_threads=options["n_threads"],
            seed=options.get("seed", 0),
            speculative=options.get("speculative", "off"),
            default_max_tokens=options.get("default_max_tokens", 512),
            draft_model_path=options.get("draft_model_path", ""),
            draft_max_tokens=options.get("draft_max_tokens", 8),
            lookup_ngram=options.get("lookup_ngram", 3),
            prefix_cache_mb=options.get("prefix_cache_mb", 0),
            flash_attn=options.get("flash_attn", True),
            calibrate=options.get("calibrate", True),
            thinking_budget=options.get("thinking_budget", 0),
        )
    except ModelLoadError as exc:
        conn.send(("fatal", str(exc)))
        return
    import quality  # noqa: F401 - imported now, not on the first job's clock

    global _gate
    try:
        # [quality] relevance and weights_path, the weights checked against the model file
        _gate = Gate.load(
            relevance=bool(options.get("relevance", True)),
            weights_path=options.get("weights_path", ""),
            model_path=model.path,
            weights_optional=options.get("weights_optional", False),
            embed_threads=_embed_threads(int(options["n_threads"])),
        )
    except ValueError as exc:  # quality.combiner.WeightsError
        conn.send(("fatal", str(exc)))
        return
    parallel = max(1, int(options.get("parallel", 1)))
    batch: BatchEngine | None = None
    if parallel > 1:
        try:
            lookup = model.speculator.drafter if model.speculator is not None else None
            batch = BatchEngine(
                model,
                parallel,
                speculative=isinstance(lookup, PromptLookup),
                max_draft=options.get("draft_max_tokens", 8),
                lookup_ngram=options.get("lookup_ngram", 3),
            )
        except (ValueError, RuntimeError) as exc:
            conn.send(("fatal", f"cannot make a context for {parallel} sequences: {exc}"))
            return

    conn.send(
        (
            "ready",
            {
                "pid": os.getpid(),
                "model": model.model_name,
                "model_path": model.path,
                "n_ctx": model.n_ctx,
                "n_threads": options["n_threads"],
                "load_s": time.perf_counter() - started,
                "speculative": options.get("speculative", "off"),
                "calibration": (
                    model.calibration.as_dict() if model.calibration is not None else None
                ),
                "relevance": _gate.relevance,
                "weights": _gate.weights_info(),
                "parallel": parallel,
                "thinking": model.thinking.as_dict() if model.thinking is not None else None,
            },
        )
    )
    if batch is not None:
        _serve_batched(conn, cancel, model, batch)
        return
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        if message[0] == "shutdown":
            return
        if message[0] == "cancel":  # for a job that has already finished
            continue
        _, job_id, request, stream, deadline, *rest = message
        kind = rest[0] if rest else "chat"  # "chat" | "complete" (legacy completions)
        _run_job(conn, cancel, model, job_id, request, stream, deadline, kind)


class _Pipe:
    """The worker's end of the pipe, safe to send on from the loop and the scorer thread."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self._lock = threading.Lock()

    def send(self, message: tuple[Any, ...]) -> None:
        with self._lock:
            self._conn.send(message)


class _Scorer:
    """Scores finished batch answers on its own thread and sends them, interactive ones first
    (see the module docstring). :meth:`close` sends what is queued, then stops the thread."""

    def __init__(self, pipe: _Pipe) -> None:
        self._pipe = pipe
        self._order = itertools.count()
        self._queue: queue.PriorityQueue[tuple[int, int, Callable[[], None] | None]] = (
            queue.PriorityQueue()
        )
        self._thread = threading.Thread(target=self._run, name="frugal-scorer", daemon=True)
        self._thread.start()

    def submit(
        self, job_id: int, request: dict[str, Any], completion: dict[str, Any], deferred: bool
    ) -> None:
        def work() -> None:
            try:
                completion["frugal"]["quality"] = _score(request, completion)
            except Exception as exc:  # noqa: BLE001 - this answer fails, the worker goes on
                self._pipe.send(("error", job_id, "local_error", f"{type(exc).__name__}: {exc}"))
                return
            self._pipe.send(("done", job_id, completion))

        self._queue.put((1 if deferred else 0, next(self._order), work))

    def _run(self) -> None:
        while True:
            _, _, work = self._queue.get()
            if work is None:
                return
            try:
                work()
            except (OSError, ValueError):  # the pipe is gone: the proxy has left
                return

    def close(self) -> None:
        self._queue.put((2, next(self._order), None))  # after everything queued
        self._thread.join()


def _run_job(
    conn: Connection | _Pipe,
    cancel: Any,
    model: LocalModel,
    job_id: int,
    request: dict[str, Any],
    stream: bool,
    deadline: float,
    kind: str = "chat",
) -> None:
    def should_stop() -> str | None:
        if cancel.value == job_id:
            return "cancelled"
        if time.monotonic() >= deadline:
            return "deadline"
        return None

    def on_token(text: str) -> None:
        conn.send(("token", job_id, text))

    try:
        # n answers, grammars and tools (see tasks.py); each answer is scored there, which
        # keeps the gate's CPU off the proxy's event loop.
        run = tasks.complete if kind == "complete" else tasks.chat
        hooks = tasks.Hooks(on_token if stream else None, should_stop, _score)
        completion = run(model, request, hooks)
    except PromptTooLong as exc:
        conn.send(("error", job_id, "context_overflow", str(exc)))
    except (grammar_mod.GrammarError, tasks.BadGrammar) as exc:
        conn.send(("error", job_id, "unsupported", f"the grammar cannot be built: {exc}"))
    except Exception as exc:  # noqa: BLE001 - anything llama.cpp raises becomes a fallback
        conn.send(("error", job_id, "local_error", f"{type(exc).__name__}: {exc}"))
    else:
        if model.prefix_cache is not None:
            completion["frugal"]["prefix_cache"] = model.prefix_cache.stats()
        conn.send(("done", job_id, completion))


def batchable(kind: str, request: dict[str, Any]) -> bool:
    """Plain chat with one answer and no tools: what a batch sequence can do by itself."""
    return kind == "chat" and int(request.get("n") or 1) == 1 and not tasks._needs_rewrite(request)


def _serve_batched(conn: Connection, cancel: Any, model: LocalModel, batch: BatchEngine) -> None:
    """The worker loop with several jobs in flight; see the module docstring."""
    pipe = _Pipe(conn)
    scorer = _Scorer(pipe)
    try:
        _batched_loop(conn, pipe, scorer, cancel, model, batch)
    finally:
        scorer.close()


def _batched_loop(
    conn: Connection,
    pipe: _Pipe,
    scorer: _Scorer,
    cancel: Any,
    model: LocalModel,
    batch: BatchEngine,
) -> None:
    waiting: deque[tuple[Any, ...]] = deque()
    cancelled: set[int] = set()
    running: dict[int, tuple[int, dict[str, Any]]] = {}  # id(sequence) -> job id, request

    def stopper(job_id: int, deadline: float) -> Any:
        def should_stop() -> str | None:
            if job_id in cancelled or cancel.value == job_id:
                return "cancelled"
            if time.monotonic() >= deadline:
                return "deadline"
            return None

        return should_stop

    def finish(seq: Sequence) -> None:
        job_id, request = running.pop(id(seq))
        cancelled.discard(job_id)
        if seq.error is not None:
            pipe.send(("error", job_id, "local_error", seq.error))
            return
        completion = batch.completion(seq)
        choice = completion["choices"][0]
        message, _ = tools.to_message(choice["message"].get("content") or "", None)
        tasks.keep_reasoning(choice["message"], message)
        choice["message"] = message
        completion["frugal"]["batch"]["engine"] = batch.health()
        scorer.submit(job_id, request, completion, seq.deferred)

    def admit() -> None:
        while waiting:
            # Interactive jobs first, each class in the order it came (priority.py).
            message = next((m for m in waiting if not _deferred(m)), waiting[0])
            _, job_id, request, stream, deadline, *rest = message
            kind = rest[0] if rest else "chat"
            deferred = _deferred(message)
            if job_id in cancelled:  # its client left before it started
                waiting.remove(message)
                cancelled.discard(job_id)
                pipe.send(("error", job_id, "local_error", "cancelled before it started"))
                continue
            if not batchable(kind, request):
                # It runs alone once the batch has drained (an interactive one: once no
                # interactive sequence runs, the deferred ones wait paused); later jobs wait.
                if batch.busy if deferred else batch.interactive:
                    return
                waiting.remove(message)
                _run_job(pipe, cancel, model, job_id, request, stream, deadline, kind)
                continue
            on_token = None
            if stream:

                def on_token(text: str, job_id: int = job_id) -> None:
                    pipe.send(("token", job_id, text))

            try:
                gbnf = grammar_mod.gbnf_for(request)
                grammar = tasks._grammar(model, gbnf) if gbnf is not None else None
                seq = batch.add(
                    request,
                    on_token=on_token,
                    should_stop=stopper(job_id, deadline),
                    grammar=grammar,
                    deadline=deadline,
                    deferred=deferred,
                )
            except PromptTooLong as exc:
                waiting.remove(message)
                pipe.send(("error", job_id, "context_overflow", str(exc)))
                continue
            except (grammar_mod.GrammarError, tasks.BadGrammar) as exc:
                waiting.remove(message)
                pipe.send(("error", job_id, "unsupported", f"the grammar cannot be built: {exc}"))
                continue
            except Exception as exc:  # noqa: BLE001 - this job fails, the batch goes on
                waiting.remove(message)
                pipe.send(("error", job_id, "local_error", f"{type(exc).__name__}: {exc}"))
                continue
            if seq is None:
                return  # no room yet: it joins when a sequence leaves
            waiting.remove(message)
            running[id(seq)] = (job_id, request)

    reported = 0.0
    while True:
        idle = not batch.busy and not waiting
        try:
            while conn.poll(None if idle else 0):
                idle = False
                message = conn.recv()
                if message[0] == "shutdown":
                    return
                if message[0] == "cancel":
                    live = any(job == message[1] for job, _ in running.values())
                    if live or any(m[1] == message[1] for m in waiting):
                        cancelled.add(message[1])
                    continue
                waiting.append(message)
        except (EOFError, OSError):
            return
        admit()
        if not batch.busy:
            continue
        try:
            finished = batch.step()
        except BatchError as exc:
            finished = batch.fail_all(str(exc))
        for seq in finished:
            finish(seq)
        if time.monotonic() - reported >= PROGRESS_S:
            reported = time.monotonic()
            pipe.send(("progress", _progress(batch, running)))


def _deferred(message: tuple[Any, ...]) -> bool:
    """Whether a ("job", ...) message is deferred work (older messages have no priority)."""
    return len(message) > 6 and message[6] == DEFERRED


def _progress(batch: BatchEngine, running: dict[int, tuple[int, dict[str, Any]]]) -> dict[str, Any]:
    """Where each running job is (prompt tokens still to prefill, answer tokens so far) and the
    batch's counts and measured costs: what the proxy's forecast starts from (batch/forecast.py)."""
    jobs: dict[int, tuple[int, int]] = {}
    for seq in batch.active:
        entry = running.get(id(seq))
        if entry is not None:
            done = seq.lead_target if seq.leader is not None else seq.prefilled
            jobs[entry[0]] = (max(0, len(seq.prompt) - 1 - done), len(seq.generated))
    return {"jobs": jobs, "batch": batch.health()}


def _embed_threads(n_threads: int) -> int:
    """The relevance model's threads: the cores the engine's ``n_threads`` leave, up to four.
    Batched answers are scored beside the batch's decode steps (:class:`_Scorer`), and more
    threads than cores would make both wait on each other's preempted threads."""
    return max(1, min(4, (os.cpu_count() or 1) - n_threads))


_gate = Gate()
"""The quality gate this process scores with (``proxy.engine.gate``), loaded at start."""


def _score(request: dict[str, Any], completion: dict[str, Any]) -> dict[str, Any]:
    return _gate.score(request, completion)
