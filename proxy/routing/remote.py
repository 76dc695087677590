"""Remote local backends: other OpenAI-compatible inference servers (``[[local.backends]]``).

``llama-server`` or ``python -m llama_cpp.server`` on another box or a GPU, vLLM, Ollama, or
another ``frugal serve`` (asked for its model ``local``, so that it answers locally and never
through its own API). Its ``kind`` (:mod:`proxy.routing.remote_kinds`) says how a request is put
to it and which requests it cannot honour: those are not admitted, and go to the bundled engine
or the API. Legacy completions (``kind="complete"``) go to its ``/completions`` when its kind
takes them, whole (scored, then replayed by the caller as the engine's are). ``n`` above what
its server answers at once is asked one answer at a time (``Kind.calls``), each answer scored.

A remote backend answers ``max_concurrency`` requests at once; the others wait in its FIFO queue
(at most ``max_queue``; :mod:`proxy.routing.slots`). Its rates are measured by timing its
answers (:mod:`proxy.routing.remote_rates`). Where its kind publishes the server's load, the
requests other clients have there are counted in its predicted finish
(:mod:`proxy.routing.remote_load`). Its answers are scored in a thread by the same gate as the
bundled engine's (:class:`proxy.engine.gate.Gate`: the same quality code, relevance model and
weights), with logprobs when the server gives them.

Streams: for a ``live`` stream (``on_token``) the server is asked for a stream and its tokens are
relayed as they come (:class:`~proxy.routing.remote_stream.StreamedAnswer` puts the answer
together for the gate and the ledger). A stream that breaks before its first token is a failure
like any other (another backend, or the API); after it, the failure is
:class:`~proxy.errors.EngineCrashed`, never moved to another backend, and the client's stream
ends with an error event. A stream that ends without a finish reason was cut (llama-cpp-python
ends a stream with ``[DONE]`` when another request arrives) and is a failure too.

Faults: a backend is used only after a health probe has answered; one that stops answering, or
answers wrongly, is marked down (its queued and running calls fail with
:class:`~proxy.routing.base.BackendDown`, and move on) and probed again until it answers
(:mod:`proxy.routing.remote_probe`).

Size: an answer is read chunk by chunk, never past ``max_answer_bytes`` (a JSON body, a
stream's bytes with a line that never ends, a probe's model list): past it the connection is
dropped and the call fails (:class:`~proxy.routing.remote_stream.AnswerTooLarge`, an
:class:`~proxy.errors.EngineCrashed`: the request goes to the API). A body over
:data:`~proxy.routing.remote_wire.PARSE_IN_THREAD_BYTES` is parsed in a thread, inside the
call's deadline (:func:`~proxy.routing.remote_wire.post`); the answer is scored in a thread,
and a score not done by the request's deadline is an :class:`~proxy.errors.EngineTimeout` (the
thread finishes on its own, on an answer that the bound keeps small).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass
from functools import partial
from typing import Any

import httpx

from proxy.config import BackendSettings
from proxy.config.secrets import NO_SECRETS, Secrets
from proxy.engine.gate import Gate
from proxy.engine.local_engine import Ask
from proxy.engine.rates import PendingWork, Rates, WorkTracker
from proxy.errors import EngineBusy, EngineCrashed, EngineTimeout
from proxy.routing.base import Backend, BackendDown, left, rounded
from proxy.routing.estimator import Prediction, answer_cap, answers_per_request, predict
from proxy.routing.prefix_memory import PrefixMemory
from proxy.routing.remote_health import answer_problem
from proxy.routing.remote_kinds import KINDS
from proxy.routing.remote_load import SOURCES, Load, LoadWatch, read_load, with_foreign
from proxy.routing.remote_probe import WRONG_ANSWER_PAUSE_S, Probing, RemoteStats
from proxy.routing.remote_rates import RemoteRates
from proxy.routing.remote_stream import AnswerTooLarge, Relay, StreamCut
from proxy.routing.remote_wire import (
    Reply,
    Wire,
    completion_body,
    merge_answers,
    post,
    request_body,
    split_n,
    stop_cause,
)
from proxy.routing.slots import Slots

STOP_GRACE_S = 1.0  # how long a cancelled call or watch may take to end
# An idle connection is not reused after this: llama-server and uvicorn close theirs after 5 s
# (the race is told at proxy.upstream.direct_route.KEEPALIVE_S)
_KEEPALIVE_S = 4.0


@dataclass(frozen=True)
class _Asked:
    """What one request's answer is held to: its ``deadline``, the seconds it is
    ``expected_s`` to take, its token ``cap``, and its ``kind`` ("chat" or "complete")."""

    deadline: float
    expected_s: float
    cap: int
    kind: str


class RemoteBackend(Probing, Backend):
    """Another OpenAI-compatible llama.cpp server; see the module docstring."""

    kind = "remote"

    def __init__(
        self,
        settings: BackendSettings,
        *,
        timeout_s: float,
        default_max_tokens: int,
        prior: Callable[[], Rates],
        transport: httpx.AsyncBaseTransport | None = None,
        gate: Gate | None = None,
        secrets: Secrets | None = None,
    ) -> None:
        self.settings = settings
        # What no refusal of this backend may carry on (its own key at least): the pool gives
        # every backend all the secrets the proxy knows (proxy.config.secrets).
        self.secrets = Secrets.of([settings.api_key()]) if secrets is None else secrets
        # The quality gate its answers are scored with: the pool gives every backend the one
        # the engine worker scores with (proxy.engine.gate); alone, the shipped weights.
        self.gate = gate or Gate()
        self.name = settings.name
        self.server = KINDS[settings.kind]
        self.timeout_s = settings.timeout_s or timeout_s
        self.slots = settings.max_concurrency
        self.default_max_tokens = default_max_tokens
        self.state = "probing"  # probing | up | down | closed
        self.error: str | None = None
        self.last_down: str | None = None  # why it was last marked down, kept once up again
        self.work = WorkTracker()
        self.memory = PrefixMemory()
        self.stats = RemoteStats()
        self.logprobs = settings.logprobs and self.server.gate_logprobs
        self._transport = transport
        self._rates = RemoteRates(
            prefill_tok_s=settings.prefill_tok_s, decode_tok_s=settings.decode_tok_s, prior=prior
        )
        self._slots = Slots(settings.max_concurrency)
        self._calls: set[asyncio.Task[Reply]] = set()  # POSTs in flight
        self._client: httpx.AsyncClient | None = None
        self._prober: asyncio.Task[None] | None = None
        self._checks: set[asyncio.Task[None]] = set()
        self._hinted = False  # _hint_kind has looked at a probe's answer
        # The load its server publishes, for the kinds that publish one (remote_load.py)
        self.load = LoadWatch(self.name, self._read_load) if SOURCES.get(settings.kind) else None

    # -- life cycle --------------------------------------------------------------------------

    async def start(self) -> None:
        headers = {}
        key = self.settings.api_key()
        if key:
            headers["authorization"] = f"Bearer {key}"
        self._client = httpx.AsyncClient(
            base_url=self.settings.api_base.rstrip("/") + "/",
            headers=headers,
            timeout=httpx.Timeout(None, connect=self.settings.probe_timeout_s),
            limits=httpx.Limits(max_connections=self.slots + 4, keepalive_expiry=_KEEPALIVE_S),
            transport=self._transport,
            trust_env=False,
        )
        self._probe_until_up()

    async def close(self) -> None:
        self.state = "closed"
        if self.load is not None:
            await self.load.close()
        tasks: list[asyncio.Task[Any]] = [t for t in (self._prober, *self._checks) if t]
        tasks += self._calls
        await stop_tasks(tasks)
        self._slots.fail_all(lambda: BackendDown(f"backend {self.name} is closed"))
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    # -- health ------------------------------------------------------------------------------

    def ready(self) -> bool:
        return self.state == "up"

    def admits(self, request: dict[str, Any], kind: str) -> bool:
        room = self._slots.free > 0 or self._slots.waiting < self.settings.max_queue
        if not (self.ready() and room and kind in ("chat", "complete")):
            return False
        return self.server.refuses(request, kind) is None

    # -- prediction --------------------------------------------------------------------------

    @property
    def rates(self) -> Rates:
        return self._rates.rates

    def pending_work(self) -> PendingWork:
        return self.work.pending(self.rates)

    def predict(self, request: dict[str, Any], completion_tokens: float) -> Prediction:
        """The predicted finish time here, counting the requests other clients have on the server
        when it publishes them (:func:`~proxy.routing.remote_load.with_foreign`)."""
        prompt = self.work.estimate_prompt_tokens(request)
        prompt *= 1.0 - self.memory.cached_share(request)
        pending = self.pending_work()
        slots = self.slots
        load = None
        if self.load is not None:
            self.load.used()
            load = self.load.fresh()
        if load is not None and sum(load.foreign()) > 0:
            answer = self.work.mean_answer_tokens or completion_tokens
            pending = with_foreign(pending, load, prompt_tokens=prompt, answer_tokens=answer)
            # the server's slots are shared: it has at least as many as it runs
            slots = load.slots or max(slots, load.running or 0)
        return predict(
            self.name,
            rates=self.rates,
            pending=pending,
            prompt_tokens=prompt,
            completion_tokens=completion_tokens,
            slots=slots,
            overhead_s=self._rates.overhead.value or 0.0,
        )

    async def _read_load(self) -> tuple[Load | None, str | None]:
        if self._client is None or self.state != "up":
            return None, None
        return await read_load(
            self._client, self.settings.kind, self.settings.api_base, lambda: len(self._calls)
        )

    # -- one request -------------------------------------------------------------------------

    async def answer(self, request: dict[str, Any], ask: Ask) -> dict[str, Any]:
        """Answer through the remote server before ``ask.deadline``; with ``ask.on_token``, as
        a stream whose text is handed to ``on_token`` as it comes."""
        deadline, on_token, kind = ask.deadline, ask.on_token, ask.kind
        if self.state != "up":
            raise BackendDown(f"backend {self.name} is {self.state}")
        if self._slots.free <= 0 and self._slots.waiting >= self.settings.max_queue:
            raise EngineBusy(f"the queue of backend {self.name} is full")
        cap = answer_cap(request, self.default_max_tokens, kind)
        expected = self.predict(request, cap).own_s
        ticket = self.work.admit(request, cap * answers_per_request(request))
        completion: dict[str, Any] | None = None
        try:
            await self._slots.acquire(deadline, f"backend {self.name}")
            try:
                if self.state != "up":
                    raise BackendDown(f"backend {self.name} is {self.state}")
                self.work.start(ticket)
                self.memory.remember(request)
                asked = _Asked(deadline, expected, cap, kind)
                completion = await self._answer(request, asked, on_token)
                return completion
            finally:
                self._slots.release()
        except BackendDown:
            self.stats.handed_on += 1
            raise
        finally:
            self.work.finish(ticket, request, completion)

    async def _send(
        self, body: dict[str, Any], relay: Relay, path: str = "chat/completions"
    ) -> Reply:
        """POST ``body`` to ``path`` (:func:`~proxy.routing.remote_wire.post`)."""
        assert self._client is not None
        return await post(self._client, path, body, relay, self.settings.max_answer_bytes)

    def _body(
        self, request: dict[str, Any], cap: int, stream: bool, kind: str = "chat"
    ) -> dict[str, Any]:
        wire = Wire(model=self.settings.model, cap=cap, logprobs=self.logprobs, kind=self.server)
        if kind == "complete":
            return completion_body(request, wire)
        return request_body(request, wire, stream=stream)

    async def _answer(
        self, request: dict[str, Any], asked: _Asked, on_token: Callable[[str], None] | None
    ) -> dict[str, Any]:
        """The answer to ``request``: one call, or, for ``n`` above what the server answers
        at once, one call per answer, one after the other (``Kind.calls``), merged."""
        calls = self.server.calls(request)
        if calls == 1:
            return await self._one_answer(request, asked, on_token)
        answers = []
        for part in split_n(request, calls):  # never a live stream: n > 1
            answers.append(await self._one_answer(part, asked, None))
        return merge_answers(answers)

    async def _one_answer(
        self, request: dict[str, Any], asked: _Asked, on_token: Callable[[str], None] | None
    ) -> dict[str, Any]:
        deadline, expected_s, cap, kind = asked.deadline, asked.expected_s, asked.cap, asked.kind
        text = kind == "complete"  # a legacy completion: never a live stream
        stream = on_token is not None and not text
        path = "completions" if text else "chat/completions"
        body = self._body(request, cap, stream, kind)
        started = time.perf_counter()
        relay = Relay(
            on_token if stream else None,
            int(self.work.estimate_prompt_tokens(request)),
            self.stats,
        )
        response = await self._call(self._send(body, relay, path), deadline, expected_s, relay)
        if response.status == 400 and body.get("logprobs") and not request.get("logprobs"):
            # A server that refuses logprobs: ask again without, and stop asking.
            self.logprobs = False
            body = self._body(request, cap, stream, kind)
            response = await self._call(self._send(body, relay, path), deadline, expected_s, relay)
        elapsed = time.perf_counter() - started
        if response.status >= 500:
            self.stats.failures += 1
            self._check_soon(f"HTTP {response.status}")
            raise EngineCrashed(f"backend {self.name} answered HTTP {response.status}")
        if response.status != 200:
            self.stats.failures += 1
            refused = self.secrets.scrub_tree(response.error())  # it may echo our key
            raise EngineCrashed(f"backend {self.name} refused the request: {refused}")
        try:
            completion = response.json()
            # the shape is checked here: a chat message, or a legacy completion's text
            answer = completion["choices"][0]["text" if text else "message"]
            if not isinstance(answer, str if text else dict):
                raise TypeError(f"the answer is a {type(answer).__name__}")
            problem = answer_problem(self.server, completion, self.settings.model)
        except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
            problem = f"its answer is not a {'text' if text else 'chat'} completion's JSON"
            cause: Exception | None = exc
        else:
            cause = None
        if problem is not None:
            # A server that answers wrongly is marked down (the reason in /healthz): the
            # request moves on, as from a server that does not answer, and it is probed again.
            self.stats.failures += 1
            self.mark_down(f"wrong answer: {problem}", pause_s=WRONG_ANSWER_PAUSE_S)
            down = BackendDown(f"backend {self.name} answered wrongly: {problem}")
            raise relay.after_first_token(down) from cause
        self.stats.completed += 1
        if self.load is not None:
            self.load.answered()
        info = self._rates.observe(completion, elapsed)
        if relay.answer is not None and relay.answer.usage is None:
            info["usage_source"] = "estimated"  # no usage chunk: counted by StreamedAnswer
        info["stop_cause"] = stop_cause(completion, cap)
        scored = {**request, "max_tokens": request.get("max_tokens") or cap} if text else request
        try:
            # asyncio.timeout, not wait_for (see probe); the thread, which cannot be stopped,
            # finishes on its own after the deadline, on an answer the size bound keeps small.
            async with asyncio.timeout(left(deadline)):
                verdict = await asyncio.to_thread(
                    partial(self.gate.score_answer, text=text),
                    scored,
                    {**completion, "frugal": info},
                )
        except TimeoutError:
            self.stats.timeouts += 1
            raise EngineTimeout(
                f"backend {self.name}'s answer was not scored before the deadline"
            ) from None
        except Exception as exc:  # noqa: BLE001 - as a failure in the engine worker's gate
            raise EngineCrashed(f"scoring the answer of backend {self.name} failed") from exc
        info["quality"] = verdict
        info["backend"] = self.name
        completion["frugal"] = info
        completion.pop("timings", None)
        return dict(completion)

    async def _call(
        self,
        send: Coroutine[Any, Any, Reply],
        deadline: float,
        expected_s: float,
        relay: Relay,
    ) -> Reply:
        """Run ``send``; ends early with BackendDown when the backend is found dead, and with
        EngineTimeout at the deadline. Once ``relay`` has handed on a token, a failure is
        EngineCrashed: the request cannot move to another backend mid-answer."""
        call = asyncio.create_task(send)
        self._calls.add(call)
        watch = asyncio.create_task(self._watch(expected_s, call))
        try:
            done, _ = await asyncio.wait(
                {call, watch}, timeout=left(deadline), return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            self._calls.discard(call)
            await stop_tasks((watch, call))
        if call in done and not call.cancelled():
            try:
                return call.result()
            except Exception as exc:  # noqa: BLE001 - any client failure is a local failure
                self.stats.failures += 1
                failure = backend_failure(self.name, exc, self.secrets)
                if isinstance(failure, BackendDown):
                    self.mark_down(type(exc).__name__)
                raise relay.after_first_token(failure) from exc
        if call in done or watch in done:  # cancelled by mark_down, or found dead
            raise relay.after_first_token(BackendDown(f"backend {self.name} stopped answering"))
        self.stats.timeouts += 1
        self._check_soon("no answer before the deadline")
        raise EngineTimeout(f"backend {self.name} did not answer before the deadline")

    def health(self) -> dict[str, Any]:
        rates = self.rates
        pending = self.pending_work()
        return {
            "name": self.name,
            "kind": self.kind,
            "server": self.settings.kind,
            "api_base": self.settings.api_base,
            "state": self.state,
            "error": self.error,
            "last_down": self.last_down,
            "running": self.slots - max(self._slots.free, 0) if self.state != "closed" else 0,
            "queue_depth": self._slots.waiting,
            "max_concurrency": self.slots,
            "max_queue": self.settings.max_queue,
            "prefill_tok_s": rounded(rates.prefill_tok_s),
            "decode_tok_s": rounded(rates.decode_tok_s),
            "rates_source": rates.source,
            "overhead_s": rounded(self._rates.overhead.value, 3),
            "predicted_wait_s": rounded(pending.seconds(rates), 2),
            "logprobs": self.logprobs,
            "completed": self.stats.completed,
            "failures": self.stats.failures,
            "timeouts": self.stats.timeouts,
            "downs": self.stats.downs,
            "handed_on": self.stats.handed_on,
            "streamed": self.stats.streamed,
            "streamed_pieces": self.stats.streamed_pieces,
            "published": None if self.load is None else self.load.health(),
        }


async def stop_tasks(tasks: Iterable[asyncio.Task[Any]], grace_s: float = STOP_GRACE_S) -> None:
    """Cancel ``tasks`` and give them ``grace_s`` to end, never longer. Their own errors are
    theirs (a cancelled call's), but a cancellation of the caller goes on up: ``asyncio.wait``
    neither raises what the tasks raised nor swallows the caller's CancelledError."""
    pending = [task for task in tasks if not task.done()]
    for task in pending:
        task.cancel()
    if pending:
        await asyncio.wait(pending, timeout=grace_s)


def backend_failure(name: str, exc: Exception, secrets: Secrets = NO_SECRETS) -> EngineCrashed:
    """What a failed call to remote backend ``name`` is to the router.

    This is not :func:`proxy.upstream.failures.translate`, which tells a client how the paid API
    failed: a local backend that fails is a reason to try another backend, or the API. An httpx
    transport error (refused, reset, timed out, cut off) is :class:`BackendDown`, and the caller
    marks the backend down; anything else (an answer past ``max_answer_bytes`` too) is
    :class:`~proxy.errors.EngineCrashed`. What the backend said (a stream's error event) is
    cleared of ``secrets`` first.
    """
    if isinstance(exc, httpx.TransportError):
        return BackendDown(f"backend {name} is unreachable: {exc!r}")
    if isinstance(exc, AnswerTooLarge):  # not marked down: another request's answer may fit
        return EngineCrashed(f"backend {name}'s answer was too large: {exc}")
    if isinstance(exc, StreamCut | ValueError):  # a cut stream, or an event that is not JSON
        return EngineCrashed(f"backend {name}'s stream broke off: {secrets.scrub_tree(str(exc))}")
    return EngineCrashed(f"backend {name}: {type(exc).__name__}")
