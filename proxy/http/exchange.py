"""One request's exchange, and the life cycle every cascade handler shares.

    Exchange       what one request did: ids, model, route, reason, status, quality, tokens,
                   timings, upstream attempts; gathered as it goes
    Handler        the life cycle around one request, and its shared steps:
                     __call__     start -> handle -> exactly one ledger row (``finish``)
                     begin        the model noted, the route planned, the quality bar set
                     try_local    the local attempt, judged: the answer to send, or None
                     from_api     one upstream call (JSON), timed, its attempts counted
                     stream       the SSE response, which writes the row when it ends
                     finish       the ledger row, the metrics and the log line, once;
                                  then a drawn shadow audit starts in the background
                                  (offer_audit, start_audit; proxy.audit.runner)
    public_answer  the engine's completion as OpenAI sends it (chat, or legacy text)

A handler (:mod:`proxy.http.chat`, :mod:`proxy.http.completions`) implements ``handle`` with
these steps and returns JSON or ``stream(...)``. The row is written by ``__call__``'s ``finally``
for a JSON answer or an error, and by the :class:`proxy.http.sse.EventStream` of a stream when
its last byte is out or its client left (status 499, ``client_gone``). Upstream failures arrive
as :class:`~proxy.errors.ProxyError` (the upstream client translates its own): their status,
code and attempts go into the row as they are.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncGenerator, Awaitable, Iterable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import structlog
from starlette.requests import Request
from starlette.responses import Response

from proxy.audit.runner import Case
from proxy.audit.sampler import Ticket
from proxy.errors import (
    BadRequest,
    BudgetExhausted,
    BudgetUnavailable,
    LocalUnavailable,
    ProxyError,
)
from proxy.http import sse
from proxy.http.metrics import PUSD_PER_USD
from proxy.http.render import sse_event, unexpected
from proxy.http.services import Services
from proxy.ledger.pricing import estimate_costs
from proxy.ledger.tokens import CountJob
from proxy.routing.estimator import Prediction
from proxy.routing.router import LOCAL_ALIAS, ROUTE_HEADER, LocalAttempt, Plan
from proxy.upstream.client import UpstreamResponse

log = structlog.get_logger("frugal.request")

MIN_QUALITY_HEADER = "x-frugal-min-quality"
SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}


@dataclass
class Exchange:
    """What one request did, gathered as it goes, for the headers, the log and the ledger."""

    request_id: str
    endpoint: str = "chat.completions"  # the ledger's name: chat.completions | completions | ...
    started: float = field(default_factory=time.perf_counter)
    arrived: float = field(default_factory=time.time)
    model: str | None = None
    stream: bool = False
    route: str = "none"
    reason: str = "error"
    status: int = 200
    quality: float | None = None
    quality_reasons: list[str] = field(default_factory=list)
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int = 0
    local_prompt_tokens: int | None = None
    local_completion_tokens: int | None = None
    local_ms: float = 0.0
    api_ms: float = 0.0
    error: str | None = None
    body: dict[str, Any] | None = None  # the request in chat form, for the ledger's token count
    local_completion: dict[str, Any] | None = None
    key_name: str | None = None  # the client key's name, never the key
    content_in: Any = None  # messages and answer text: kept only when [server] log_content
    content_out: list[str] | None = None
    predicted_local_ms: float | None = None  # the router's prediction (proxy.routing)
    actual_local_ms: float | None = None
    backend: str | None = None
    predicted_completion_tokens: int | None = None
    upstream_attempts: int | None = None  # HTTP attempts made upstream, retries included
    recorded: bool = False  # its ledger row is written (once, whatever happens after)
    # The key's budget reservation, settled by finish; the response cache's entry (quotas).
    reservation: Any = None
    cache_key: str | None = None
    cache_read: bool = False  # a hit may be served (no Cache-Control: no-cache)
    # A drawn shadow audit (proxy.audit): run when the exchange ends, off the request path.
    audit: tuple[Ticket, Case] | None = None
    audit_reference: dict[str, Any] | None = None  # the API's answer to a rejected attempt
    audit_text: list[str] | None = None  # ... or its streamed text

    def headers(self) -> dict[str, str]:
        return {
            "x-request-id": self.request_id,
            "x-frugal-route": self.route,
            "x-frugal-reason": self.reason,
            "x-frugal-quality": "none" if self.quality is None else f"{self.quality:.3f}",
        }

    def take_plan(self, plan: Plan) -> None:
        if plan.choice is not None:
            self.take_prediction(plan.choice.prediction)

    def take_prediction(self, prediction: Prediction) -> None:
        self.backend = prediction.backend
        self.predicted_completion_tokens = round(prediction.completion_tokens)
        if prediction.seconds is not None:
            self.predicted_local_ms = round(prediction.seconds * 1000, 2)

    def take_local(self, attempt: LocalAttempt) -> None:
        self.local_ms = attempt.elapsed_ms
        if attempt.prediction is not None:
            self.take_prediction(attempt.prediction)
        if attempt.choice is not None:
            self.backend = attempt.choice.backend.name  # where it ran, if it was moved
        if attempt.actual_s is not None:
            self.actual_local_ms = round(attempt.actual_s * 1000, 2)
        self.local_completion = attempt.completion
        self.quality = attempt.quality
        self.quality_reasons = attempt.quality_reasons
        if attempt.completion is not None:
            usage = attempt.completion.get("usage") or {}
            self.local_prompt_tokens = usage.get("prompt_tokens")
            self.local_completion_tokens = usage.get("completion_tokens")

    def take_usage(self, usage: dict[str, Any] | None) -> None:
        if usage:
            self.prompt_tokens = usage.get("prompt_tokens")
            self.completion_tokens = usage.get("completion_tokens")
            details = usage.get("prompt_tokens_details") or {}
            self.cached_tokens = int(details.get("cached_tokens") or 0)

    def keep(self, completion: dict[str, Any]) -> None:
        """Keep the answer's text for the content log (only when it is on)."""
        if self.content_out is not None:
            for choice in completion.get("choices") or []:
                self.content_out.append(str((choice.get("message") or {}).get("content") or ""))

    def keep_sse(self, chunk: bytes) -> None:
        keepers = [k for k in (self.content_out, self.audit_text) if k is not None]
        if not keepers:
            return
        for line in chunk.split(b"\n"):
            if line.startswith(b"data: {"):
                with contextlib.suppress(ValueError, AttributeError, IndexError, TypeError):
                    delta = json.loads(line[6:])["choices"][0]["delta"]
                    for keeper in keepers:
                        keeper.append(str(delta.get("content") or ""))


class Handler:
    """One endpoint of the cascade: the life cycle around ``handle``, and its shared steps."""

    endpoint: ClassVar[str] = ""  # the ledger's name for the endpoint
    prompt_param: ClassVar[str] = "messages"  # the request field an overflow error names
    prompt_noun: ClassVar[str] = "the conversation"

    def __init__(self, services: Services) -> None:
        self.services = services
        self.router = services.router

    async def __call__(self, request: Request) -> Response:
        ex = Exchange(
            request_id=request.state.request_id,
            endpoint=self.endpoint,
            key_name=getattr(request.state, "key_name", None),
        )
        streaming = False
        try:
            response = await self.handle(request, ex)
            streaming = isinstance(response, sse.EventStream)  # it writes the row itself
            return response
        except ProxyError as exc:
            ex.status = exc.status
            ex.error = exc.code or exc.type
            if isinstance(exc, BadRequest):
                ex.reason = "bad_request"
            raise
        except asyncio.CancelledError:
            # The client disconnected before its answer was ready (see proxy/http/disconnect.py).
            ex.status = 499
            ex.error = "client_gone"
            raise
        except BaseException:
            ex.status = 500
            ex.error = "internal_error"
            raise
        finally:
            if not streaming:
                self.finish(ex)

    async def handle(self, request: Request, ex: Exchange) -> Response:
        raise NotImplementedError

    # -- the shared steps -----------------------------------------------------------------------

    def begin(self, request: Request, body: dict[str, Any], ex: Exchange) -> tuple[Plan, float]:
        """The validated ``body``'s model and mode noted; its plan and quality bar."""
        ex.model = body["model"]
        ex.stream = bool(body.get("stream"))
        plan = self.router.plan(body, request.headers.get(ROUTE_HEADER))
        ex.take_plan(plan)
        threshold = self.router.threshold(request.headers.get(MIN_QUALITY_HEADER), body["model"])
        return plan, threshold

    async def try_local(
        self, body: dict[str, Any], plan: Plan, threshold: float, ex: Exchange, *, kind: str
    ) -> dict[str, Any] | None:
        """Ask the local model (``kind``: ``chat`` or ``complete``); its completion when it is
        to be sent, None to go to the API (see :meth:`judge`)."""
        attempt = await self.router.try_local(body, threshold=threshold, kind=kind, plan=plan)
        ex.take_local(attempt)
        kept = self.judge(attempt, plan, ex)
        self.offer_audit(body, attempt, plan, threshold, ex, accepted=kept is not None)
        return kept

    def offer_audit(
        self,
        body: dict[str, Any],
        attempt: LocalAttempt,
        plan: Plan,
        threshold: float,
        ex: Exchange,
        *,
        accepted: bool,
    ) -> None:
        """Offer this local attempt to the shadow audits (``docs/audit.md``): chat answers
        the cascade could send to the API, accepted or rejected alike. A drawn one runs when
        the exchange ends (:meth:`finish`), in the background."""
        runner = self.services.audit
        completion = attempt.completion
        if (
            runner is None
            or self.endpoint != "chat.completions"
            or completion is None
            or attempt.quality is None
            or plan.local_only
            or not self.router.fallback_enabled
        ):
            return
        ticket = runner.offer(accepted=accepted)
        if ticket is None:
            return
        case = Case(
            request_id=ex.request_id,
            body=body,
            completion=completion,
            accepted=accepted,
            score=attempt.quality,
            threshold=threshold,
        )
        ex.audit = (ticket, case)
        if not accepted:
            ex.audit_text = []

    def judge(self, attempt: LocalAttempt, plan: Plan, ex: Exchange) -> dict[str, Any] | None:
        """The local completion to send, None to go to the API; raises when neither is
        possible (``model: local``, or no fallback configured)."""
        completion = attempt.completion
        if attempt.accepted or (completion is not None and plan.local_only):
            ex.route, ex.reason = "local", "forced" if plan.forced else attempt.reason
        elif completion is not None and not self.router.fallback_enabled:
            ex.route, ex.reason = "local", "no_fallback"
        elif completion is None and (plan.local_only or not self.router.fallback_enabled):
            ex.reason = attempt.reason if plan.local_only else "no_fallback"
            if attempt.reason == "context_overflow":
                raise BadRequest(
                    f"{self.prompt_noun} does not fit the local model's context: {attempt.error}",
                    param=self.prompt_param,
                    code="context_length_exceeded",
                )
            if attempt.reason == "unsupported":
                raise BadRequest(
                    f"the local model cannot serve this request ({attempt.error})",
                    param="model",
                    code="unsupported_locally",
                )
            raise LocalUnavailable(
                f"the local model could not answer ({attempt.reason}) and no API fallback "
                "is " + ("allowed for model 'local'" if plan.local_only else "configured")
            )
        else:
            ex.reason = attempt.reason
            return None
        assert completion is not None
        ex.take_usage(completion.get("usage"))
        return completion

    # -- the key's limits, its budget and the response cache (proxy.http.quotas) -------------

    async def admit(self, request: Request, body: dict[str, Any], ex: Exchange) -> None:
        """The key's models and rpm checked; the cache entry this request may use noted."""
        quotas = self.services.quotas
        if quotas is None:
            return
        await quotas.admit(self.services.auth.stored_key(ex.key_name), body["model"])
        route_model = self.services.upstream.target(body["model"])
        ex.cache_key, ex.cache_read = quotas.cache_key(
            {**body, "_endpoint": self.endpoint},
            ex.key_name,
            route_model,
            request.headers.get("cache-control", ""),
        )

    async def cached(self, ex: Exchange) -> dict[str, Any] | None:
        """The cached answer to this request (route and reason ``cache``), or None."""
        quotas = self.services.quotas
        if quotas is None or not ex.cache_read:
            return None
        answer = await quotas.cached(ex.cache_key)
        if answer is not None:
            ex.route, ex.reason = "cache", "cache"
            ex.take_usage(answer.get("usage"))
            ex.cache_key = None  # nothing to store again
        return answer

    def remember(self, ex: Exchange, answer: dict[str, Any]) -> None:
        """Keep a sent answer for the next identical deterministic request."""
        if self.services.quotas is not None and ex.cache_key is not None:
            self.services.quotas.remember(ex.cache_key, answer)

    async def reserve(self, body: dict[str, Any], ex: Exchange) -> None:
        """Before an API call: the key's worst case reserved against its budget (raises
        ``BudgetExhausted`` 429 or ``BudgetUnavailable`` 503 when it cannot be, the reason
        noted on ``ex``)."""
        quotas = self.services.quotas
        if quotas is None:
            return
        key = self.services.auth.stored_key(ex.key_name)
        api_model = self.services.upstream.target(body["model"])
        try:
            ex.reservation = await quotas.reserve(key, body, api_model, ex.local_prompt_tokens)
        except BudgetExhausted:
            ex.reason = "budget_exhausted"
            raise
        except BudgetUnavailable:
            ex.reason = "budget_unavailable"
            raise

    async def reserve_or_local(
        self, body: dict[str, Any], plan: Plan, threshold: float, ex: Exchange, *, kind: str
    ) -> dict[str, Any] | None:
        """:meth:`reserve`, except that when the budget is spent, a request sent to the API only
        for speed gets a local attempt instead: its completion when the gate accepts it (reason
        ``budget_exhausted``), else the 429 stands. None when the API call may go ahead."""
        try:
            await self.reserve(body, ex)
        except BudgetExhausted:
            if plan.route == "api" and plan.reason == "predicted_slow":
                kept = await self.try_local(body, plan, threshold, ex, kind=kind)
                if kept is not None:
                    ex.reason = "budget_exhausted"
                    return kept
            ex.reason = "budget_exhausted"
            raise
        return None

    async def from_api(self, call: Awaitable[UpstreamResponse], ex: Exchange) -> UpstreamResponse:
        """Await one upstream JSON call: the route, its time, its attempts and usage noted.
        A failure is already a :class:`ProxyError`, carrying the attempts it made."""
        ex.route = "api"
        started = time.perf_counter()
        try:
            reply = await call
        except ProxyError as exc:
            ex.upstream_attempts = exc.attempts
            raise
        finally:
            ex.api_ms = (time.perf_counter() - started) * 1000
        ex.upstream_attempts = reply.attempts
        ex.take_usage(reply.body.get("usage"))
        if ex.audit is not None:
            ex.audit_reference = reply.body
        return reply

    def stream(
        self,
        chunks: AsyncGenerator[bytes, None],
        ex: Exchange,
        *,
        cleanups: Iterable[sse.Cleanup] = (),
    ) -> sse.EventStream:
        """The SSE response of ``chunks``; it writes the row when it ends, however it ends."""

        async def body() -> AsyncGenerator[bytes, None]:
            try:
                async for chunk in chunks:
                    yield chunk
            except Exception as exc:  # noqa: BLE001 - the status line is already out
                ex.error = "stream_failed"  # logged once, and sent as the stream's last event
                yield sse_event(unexpected(exc, ex.request_id, started=True))
                yield sse.DONE
            finally:
                await chunks.aclose()

        def on_end(finished: bool) -> None:
            if not finished:  # the client left before the end (or before the first byte)
                ex.status, ex.error = 499, "client_gone"
            self.finish(ex)

        return sse.EventStream(
            body(),
            headers={**SSE_HEADERS, **ex.headers()},
            on_end=on_end,
            cleanups=tuple(cleanups),
        )

    # -- the ledger row and the log line --------------------------------------------------------

    def finish(self, ex: Exchange) -> None:
        """Write the exchange's ledger row, log line and metrics; once, later calls do nothing."""
        if ex.recorded:
            return
        ex.recorded = True
        services = self.services
        latency_ms = (time.perf_counter() - ex.started) * 1000
        model = ex.model or ""
        row = {
            "request_id": ex.request_id,
            "ts": ex.arrived,
            "endpoint": ex.endpoint,
            "requested_model": ex.model,
            "route": ex.route,
            "reason": ex.reason,
            "status": ex.status,
            "stream": int(ex.stream),
            "quality": ex.quality,
            "quality_reasons": ",".join(ex.quality_reasons[:3]) or None,
            "prompt_tokens": ex.prompt_tokens,
            "completion_tokens": ex.completion_tokens,
            "local_prompt_tokens": ex.local_prompt_tokens,
            "local_completion_tokens": ex.local_completion_tokens,
            "latency_ms": round(latency_ms, 2),
            "local_ms": round(ex.local_ms, 2),
            "api_ms": round(ex.api_ms, 2),
            "error": ex.error,
            "key_name": ex.key_name,
            "api_model": services.upstream.target(model) if model != LOCAL_ALIAS else None,
            "cached_tokens": ex.cached_tokens,
            "predicted_local_ms": ex.predicted_local_ms,
            "actual_local_ms": ex.actual_local_ms,
            "backend": ex.backend,
            "predicted_completion_tokens": ex.predicted_completion_tokens,
            "upstream_attempts": ex.upstream_attempts,
        }
        # Costs for the log and the metrics now; the ledger prices the row itself, recounting
        # a local answer with the requested model's tokenizer off the request path.
        api_cost, counterfactual = estimate_costs(row, services.prices)
        count = None
        if ex.route == "local" and ex.status < 400 and ex.body and ex.local_completion:
            count = CountJob(model=model, body=ex.body, completion=ex.local_completion)
        services.ledger.record(row, count=count)
        self.router.observe(row)
        if ex.audit is not None:
            self.start_audit(ex)
        # A client that left mid-stream still cost what upstream reported for it.
        paid = api_cost if ex.status < 400 or ex.status == 499 else None
        if services.quotas is not None:  # the budget: the real cost replaces the reservation
            services.quotas.settle(ex.reservation, paid if ex.route == "api" else 0)
        services.metrics.observe(
            endpoint=ex.endpoint,
            route=ex.route,
            reason=ex.reason,
            status=ex.status,
            latency_s=latency_ms / 1000,
            prompt_tokens=ex.prompt_tokens,
            completion_tokens=ex.completion_tokens,
            local_prompt_tokens=ex.local_prompt_tokens,
            local_completion_tokens=ex.local_completion_tokens,
            quality=ex.quality,
            api_cost_pusd=paid,
            counterfactual_pusd=counterfactual,
        )
        log.info(
            "request",
            request_id=ex.request_id,
            model=ex.model,
            route=ex.route,
            reason=ex.reason,
            status=ex.status,
            stream=ex.stream,
            quality=None if ex.quality is None else round(ex.quality, 3),
            latency_ms=round(latency_ms, 1),
            local_ms=round(ex.local_ms, 1),
            prompt_tokens=ex.prompt_tokens,
            completion_tokens=ex.completion_tokens,
            cost_usd=None if paid is None else paid / PUSD_PER_USD,
            counterfactual_usd=None if counterfactual is None else counterfactual / PUSD_PER_USD,
            key=ex.key_name,
            error=ex.error,
        )
        if ex.content_out is not None:  # [server] log_content: the operator asked for it
            log.debug(
                "request_content",
                request_id=ex.request_id,
                messages=ex.content_in,
                completion="".join(ex.content_out),
            )

    def start_audit(self, ex: Exchange) -> None:
        """The exchange's drawn audit, started in the background (never awaited here): a
        shadow call for an accepted answer sent locally, the API's answer for a rejected one."""
        runner = self.services.audit
        assert ex.audit is not None and runner is not None
        (ticket, case), ex.audit = ex.audit, None
        if case.accepted:
            if ex.route == "local":
                runner.shadow(ticket, case)
            else:
                runner.give_back(ticket)
            return
        if ex.status == 499:  # the client left: no answer of the API's to grade against
            runner.give_back(ticket)
            return
        reference = ex.audit_reference
        if reference is None and ex.audit_text and ex.status < 400 and ex.error is None:
            text = "".join(ex.audit_text)
            reference = {"choices": [{"message": {"role": "assistant", "content": text}}]}
        if ex.route != "api" or ex.status >= 400:
            reference = None
        runner.reference(ticket, case, reference)


def public_answer(
    completion: dict[str, Any], body: dict[str, Any], *, text: bool = False
) -> dict[str, Any]:
    """The engine's completion as OpenAI sends it: private fields removed, usage in OpenAI's
    keys, logprobs only as ``body`` asked for them.

    ``text``: a legacy text completion, where ``logprobs`` is a count (0: the chosen tokens'
    logprobs without the top ones); else a chat completion, where ``logprobs`` is a flag and
    ``top_logprobs`` the count (0 or absent: every entry's ``top_logprobs`` empty).
    """
    out = {k: v for k, v in completion.items() if k != "frugal"}
    out["usage"] = sse.public_usage(completion.get("usage") or {})
    out["choices"] = [_public_choice(choice, body, text) for choice in completion["choices"]]
    return out


def _public_choice(choice: dict[str, Any], body: dict[str, Any], text: bool) -> dict[str, Any]:
    logprobs = choice.get("logprobs")
    wanted = body.get("logprobs")
    if (wanted is None if text else not wanted) or not isinstance(logprobs, dict):
        return {**choice, "logprobs": None}
    if text and not wanted:
        return {**choice, "logprobs": {**logprobs, "top_logprobs": None}}
    if not text and not body.get("top_logprobs") and logprobs.get("content"):
        content = [{**entry, "top_logprobs": []} for entry in logprobs["content"]]
        return {**choice, "logprobs": {**logprobs, "content": content}}
    return choice


async def aiter_of(chunks: Iterable[bytes]) -> AsyncGenerator[bytes, None]:
    """``chunks`` (made already: a replayed answer) as the async generator a stream takes."""
    for chunk in chunks:
        yield chunk
