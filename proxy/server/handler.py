"""The life cycle every cascade handler shares, and the steps its endpoints are made of.

    Handler        one endpoint of the cascade (:mod:`proxy.server.chat`, :mod:`proxy.server.
                   completions`), which implements ``handle`` with these steps:
      __call__     start -> handle -> exactly one ledger row (:func:`proxy.serving.record.finish`)
      begin        the model noted, the route planned, the quality bar set
      try_local    the local attempt, judged (``judge``): the answer to send, or None; offered
                   to the shadow audits (:mod:`proxy.serving.shadow`)
      admit, cached, remember, reserve, reserve_or_local
                   the key's models, rpm and budget, and the response cache
                   (:mod:`proxy.serving.quotas`); ``reserve`` holds the worst case of the exact
                   body the API call posts (``api_call``), never of the local attempt's count
      from_api     one upstream call (JSON), timed, its attempts counted; a client that
                   leaves meanwhile does not stop it (:mod:`proxy.serving.charges`)
      stream       the SSE response, which writes the row when it ends
    aiter_of       chunks made already (a replayed answer), as a stream's async generator

``handle`` returns JSON or ``stream(...)``. The row is written by ``__call__``'s ``finally`` for
a JSON answer or an error, and by the :class:`proxy.server.sse.EventStream` of a stream when its
last byte is out or its client left (status 499, ``client_gone``; a client that leaves in the
middle of its request body too). An API call whose client left is charged what the API bills
for it (:mod:`proxy.serving.charges`). Upstream failures arrive as
:class:`~proxy.errors.ProxyError` (the upstream client translates its own): their status, code
and attempts go into the row as they are.

Imports :mod:`proxy.routing` (the plan and the local attempt), :mod:`proxy.upstream` (the reply's
type, the chat path), :mod:`proxy.errors` and this room's exchange, record, shadow, render and
sse modules.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, Awaitable, Iterable
from typing import Any, ClassVar

from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from proxy.errors import (
    BadRequest,
    BudgetExhausted,
    BudgetUnavailable,
    LocalUnavailable,
    ProxyError,
)
from proxy.routing.reasons import Reason
from proxy.routing.router import ROUTE_HEADER, LocalAttempt, Plan, deferred_tier
from proxy.server import sse
from proxy.server.render import sse_event, unexpected
from proxy.serving import charges, record, shadow
from proxy.serving.exchange import Exchange
from proxy.serving.services import Services
from proxy.upstream.client import CHAT_PATH, UpstreamResponse

MIN_QUALITY_HEADER = "x-frugal-min-quality"
SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}


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
                ex.reason = Reason.BAD_REQUEST
            raise
        except asyncio.CancelledError:
            # The client disconnected before its answer was ready (see proxy/server/disconnect.py).
            ex.status = 499
            ex.error = "client_gone"
            raise
        except ClientDisconnect:
            # The client closed its socket in the middle of its body: it left, nothing failed.
            ex.status, ex.error, ex.reason = 499, "client_gone", Reason.CLIENT_GONE
            return Response(status_code=499)  # nobody reads it
        except BaseException:
            ex.status = 500
            ex.error = "internal_error"
            raise
        finally:
            if not streaming:
                record.finish(ex, self.services)

    async def handle(self, request: Request, ex: Exchange) -> Response:
        raise NotImplementedError

    # -- the shared steps -----------------------------------------------------------------------

    def begin(self, request: Request, body: dict[str, Any], ex: Exchange) -> tuple[Plan, float]:
        """The validated ``body``'s model and mode noted; its plan and quality bar."""
        ex.model = body["model"]
        ex.stream = bool(body.get("stream"))
        ex.deferred_tier = deferred_tier(body)  # flex: deferred work, marked in its row
        key = getattr(request.state, "client_key", None)  # its share of the local queue
        client = None if key is None else key.identity
        plan = self.router.plan(body, request.headers.get(ROUTE_HEADER), client=client)
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
        shadow.offer(self.services, body, attempt, plan, threshold, ex, accepted=kept is not None)
        return kept

    def judge(self, attempt: LocalAttempt, plan: Plan, ex: Exchange) -> dict[str, Any] | None:
        """The local completion to send, None to go to the API; raises when neither is
        possible (``model: local``, or no fallback configured)."""
        completion = attempt.completion
        if attempt.accepted or (completion is not None and plan.local_only):
            ex.route, ex.reason = "local", Reason.FORCED if plan.forced else attempt.reason
        elif completion is not None and not self.router.fallback_enabled:
            ex.route, ex.reason = "local", Reason.NO_FALLBACK
        elif completion is None and (plan.local_only or not self.router.fallback_enabled):
            ex.reason = attempt.reason if plan.local_only else Reason.NO_FALLBACK
            if attempt.reason == Reason.CONTEXT_OVERFLOW:
                raise BadRequest(
                    f"{self.prompt_noun} does not fit the local model's context: {attempt.error}",
                    param=self.prompt_param,
                    code="context_length_exceeded",
                )
            if attempt.reason == Reason.UNSUPPORTED:
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

    # -- the key's limits, its budget and the response cache (proxy.serving.quotas) -------------

    async def admit(self, request: Request, body: dict[str, Any], ex: Exchange) -> None:
        """The key's models checked (its rpm was, before the body: :mod:`proxy.server.shares`);
        the cache entry this request may use noted, the key's own by its identity."""
        quotas = self.services.quotas
        if quotas is None:
            return
        key = self.services.auth.stored_key(ex.key_name)
        if key is not None:  # a key of the environment's (or none) has no models
            await quotas.admit(key, body["model"])
        if quotas.caching:
            client = getattr(request.state, "client_key", None)  # set by the auth middleware
            ex.cache_key, ex.cache_read = quotas.cache_key(
                {**body, "_endpoint": self.endpoint},
                None if client is None else client.identity,
                self.services.upstream.target(body["model"]),
                request.headers.get("cache-control", ""),
            )

    async def cached(self, ex: Exchange) -> dict[str, Any] | None:
        """The cached answer to this request (route and reason ``cache``), or None."""
        quotas = self.services.quotas
        if quotas is None or not ex.cache_read:
            return None
        answer = await quotas.cached(ex.cache_key)
        if answer is not None:
            ex.route, ex.reason = "cache", Reason.CACHE
            ex.take_usage(answer.get("usage"))
            ex.cache_key = None  # nothing to store again
        return answer

    def remember(self, ex: Exchange, answer: dict[str, Any]) -> None:
        """Keep a sent answer for the next identical deterministic request."""
        if self.services.quotas is not None and ex.cache_key is not None:
            self.services.quotas.remember(ex.cache_key, answer)

    def api_call(
        self, body: dict[str, Any], ex: Exchange, sent: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        """(the path, the exact JSON body) that this endpoint's upstream call for ``body``
        posts (:meth:`Upstream.sent`): chat's, here; an endpoint that calls another path says
        so. ``sent``: the upstream's own ``/v1/responses`` body (:mod:`proxy.server.responses`)."""
        stream = bool(body.get("stream"))
        return CHAT_PATH, self.services.upstream.sent(CHAT_PATH, body, stream=stream)

    async def reserve(
        self, body: dict[str, Any], ex: Exchange, *, sent: dict[str, Any] | None = None
    ) -> None:
        """Before an API call: the key's worst case reserved against its budget (raises
        ``BudgetExhausted`` 429 or ``BudgetUnavailable`` 503 when it cannot be, the reason
        noted on ``ex``), computed from the exact body the call will post (:meth:`api_call`),
        never from the local attempt's figures. ``sent``: what the API is sent, when it is not
        ``body`` (the upstream's own ``/v1/responses``); its worst case is the one reserved."""
        path, posted = self.api_call(body, ex, sent)
        ex.worst_body, ex.worst_path = posted, path  # charged when its cost is never known
        api_model = self.services.upstream.target(body["model"])
        ex.worst_max_output = self.services.prices.max_output_tokens(api_model)
        ex.worst_window = self.services.prices.max_input_tokens(api_model)
        quotas = self.services.quotas
        key = self.services.auth.stored_key(ex.key_name)
        if quotas is None or key is None or key.monthly_budget_pusd is None:
            return  # no budget to hold this call to
        try:
            ex.reservation = await quotas.reserve(key, posted, api_model, path)
        except BudgetExhausted:
            ex.reason = Reason.BUDGET_EXHAUSTED
            raise
        except BudgetUnavailable:
            ex.reason = Reason.BUDGET_UNAVAILABLE
            raise

    async def reserve_or_local(
        self,
        body: dict[str, Any],
        plan: Plan,
        threshold: float,
        ex: Exchange,
        *,
        kind: str,
        sent: dict[str, Any] | None = None,
    ) -> dict[str, Any] | None:
        """The step before an API call, whichever way the request came to it: a plan for the API
        has its reason noted (a local plan's is the attempt's), then :meth:`reserve`, except that
        when the budget is spent, a request sent to the API only for speed gets a local attempt
        instead: its completion when the gate accepts it (reason ``budget_exhausted``), else the
        429 stands. None when the API call may go ahead. ``sent``: as for :meth:`reserve`."""
        if plan.route != "local":
            assert plan.reason is not None  # a plan for the API says why
            ex.reason = plan.reason
        try:
            await self.reserve(body, ex, sent=sent)
        except BudgetExhausted:
            if plan.route == "api" and plan.reason == Reason.PREDICTED_SLOW:
                kept = await self.try_local(body, plan, threshold, ex, kind=kind)
                if kept is not None:
                    ex.reason = Reason.BUDGET_EXHAUSTED
                    return kept
            ex.reason = Reason.BUDGET_EXHAUSTED
            raise
        return None

    async def from_api(self, call: Awaitable[UpstreamResponse], ex: Exchange) -> UpstreamResponse:
        """Await one upstream JSON call: the route, its time, its attempts and usage noted.
        A failure is already a :class:`ProxyError`, carrying the attempts it made."""
        ex.route = "api"
        started = time.perf_counter()
        task = asyncio.ensure_future(call)
        try:
            reply = await asyncio.shield(task)
        except ProxyError as exc:
            ex.upstream_attempts = exc.attempts
            raise
        except asyncio.CancelledError:
            # The client left while the API worked on its request: the API bills it anyway.
            await charges.await_abandoned(task, ex, self.services)
            raise
        finally:
            ex.api_ms = (time.perf_counter() - started) * 1000
        ex.upstream_attempts = reply.attempts
        ex.take_usage(reply.body.get("usage"))
        ex.take_billing(reply.body)
        if ex.audit is not None:
            ex.audit_reference = reply.body
        return reply

    def failed_stream_end(self, err: ProxyError) -> tuple[bytes, ...]:
        """The last events of a stream that failed after its first byte: chat's error event,
        then ``[DONE]`` (a Responses stream ends otherwise)."""
        return sse_event(err), sse.DONE

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
                for end in self.failed_stream_end(unexpected(exc, ex.request_id, started=True)):
                    yield end
            finally:
                await chunks.aclose()

        def on_end(finished: bool) -> None:
            if not finished:  # the client left before the end (or before the first byte)
                ex.status, ex.error = 499, "client_gone"
            record.finish(ex, self.services)

        return sse.EventStream(
            body(),
            headers={**SSE_HEADERS, **ex.headers()},
            on_end=on_end,
            cleanups=tuple(cleanups),
        )


async def aiter_of(chunks: Iterable[bytes]) -> AsyncGenerator[bytes, None]:
    """``chunks`` (made already: a replayed answer) as the async generator a stream takes."""
    for chunk in chunks:
        yield chunk
