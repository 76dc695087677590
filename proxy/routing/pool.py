"""Every local backend, and the choice between them by predicted finish time (finish-time routing).

    EngineBackend    the bundled engine (``proxy.engine.local_engine.LocalEngine``: one job at a
    time,
                     or ``[local] parallel`` batched; its queue, rates and forecast are the
                     engine's own, ``proxy.engine.rates`` and ``proxy.engine.batch.forecast``)
    RemoteBackend    another OpenAI-compatible llama.cpp server (``[[local.backends]]``, in
                     ``proxy.routing.remote``)
    BackendPool      picks the backend with the lowest predicted finish, and moves a request to
                     another backend when its own is down or full, if that one can still finish
                     before the request's deadline

The bundled engine is always the first backend, and the one a request falls to when no backend
can take it (its own queue then says ``local_busy``, as without other backends).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import structlog
from prometheus_client.core import GaugeMetricFamily, Metric, SummaryMetricFamily

from proxy.config import Settings
from proxy.config.secrets import Secrets
from proxy.engine.fair_queue import KEYLESS
from proxy.engine.gate import Gate
from proxy.engine.local_engine import Ask, LocalEngine
from proxy.engine.priority import INTERACTIVE
from proxy.errors import EngineBusy
from proxy.routing.base import Backend, BackendDown, Choice, left, rounded
from proxy.routing.estimator import (
    AnswerLengths,
    Prediction,
    answer_cap,
    answers_per_request,
    batched,
    predict,
)
from proxy.routing.prefix_memory import PrefixMemory
from proxy.routing.remote import RemoteBackend

log = structlog.get_logger(__name__)

ENGINE = "engine"


class EngineBackend(Backend):
    """The bundled engine: its queue and rates are the engine's own (``rates.py``)."""

    kind = "engine"

    def __init__(self, engine: LocalEngine, *, timeout_s: float) -> None:
        self.name = ENGINE
        self.engine = engine
        self.timeout_s = timeout_s
        self.memory = PrefixMemory()

    def ready(self) -> bool:
        return self.engine.state == "ready"

    def admits(self, request: dict[str, Any], kind: str) -> bool:
        return self.ready() and self.engine.queue_depth < self.engine.settings.max_queue

    def thinks(self) -> bool:
        return bool(self.engine.info.get("thinking"))

    def cannot_fit(self, request: dict[str, Any]) -> str | None:
        engine = self.engine
        too_long = engine.work.certainly_too_long(request, engine.n_ctx, engine.max_token_bytes)
        if too_long is None:
            return None
        return f"a prompt of about {too_long} tokens does not fit a {engine.n_ctx}-token context"

    def predict(self, request: dict[str, Any], completion_tokens: float) -> Prediction:
        return self.predict_for(request, completion_tokens, None)

    def predict_for(
        self, request: dict[str, Any], completion_tokens: float, share: str | None
    ) -> Prediction:
        """The engine's queue serves keys in turn: a request of ``share`` follows only the
        queued jobs it would follow (None: every one)."""
        engine = self.engine
        prompt = engine.work.estimate_prompt_tokens(request)
        prompt *= 1.0 - self.memory.cached_share(request)
        if engine.parallel > 1:
            ahead = engine.forecast(prompt, max(completion_tokens, 1.0), share)
            if ahead is not None:
                batch = engine.stats.batch or {}
                return batched(
                    self.name,
                    ahead,
                    pending=engine.pending_work(share),
                    prompt_tokens=prompt,
                    completion_tokens=completion_tokens,
                    rates_source="batch"
                    if batch.get("step_ms_by_width") or batch.get("step_ms_by_rows")
                    else engine.rates.source,
                )
        return predict(
            self.name,
            rates=engine.rates,
            pending=engine.pending_work(share),
            prompt_tokens=prompt,
            completion_tokens=completion_tokens,
        )

    async def answer(self, request: dict[str, Any], ask: Ask) -> dict[str, Any]:
        self.memory.remember(request)
        return await self.engine.answer(request, ask)

    def health(self) -> dict[str, Any]:
        rates = self.engine.rates
        return {
            "name": self.name,
            "kind": self.kind,
            "state": self.engine.state,
            "queue_depth": self.engine.queue_depth,
            "busy": self.engine.busy,
            "prefill_tok_s": rounded(rates.prefill_tok_s),
            "decode_tok_s": rounded(rates.decode_tok_s),
            "rates_source": rates.source,
            "predicted_wait_s": rounded(self.engine.predicted_wait_s(), 2),
        }


def engine_gate(engine: LocalEngine) -> Gate:
    """The gate the engine's worker scores with, loaded again in this process: its relevance
    model and its weights file, so that a remote backend's answer is scored as the engine's.
    Weights the worker would refuse (it then does not start) leave the shipped ones here."""
    try:
        return Gate.load(
            relevance=engine.relevance,
            weights_path=engine.weights_path,
            model_path=engine.model_path,
            weights_optional=engine.weights_optional,
        )
    except (ValueError, OSError) as exc:
        log.warning("remote_gate_weights_refused", why=str(exc))
        return Gate.load(
            relevance=engine.relevance, weights_path="", model_path="", weights_optional=True
        )


@dataclass
class FinishTimes:
    """Predicted against actual finish times of one backend's answers that ran to their end
    where they were predicted."""

    count: int = 0
    predicted_sum_s: float = 0.0
    actual_sum_s: float = 0.0
    last_predicted_s: float | None = None
    last_actual_s: float | None = None

    def add(self, predicted_s: float, actual_s: float) -> None:
        self.count += 1
        self.predicted_sum_s += predicted_s
        self.actual_sum_s += actual_s
        self.last_predicted_s, self.last_actual_s = predicted_s, actual_s

    def as_dict(self) -> dict[str, Any]:
        return {
            "count": self.count,
            "last_predicted_s": rounded(self.last_predicted_s, 3),
            "last_actual_s": rounded(self.last_actual_s, 3),
        }


class BackendPool:
    """Every local backend; the bundled engine is always the first."""

    def __init__(
        self,
        backends: list[Backend],
        lengths: AnswerLengths,
        *,
        default_max_tokens: int,
        gate: Callable[[], Gate] | None = None,
    ) -> None:
        self.backends = backends
        self.lengths = lengths
        self.default_max_tokens = default_max_tokens
        # Loads the quality gate the remote backends' answers are scored with in this process:
        # the engine worker's relevance model and weights (proxy.engine.gate).
        self._load_gate = gate
        self.moves = 0
        self.finishes: dict[str, FinishTimes] = {b.name: FinishTimes() for b in backends}

    @classmethod
    def build(cls, settings: Settings, engine: LocalEngine, lengths: AnswerLengths) -> BackendPool:
        local = settings.local
        backends: list[Backend] = [EngineBackend(engine, timeout_s=local.timeout_s)]
        known = Secrets.known(settings)  # what no backend's refusal may carry on
        for entry in local.backends:
            backends.append(
                RemoteBackend(
                    entry,
                    timeout_s=local.timeout_s,
                    default_max_tokens=local.default_max_tokens,
                    prior=lambda: engine.rates,
                    secrets=known,
                )
            )
        return cls(
            backends,
            lengths,
            default_max_tokens=local.default_max_tokens,
            gate=lambda: engine_gate(engine),
        )

    async def start(self) -> None:
        remotes = [b for b in self.backends if isinstance(b, RemoteBackend)]
        if remotes and self._load_gate is not None:
            # Before the first probe: no remote answer is scored by another gate.
            gate = await asyncio.to_thread(self._load_gate)
            for remote in remotes:
                remote.gate = gate
        for backend in self.backends:
            await backend.start()

    async def close(self) -> None:
        for backend in self.backends:
            await backend.close()

    def thinks(self) -> bool:
        """Whether the bundled engine's model thinks (its worker said so when it was ready)."""
        return self.backends[0].thinks()

    def expected_tokens(self, request: dict[str, Any], kind: str = "chat") -> float:
        cap = answer_cap(request, self.default_max_tokens, kind)
        model = request.get("model")
        per_answer = self.lengths.expected(model if isinstance(model, str) else None, cap)
        return per_answer * answers_per_request(request)

    def choose(
        self, request: dict[str, Any], kind: str = "chat", share: str | None = None
    ) -> Choice:
        """The backend with the lowest predicted finish; the engine when none can take it.
        ``share``: the client key's label, whose turn it would wait in."""
        choice = self.alternative(request, kind, exclude=frozenset(), share=share)
        if choice is None:
            engine = self.backends[0]
            expected = self.expected_tokens(request, kind)
            choice = self._choice(engine, engine.predict_for(request, expected, share))
        return choice

    def alternative(
        self,
        request: dict[str, Any],
        kind: str,
        exclude: frozenset[str],
        share: str | None = None,
    ) -> Choice | None:
        expected = self.expected_tokens(request, kind)
        scored = [
            (b, b.predict_for(request, expected, share))
            for b in self.backends
            if b.name not in exclude and b.admits(request, kind)
        ]
        if not scored:
            return None
        known = [(b, p) for b, p in scored if p.seconds is not None]
        backend, prediction = (
            min(known, key=lambda bp: bp[1].seconds or 0.0) if known else scored[0]
        )
        return self._choice(backend, prediction)

    def _choice(self, backend: Backend, prediction: Prediction) -> Choice:
        return Choice(backend=backend, prediction=prediction, timeout_s=backend.timeout_s)

    async def run(
        self,
        request: dict[str, Any],
        choice: Choice,
        *,
        deadline: float,
        on_token: Callable[[str], None] | None = None,
        kind: str = "chat",
        share: str = KEYLESS,
        priority: str = INTERACTIVE,
    ) -> tuple[dict[str, Any], Choice]:
        """Run on the chosen backend; when it is down or full, on the next best one that can
        still finish before ``deadline``. Returns the answer and where it ran. ``share``: the
        client key's label, whose turn the request waits in (``proxy.engine.fair_queue``);
        ``priority``: its class of engine work (``proxy.engine.priority``)."""
        tried: set[str] = set()
        while True:
            try:
                completion = await choice.backend.chat(
                    request,
                    deadline=deadline,
                    on_token=on_token,
                    kind=kind,
                    share=share,
                    priority=priority,
                )
                return completion, choice
            except (BackendDown, EngineBusy) as exc:
                tried.add(choice.backend.name)
                remaining = left(deadline)
                nxt = self.alternative(request, kind, frozenset(tried), share)
                seconds = None if nxt is None else nxt.prediction.seconds
                if nxt is None or remaining <= 0 or (seconds is not None and seconds > remaining):
                    raise
                self.moves += 1
                log.info(
                    "request_moved",
                    source=choice.backend.name,
                    target=nxt.backend.name,
                    why=type(exc).__name__,
                )
                choice = nxt

    def finished(self, name: str, predicted_s: float, actual_s: float) -> None:
        """An answer of backend ``name`` ran to its end there: what it took against what was
        predicted when it was routed."""
        self.finishes.setdefault(name, FinishTimes()).add(predicted_s, actual_s)

    def health(self) -> list[dict[str, Any]]:
        out = []
        for backend in self.backends:
            health = backend.health()
            health["finish"] = self.finishes.setdefault(backend.name, FinishTimes()).as_dict()
            out.append(health)
        return out

    def metrics(self) -> Iterator[Metric]:
        up = GaugeMetricFamily(
            "frugal_backend_up", "1 when the local backend takes requests.", labels=["backend"]
        )
        wait = GaugeMetricFamily(
            "frugal_backend_predicted_wait_seconds",
            "Predicted seconds of work queued and running on the local backend.",
            labels=["backend"],
        )
        prefill = GaugeMetricFamily(
            "frugal_backend_prefill_tokens_per_second",
            "Profiled prompt-processing rate of the local backend.",
            labels=["backend"],
        )
        decode = GaugeMetricFamily(
            "frugal_backend_decode_tokens_per_second",
            "Profiled generation rate of the local backend.",
            labels=["backend"],
        )
        queue = GaugeMetricFamily(
            "frugal_backend_queue_depth",
            "Requests waiting for the local backend.",
            labels=["backend"],
        )
        for health in self.health():
            name = [str(health["name"])]
            up.add_metric(name, 1.0 if health["state"] in ("ready", "up") else 0.0)
            queue.add_metric(name, float(health.get("queue_depth") or 0))
            for family, key in ((wait, "predicted_wait_s"), (prefill, "prefill_tok_s")):
                if health.get(key) is not None:
                    family.add_metric(name, float(health[key]))
            if health.get("decode_tok_s") is not None:
                decode.add_metric(name, float(health["decode_tok_s"]))
        yield from (up, wait, prefill, decode, queue)
        yield from self._finish_metrics()
        yield from _published_metrics(self.health())

    def _finish_metrics(self) -> Iterator[Metric]:
        finish = SummaryMetricFamily(
            "frugal_backend_finish_seconds",
            "Finish times of local answers that ran to their end on the backend they were "
            "routed to: as predicted when routed, and as they happened.",
            labels=["backend", "measure"],
        )
        for name, times in self.finishes.items():
            finish.add_metric([name, "predicted"], times.count, times.predicted_sum_s)
            finish.add_metric([name, "actual"], times.count, times.actual_sum_s)
        yield finish


def _published_metrics(healths: list[dict[str, Any]]) -> Iterator[Metric]:
    """The load remote servers publish (``proxy.routing.remote_load``), as last read."""
    published = GaugeMetricFamily(
        "frugal_backend_published_requests",
        "Requests the backend's server says it is running or holding waiting, every "
        "client's, as last read.",
        labels=["backend", "state"],
    )
    foreign = GaugeMetricFamily(
        "frugal_backend_foreign_requests",
        "Requests of other clients on the backend's server (published running and waiting "
        "minus this proxy's), as last read.",
        labels=["backend"],
    )
    for health in healths:
        load = health.get("published")
        if not isinstance(load, dict):
            continue
        name = str(health["name"])
        for state in ("running", "waiting"):
            if load.get(state) is not None:
                published.add_metric([name, state], float(load[state]))
        if load.get("foreign") is not None:
            foreign.add_metric([name], float(load["foreign"]))
    yield from (published, foreign)
