"""The cascade every endpoint composes: plan, local attempt, gate, fallback, answer, and exactly
one ledger row.

    Cascade         one per endpoint (:mod:`proxy.serving.chat`, :mod:`proxy.serving.completions`,
                    :mod:`proxy.serving.responses`, :mod:`proxy.server.responses_compact`), made
                    with the endpoint's ledger name, the parameter an overflow names, how its
                    API call is posted and how its stream ends; the endpoint holds one and calls
                    its steps, none subclasses another:
      serve         the life cycle: an Exchange made for a :class:`~proxy.serving.call.Call`,
                    the endpoint's ``handle`` run, exactly one ledger row
                    (:func:`proxy.serving.record.finish`) whatever happens
      begin         the model noted, the route planned, the quality bar set (:class:`Planned`)
      try_local     the local attempt, judged (``judge``): the answer to send, or None; offered
                    to the shadow audits (:mod:`proxy.serving.shadow`)
      only_the_api  a request only the API can serve, sent there at once (or refused)
      local_first   the cascade up to its API call: a kept local answer, or None once the API
                    call's worst case is reserved; ``local_chat`` the same for a chat request,
                    the answer as OpenAI sends it
      admit, cached, remember, reserve, reserve_or_local
                    the key's models, rpm and budget, and the response cache
                    (:mod:`proxy.serving.quotas`); ``reserve`` holds the worst case of the exact
                    body the API call posts (the endpoint's ``api_call``), never of the local
                    attempt's count
      from_api      one upstream call (JSON), timed, its attempts counted; a client that
                    leaves meanwhile does not stop it (:mod:`proxy.serving.charges`)
      open_stream   one upstream stream opened, and its ``close`` (settled, timed)
      live          ``stream_mode = "live"``: the local tokens streamed as they come
                    (:mod:`proxy.serving.live`); only a failure before the first falls back
      stream        the stream of events, which writes the row when it ends

An endpoint's ``handle`` takes the call and its exchange, and returns an
:class:`~proxy.serving.call.Answer` or ``stream(...)``'s :class:`~proxy.serving.call.Events`; no
Starlette here (the server makes the call and sends what comes back, :mod:`proxy.server.calls`).
The row is written by ``serve`` for an answer or an error, and by the events' ``on_end`` when the
server's stream has sent its last byte or its client left (status 499, ``client_gone``; a client
that leaves in the middle of its request body, :class:`~proxy.serving.call.BodyCut`, too). An
API call whose client left is charged what the API bills for it (:mod:`proxy.serving.charges`).
Upstream failures arrive as :class:`~proxy.errors.ProxyError` (the
upstream client translates its own): their status, code and attempts go into the row as they are.
What each step notes goes on the exchange through its named steps (:mod:`proxy.serving.exchange`).

Imports :mod:`proxy.routing` (the plan and the local attempt), :mod:`proxy.upstream` (the reply's
type, the chat path), :mod:`proxy.errors`, :mod:`proxy.protocol.answers`, and this room's call,
charges, events, exchange, live, record, services and shadow modules.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

from proxy.errors import (
    BadRequest,
    BudgetExhausted,
    BudgetUnavailable,
    LocalUnavailable,
    ProxyError,
)
from proxy.protocol.answers import public_answer
from proxy.routing.reasons import Reason
from proxy.routing.router import LocalAttempt, Plan, deferred_tier
from proxy.routing.servable import live_streamable
from proxy.serving import charges, events, record, shadow
from proxy.serving.call import Answer, BodyCut, Call, Cleanup, Events, Outcome
from proxy.serving.exchange import Exchange
from proxy.serving.live import cancel
from proxy.serving.services import Services
from proxy.upstream.client import CHAT_PATH, UpstreamResponse
from proxy.upstream.stream import UpstreamStream

SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}

Handle = Callable[[Call, Exchange], Awaitable[Outcome]]
# (the path, the exact JSON body) an endpoint's upstream call for a request posts; ``sent``:
# the upstream's own body when it is not the request itself (the Responses API's, a compaction).
ApiCall = Callable[
    [Services, dict[str, Any], Exchange, "dict[str, Any] | None"], tuple[str, dict[str, Any]]
]
# How a live stream's bytes are made from its local generation and the queue of its tokens.
LiveChunks = Callable[[asyncio.Task[LocalAttempt], asyncio.Queue[str]], AsyncGenerator[bytes, None]]


def chat_call(
    services: Services, body: dict[str, Any], ex: Exchange, sent: dict[str, Any] | None = None
) -> tuple[str, dict[str, Any]]:
    """Chat's upstream call: ``body`` posted to Chat Completions (:meth:`Upstream.sent`)."""
    stream = bool(body.get("stream"))
    return CHAT_PATH, services.upstream.sent(CHAT_PATH, body, stream=stream)


def chat_stream_end(err: ProxyError) -> tuple[bytes, ...]:
    """The last events of a chat stream that failed after its first byte: the error event,
    then ``[DONE]``."""
    return events.error_event(err), events.DONE


@dataclass(frozen=True, slots=True)
class Planned:
    """What :meth:`Cascade.begin` decided: the router's plan and the quality bar."""

    plan: Plan
    threshold: float


class Cascade:
    """The cascade's steps, for one endpoint; see the module's docstring."""

    def __init__(
        self,
        services: Services,
        *,
        endpoint: str,
        prompt_param: str = "messages",
        prompt_noun: str = "the conversation",
        api_call: ApiCall = chat_call,
        stream_end: Callable[[ProxyError], tuple[bytes, ...]] = chat_stream_end,
    ) -> None:
        self.services = services
        self.router = services.router
        self.endpoint = endpoint  # the ledger's name for the endpoint
        self.prompt_param = prompt_param  # the request field an overflow error names
        self.prompt_noun = prompt_noun
        self.api_call = api_call
        self.stream_end = stream_end

    async def serve(self, call: Call, handle: Handle) -> Outcome:
        """``handle(call, exchange)``, and exactly one ledger row for it."""
        ex = Exchange(request_id=call.request_id, endpoint=self.endpoint, key_name=call.key_name)
        streaming = False
        try:
            outcome = await handle(call, ex)
            streaming = isinstance(outcome, Events)  # they write the row themselves
            return outcome
        except ProxyError as exc:
            ex.failed(exc.status, exc.code or exc.type, bad_request=isinstance(exc, BadRequest))
            raise
        except asyncio.CancelledError:
            # The client disconnected before its answer was ready (see proxy/server/disconnect.py).
            ex.client_left()
            raise
        except BodyCut:
            # The client closed its socket in the middle of its body: it left, nothing failed.
            ex.client_left(mid_body=True)
            return Answer(status=499)  # nobody reads it
        except BaseException:
            ex.crashed()
            raise
        finally:
            if not streaming:
                record.finish(ex, self.services)

    # -- plan, local attempt, gate --------------------------------------------------------------

    def begin(
        self,
        call: Call,
        body: dict[str, Any],
        ex: Exchange,
        *,
        stream: bool | None = None,
        deferred: str | None = None,
    ) -> Planned:
        """The validated ``body``'s model and mode noted (``stream``: when the endpoint streams
        otherwise than ``body`` says); its plan and quality bar. ``deferred``: the tier of
        deferred work the endpoint runs ``body`` as (a background response), where the body
        itself asks for none."""
        streamed = bool(body.get("stream")) if stream is None else stream
        tier = deferred_tier(body) or deferred
        ex.asked(body["model"], stream=streamed, deferred_tier=tier)
        # the key's identity: its share of the local queue
        plan = self.router.plan(body, call.route, client=call.identity, deferred=tier is not None)
        ex.take_plan(plan)
        threshold = self.router.threshold(call.min_quality, body["model"])
        return Planned(plan, threshold)

    async def try_local(
        self, body: dict[str, Any], planned: Planned, ex: Exchange, *, kind: str
    ) -> dict[str, Any] | None:
        """Ask the local model (``kind``: ``chat`` or ``complete``); its completion when it is
        to be sent, None to go to the API (see :meth:`judge`)."""
        plan, threshold = planned.plan, planned.threshold
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
            ex.served_locally(Reason.FORCED if plan.forced else attempt.reason)
        elif completion is not None and not self.router.fallback_enabled:
            ex.served_locally(Reason.NO_FALLBACK)
        elif completion is None and (plan.local_only or not self.router.fallback_enabled):
            ex.refused(attempt.reason if plan.local_only else Reason.NO_FALLBACK)
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
            ex.fell_back(attempt.reason)
            return None
        assert completion is not None
        ex.take_usage(completion.get("usage"))
        return completion

    def only_the_api(self, planned: Planned, ex: Exchange, what: list[str]) -> None:
        """A request that asks for ``what`` only the API can do goes there at once (reason
        ``unsupported``); a 400 when it may not (``model: local``, or no fallback)."""
        if planned.plan.local_only or not self.router.fallback_enabled:
            raise BadRequest(
                "the local model cannot serve this request (" + ", ".join(what) + ")",
                param="model",
                code="unsupported_locally",
            )
        ex.unsupported_locally()

    async def local_first(
        self,
        body: dict[str, Any],
        planned: Planned,
        ex: Exchange,
        *,
        kind: str = "chat",
        sent: dict[str, Any] | None = None,
        local_tried: bool = False,
    ) -> dict[str, Any] | None:
        """The cascade up to its API call: the local completion to send (the gate kept it, or
        the budget is spent and it was asked again), else None once the API call's worst case
        is reserved (:meth:`reserve_or_local`; ``sent`` as for :meth:`reserve`). ``local_tried``:
        the local model has answered already (a ``live`` stream that fell back), so not again."""
        if planned.plan.route == "local" and not local_tried:
            kept = await self.try_local(body, planned, ex, kind=kind)
            if kept is not None:
                return kept
        return await self.reserve_or_local(body, planned, ex, kind=kind, sent=sent)

    async def local_chat(
        self,
        body: dict[str, Any],
        planned: Planned,
        ex: Exchange,
        *,
        sent: dict[str, Any] | None = None,
        local_tried: bool = False,
    ) -> dict[str, Any] | None:
        """:meth:`local_first` for a chat request: the local answer as OpenAI sends it
        (:func:`public_answer`), or None once the API call's worst case is reserved."""
        kept = await self.local_first(body, planned, ex, sent=sent, local_tried=local_tried)
        return None if kept is None else public_answer(kept, body)

    # -- the key's limits, its budget and the response cache (proxy.serving.quotas) -------------

    async def admit(
        self, call: Call, body: dict[str, Any], ex: Exchange, *, cache: bool = True
    ) -> None:
        """The key's models checked (its rpm was, before the body: :mod:`proxy.server.shares`);
        the cache entry this request may use noted (unless ``cache`` is off), the key's own by
        its identity."""
        quotas = self.services.quotas
        if quotas is None:
            return
        key = self.services.auth.stored_key(ex.key_name)
        if key is not None:  # a key of the environment's (or none) has no models
            await quotas.admit(key, body["model"])
        if cache and quotas.caching:
            ex.may_cache(
                *quotas.cache_key(
                    {**body, "_endpoint": self.endpoint},
                    call.identity,
                    self.services.upstream.target(body["model"]),
                    call.cache_control,
                )
            )

    async def cached(self, ex: Exchange) -> dict[str, Any] | None:
        """The cached answer to this request (route and reason ``cache``), or None."""
        quotas = self.services.quotas
        if quotas is None or not ex.cache_read:
            return None
        answer = await quotas.cached(ex.cache_key)
        if answer is not None:
            ex.served_from_cache(answer)
        return answer

    def remember(self, ex: Exchange, answer: dict[str, Any]) -> None:
        """Keep a sent answer for the next identical deterministic request; not a local one
        sent only because the budget is spent."""
        if (
            self.services.quotas is not None
            and ex.cache_key is not None
            and ex.reason is not Reason.BUDGET_EXHAUSTED
        ):
            self.services.quotas.remember(ex.cache_key, answer)

    async def reserve(
        self, body: dict[str, Any], ex: Exchange, *, sent: dict[str, Any] | None = None
    ) -> None:
        """Before an API call: the key's worst case reserved against its budget (raises
        ``BudgetExhausted`` 429 or ``BudgetUnavailable`` 503 when it cannot be, the reason
        noted on ``ex``), computed from the exact body the call will post (the endpoint's
        ``api_call``), never from the local attempt's figures. ``sent``: what the API is sent,
        when it is not ``body`` (the upstream's own ``/v1/responses``); its worst case is the
        one reserved."""
        path, posted = self.api_call(self.services, body, ex, sent)
        api_model = self.services.upstream.target(body["model"])
        prices = self.services.prices
        ex.reserving(  # charged when its cost is never known
            posted, path, prices.max_output_tokens(api_model), prices.max_input_tokens(api_model)
        )
        quotas = self.services.quotas
        key = self.services.auth.stored_key(ex.key_name)
        if quotas is None or key is None or key.monthly_budget_pusd is None:
            return  # no budget to hold this call to
        try:
            ex.reserved(await quotas.reserve(key, posted, api_model, path))
        except BudgetExhausted:
            ex.refused(Reason.BUDGET_EXHAUSTED)
            raise
        except BudgetUnavailable:
            ex.refused(Reason.BUDGET_UNAVAILABLE)
            raise

    async def reserve_or_local(
        self,
        body: dict[str, Any],
        planned: Planned,
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
        plan = planned.plan
        if plan.route != "local":
            assert plan.reason is not None  # a plan for the API says why
            ex.fell_back(plan.reason)
        try:
            await self.reserve(body, ex, sent=sent)
        except BudgetExhausted:
            if plan.route == "api" and plan.reason == Reason.PREDICTED_SLOW:
                kept = await self.try_local(body, planned, ex, kind=kind)
                if kept is not None:
                    ex.served_locally(Reason.BUDGET_EXHAUSTED)
                    return kept
            ex.refused(Reason.BUDGET_EXHAUSTED)
            raise
        return None

    # -- the API ----------------------------------------------------------------------------

    async def from_api(self, call: Awaitable[UpstreamResponse], ex: Exchange) -> UpstreamResponse:
        """Await one upstream JSON call: the route, its time, its attempts and usage noted.
        A failure is already a :class:`ProxyError`, carrying the attempts it made."""
        ex.calling_api()
        started = time.perf_counter()
        task = asyncio.ensure_future(call)
        try:
            reply = await asyncio.shield(task)
        except ProxyError as exc:
            ex.api_attempts(exc.attempts)
            raise
        except asyncio.CancelledError:
            # The client left while the API worked on its request: the API bills it anyway.
            await charges.await_abandoned(task, ex, self.services)
            raise
        finally:
            ex.api_timed(started)
        ex.api_attempts(reply.attempts)
        ex.take_usage(reply.body.get("usage"))
        ex.take_billing(reply.body)
        ex.api_heard(reply.body)
        return reply

    async def open_stream(
        self, opening: Awaitable[UpstreamStream], ex: Exchange, body: dict[str, Any]
    ) -> tuple[UpstreamStream, Cleanup]:
        """One upstream stream (``opening``: the call that opens it), and its ``close``: closed
        once, however it ends, its usage (or an estimate against ``body``) and time noted."""
        ex.calling_api()
        started = time.perf_counter()
        opened = asyncio.ensure_future(opening)
        # A client that leaves before upstream's headers: the API may be generating already.
        stream = await charges.open_stream(opened, ex, self.services, body, started)
        return stream, charges.stream_closer(stream, ex, self.services, body, started)

    # -- stream_mode = "live" ---------------------------------------------------------------

    def live_mode(self, body: dict[str, Any]) -> bool:
        """Whether a local stream of ``body`` (a chat request) sends its tokens as they come."""
        return self.services.settings.router.stream_mode == "live" and live_streamable(body)

    async def live(
        self,
        body: dict[str, Any],
        planned: Planned,
        ex: Exchange,
        *,
        replay: Callable[[dict[str, Any]], Awaitable[Outcome]],
        chunks: LiveChunks,
    ) -> Outcome | None:
        """Stream local tokens as they come (``chunks`` makes the stream of them); only a
        failure before the first one falls back (None). ``replay`` sends a kept answer that
        came without a token."""
        queue: asyncio.Queue[str] = asyncio.Queue()
        task = asyncio.create_task(
            self.router.try_local(
                body, threshold=planned.threshold, on_token=queue.put_nowait, plan=planned.plan
            )
        )
        first = asyncio.ensure_future(queue.get())
        try:
            await asyncio.wait({task, first}, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            # The client left before the first token: stop the generation made for it.
            first.cancel()
            await cancel(task)
            raise
        if not first.done():
            first.cancel()
            attempt = task.result()
            ex.take_local(attempt)
            if attempt.completion is None or not (
                attempt.completion["choices"][0]["message"].get("content")
            ):
                # Nothing was said yet: the cascade may still fall back.
                kept = self.judge(attempt, planned.plan, ex)
                return None if kept is None else await replay(public_answer(kept, body))
            queue.put_nowait(attempt.completion["choices"][0]["message"]["content"])
        else:
            queue.put_nowait(first.result())
        ex.served_live(forced=planned.plan.forced)

        async def stop() -> None:
            await cancel(task)

        return self.stream(chunks(task, queue), ex, cleanups=(stop,))

    # -- the stream of events -----------------------------------------------------------------

    def stream(
        self,
        chunks: AsyncGenerator[bytes, None],
        ex: Exchange,
        *,
        cleanups: Iterable[Cleanup] = (),
    ) -> Events:
        """The events of ``chunks``; they write the row when they end, however they end."""

        async def body() -> AsyncGenerator[bytes, None]:
            try:
                async for chunk in chunks:
                    yield chunk
            except Exception as exc:  # noqa: BLE001 - the status line is already out
                ex.broke("stream_failed")  # logged once, and sent as the stream's last event
                for end in self.stream_end(events.unexpected(exc, ex.request_id, started=True)):
                    yield end
            finally:
                await chunks.aclose()

        def on_end(finished: bool) -> None:
            if not finished:  # the client left before the end (or before the first byte)
                ex.client_left()
            record.finish(ex, self.services)

        return Events(
            body(), headers={**SSE_HEADERS, **ex.headers()}, on_end=on_end, cleanups=tuple(cleanups)
        )
