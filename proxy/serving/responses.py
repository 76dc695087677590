"""``POST /v1/responses``' service: OpenAI's Responses API, local first, the API's own as the
fallback; a :class:`~proxy.serving.call.Call` in, an answer or a stream of typed events out (the
server reads the request and writes the response, :mod:`proxy.server.calls`).

The request is checked (:mod:`proxy.serving.responses_checks`) and translated to a chat request
(:func:`proxy.protocol.responses_translate.chat_of`), which this endpoint's own cascade
(:class:`proxy.serving.cascade.Cascade`, the steps chat takes too) plans and, on the local route,
answers as chat answers it: the gate, the ``x-frugal-*`` headers. A local answer is
sent as a ``response`` object, or, with ``stream: true``, replayed as the Responses' typed
events (built from the finished answer, judged before its first byte as a ``verify`` chat
stream is); with ``[router] stream_mode = "live"`` a text answer's tokens are sent as they come,
ungated, as a ``live`` chat stream's are (:mod:`proxy.serving.responses_live`).

The budget reserves the worst case of the exact body the API is sent (:meth:`Cascade.reserve`,
:func:`proxy.serving.responses_upstream.responses_call`): the upstream's own body, the whole
conversation in it, with a stated bound for images, files and built-in tools
(:func:`proxy.serving.quotas.unmeasured_tokens`); with ``"translate"``, the chat request.
The response cache is chat's, with chat's rules, but keyed on what was asked: the
whole conversation (``previous_response_id`` expanded, item ids left out) and every field
(:func:`_cache_body`); it keeps the ``response`` object sent, local or the API's, and a hit is
sent as a new response, with ids of its own (:func:`proxy.serving.responses_upstream.renewed`),
stored for the key that asked.

The fallback, ``[fallback] responses``:

- ``"responses"`` (the default): the upstream's own ``/v1/responses``
  (:mod:`proxy.serving.responses_upstream`, :mod:`proxy.upstream.responses_api`), sent ``store:
  false``, the whole conversation as input items and none of our ids. Its answer goes back with
  our response id: as JSON, or as its own typed events relayed as they come (renumbered,
  ``sequence_number`` from 0), into the store and the ledger (usage priced as chat's). What only
  that API can do (built-in tools, ``reasoning``, ``max_tool_calls``, ``top_logprobs``, image,
  file and audio parts) goes there at once with reason ``unsupported``.
- ``"translate"``: the upstream's Chat Completions, as the local route is asked; what cannot
  be mapped is a 400 that says so. A model routed through litellm always translates.

State (:mod:`proxy.serving.responses_state`): with ``previous_response_id`` the stored conversation
it ended (every earlier turn's input and output items, whichever route answered each) comes
before this turn's input, so the request, local or sent upstream, carries the whole
conversation and never one of our ids. With ``store`` (the default) the finished response and
its input items are kept, before the answer (or a stream's last event) is sent, so that the next
turn can name it; a key at its quota of stored responses gets a 400 before anything is spent.

With ``background: true`` the request is answered at once with a ``queued`` response, stored,
and run afterwards by :mod:`proxy.serving.background_responses` through this same service
(:meth:`ResponsesService._respond`, with the queued response's id): as deferred work (flex's
long local deadline, the engine's deferred class), its answer put in the queued one's place.
Its events, once it has ended, are :func:`background_stream` (``GET /v1/responses/{id}`` with
``stream=true`` too, :mod:`proxy.server.stored_responses`).

The ledger row's ``endpoint`` is ``responses``.
"""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any

from proxy.errors import BadRequest
from proxy.protocol.responses_answer import (
    API_USED,
    Used,
    events,
    local_used,
    response_of,
    timed_out,
)
from proxy.protocol.responses_translate import chat_of, completion_of, effort_only, stand_in
from proxy.serving import responses_upstream
from proxy.serving.background_responses import TIER, BackgroundResponses
from proxy.serving.call import Answer, Call, Events, Outcome
from proxy.serving.cascade import Cascade, Planned
from proxy.serving.clients import Caller
from proxy.serving.events import aiter_of
from proxy.serving.exchange import Exchange
from proxy.serving.responses_checks import checked
from proxy.serving.responses_live import Keep, live_events
from proxy.serving.responses_state import ResponsesState, input_items, references
from proxy.serving.services import Services
from proxy.upstream.responses_api import API_ONLY, upstream_body


@dataclass(frozen=True, slots=True)
class _Turn:
    """What every step of one Responses request carries: the request as asked, the chat request
    it became, the exchange, and ``keep`` (stores and caches the finished response)."""

    asked: dict[str, Any]
    body: dict[str, Any]
    ex: Exchange
    keep: Keep


class ResponsesService:
    """``POST /v1/responses``, on its own :class:`Cascade`."""

    def __init__(self, services: Services) -> None:
        self.services = services
        self.cascade = Cascade(
            services,
            endpoint="responses",
            prompt_param="input",
            prompt_noun="the input",
            api_call=responses_upstream.responses_call,
            stream_end=responses_upstream.error_event,
        )

    async def __call__(self, call: Call) -> Outcome:
        return await self.cascade.serve(call, self.handle)

    def _api_own(self, model: Any) -> bool:
        """Whether the fallback of a request for ``model`` is the upstream's /v1/responses."""
        if self.services.settings.fallback.responses != "responses" or not isinstance(model, str):
            return False
        return not self.services.upstream.via_litellm(model)

    async def handle(self, call: Call, ex: Exchange) -> Outcome:
        asked = await call.read(self._check)
        if asked.get("background") is True:
            return await self._queue(call, ex, asked)
        return await self._respond(call, ex, asked)

    def _check(self, body: dict[str, Any]) -> dict[str, Any]:
        return checked(body, api_own=self._api_own)

    async def _resolved(self, caller: Caller, asked: dict[str, Any]) -> dict[str, Any]:
        if references(asked):
            # the items put in place may make it large: checked again off the event loop
            resolved = await self._state().resolved(caller, asked)
            return await asyncio.to_thread(self._check, resolved)
        return asked

    async def _queue(self, call: Call, ex: Exchange, asked: dict[str, Any]) -> Outcome:
        """``background: true``: the queued response, stored and sent at once; the request runs
        afterwards (:mod:`proxy.serving.background_responses`), and its run writes its one
        ledger row."""
        state, background = self._state(), self._background()
        asked = await self._resolved(call.caller, asked)
        items = input_items(asked["input"])
        previous = asked.get("previous_response_id")
        if previous is not None:
            await state.history(call.caller, previous)  # a 404 now, rather than a failed run
        await state.admit(call.caller, items)
        shell = {**response_of({}, asked), "previous_response_id": previous}
        rest = {k: v for k, v in asked.items() if k not in ("background", "stream")}

        async def run(rid: str) -> None:
            respond = functools.partial(self._respond, asked=rest, background=rid)
            await self.cascade.serve(call, respond)

        made = await background.submit(call.caller, shell, items, run)  # refused: this row says so
        ex.handed_on()  # no row for the queueing: the run writes the response's one row
        if asked.get("stream") is True:  # its events once it has ended, resumable by GET
            return await background_stream(self.services, call.caller, made["id"], -1)
        return Answer(made)

    async def _respond(
        self, call: Call, ex: Exchange, asked: dict[str, Any], background: str | None = None
    ) -> Outcome:
        """The request answered; ``background``: the id of the background response it runs."""
        cascade = self.cascade
        state = self._state()
        asked = await self._resolved(call.caller, asked)
        previous = asked.get("previous_response_id")
        items = input_items(asked["input"])
        earlier = await state.history(call.caller, previous) if previous is not None else []
        if asked.get("store") is not False and background is None:  # its key's quota, first
            await state.admit(call.caller, items)
        conversation = [*earlier, *items]
        # Without an earlier turn, the input as it was sent (a string stays one message).
        given = conversation if earlier else asked["input"]
        stand, taken = stand_in({**asked, "input": given}, API_ONLY)
        body = chat_of(stand)
        effort = effort_only(asked)
        if effort is not None:
            # Only an effort: chat's reasoning_effort, which the router serves locally when it
            # can (proxy.routing.servable), and otherwise sends to the API's own, as asked.
            body["reasoning_effort"] = effort
            taken = [t for t in taken if t != "'reasoning'"]
        ex.asking(body, log_content=self.services.settings.server.log_content)
        # The chat request itself is asked for JSON: the stream is the Responses request's.
        planned = cascade.begin(
            call,
            body,
            ex,
            stream=bool(asked.get("stream")),
            deferred=None if background is None else TIER,
        )
        # The key's models; the cache entry, keyed on what was asked: the whole conversation.
        await cascade.admit(call, _cache_body(asked, conversation), ex)
        hit = await cascade.cached(ex)

        async def keep(response: dict[str, Any]) -> None:
            response["previous_response_id"] = previous
            usage = response.get("usage")
            if ex.route == "local" and isinstance(usage, dict):
                # The prefix the engine reused (chat's public usage leaves its details out).
                usage["input_tokens_details"] = {
                    "cached_tokens": ex.cached_tokens,
                    "cache_write_tokens": 0,  # the engine's prefix cache is not billed
                }
            if response.get("status") != "failed":  # as chat's would be (Cascade.remember)
                cascade.remember(ex, {**response, "store": False})
            if background is not None:  # in the queued response's place
                response["store"] = await self._background().finish(background, response, ex.route)
            elif asked.get("store") is not False:
                response["store"] = await state.keep(call.caller, response, items, ex.route)

        turn = _Turn(asked, body, ex, keep)
        if hit is not None:
            ex.keep(completion_of(hit))
            return await self._send_kept(responses_upstream.renewed(hit, asked), turn)
        sent = None
        if self._api_own(asked["model"]):
            target = self.services.upstream.target(asked["model"])
            sent = upstream_body(asked, conversation, target)
        # Earlier built-in calls are said already; a compaction only the API can read.
        only_api = [t for t in taken if "item" not in t or "'compaction'" in t]
        if sent is not None and only_api:
            cascade.only_the_api(planned, ex, only_api)
            await cascade.reserve(body, ex, sent=sent)
            return await self._api(turn, sent)
        tried = False  # a live stream that fell back: the local model has answered already
        if ex.stream and planned.plan.route == "local" and cascade.live_mode(body):
            live = await self._live_stream(turn, planned)
            if live is not None:
                return live
            tried = True
        answer = await cascade.local_chat(body, planned, ex, sent=sent, local_tried=tried)
        if answer is not None:
            ex.keep(answer)
            return await self._send_kept(self._answered(answer, asked, ex), turn)
        if sent is not None:
            return await self._api(turn, sent)
        # "translate": the API's Chat Completions, as the local route was asked
        reply = await cascade.from_api(
            self.services.upstream.chat(body, request_id=ex.request_id), ex
        )
        ex.keep(reply.body)
        return await self._send_kept(self._answered(reply.body, asked, ex), turn)

    def _answered(
        self, answer: dict[str, Any], asked: dict[str, Any], ex: Exchange
    ) -> dict[str, Any]:
        """The chat ``answer`` as a ``response``; a local one the deadline cut as ``failed``."""
        response = response_of(answer, asked, self._used(ex))
        frugal = (ex.local_completion or {}).get("frugal") or {}
        if ex.route == "local" and frugal.get("stop_cause") == "deadline":
            ex.cut_by_deadline()
            return timed_out(response)
        return response

    def _used(self, ex: Exchange) -> Used:
        """The sampling values the route that answered used where the request named none."""
        if ex.route == "local":
            return local_used(self.services.settings.local.default_max_tokens)
        return API_USED

    async def _send_kept(self, response: dict[str, Any], turn: _Turn) -> Outcome:
        """Keep ``response`` (stored, cached), then send it: as JSON, or replayed as events."""
        await turn.keep(response)
        ex = turn.ex
        if ex.stream:
            return self.cascade.stream(aiter_of(events(response)), ex)
        return Answer(response, ex.headers())

    async def _live_stream(self, turn: _Turn, planned: Planned) -> Outcome | None:
        """Chat's live stream, sent as typed events (:mod:`proxy.serving.responses_live`); None
        when the local model failed before its first token and the cascade falls back."""
        asked, ex = turn.asked, turn.ex

        async def replay(answer: dict[str, Any]) -> Outcome:  # kept, but came without a token
            ex.keep(answer)
            return await self._send_kept(self._answered(answer, asked, ex), turn)

        used = local_used(self.services.settings.local.default_max_tokens)
        return await self.cascade.live(
            turn.body,
            planned,
            ex,
            replay=replay,
            chunks=lambda task, queue: live_events(task, queue, ex, asked, turn.keep, used),
        )

    async def _api(self, turn: _Turn, sent: dict[str, Any]) -> Outcome:
        """The upstream's own ``/v1/responses`` (:mod:`proxy.serving.responses_upstream`)."""
        if turn.ex.stream:
            return await responses_upstream.relay(
                self.cascade, turn.ex, turn.body, turn.asked, sent, turn.keep
            )
        return await responses_upstream.answer(self.cascade, turn.ex, turn.asked, sent, turn.keep)

    def _background(self) -> BackgroundResponses:
        background = self.services.background
        if background is None:
            raise RuntimeError("the app was built without background responses")
        return background

    def _state(self) -> ResponsesState:
        state = self.services.responses
        if state is None:
            raise RuntimeError("the app was built without stored responses")
        return state


async def background_stream(services: Services, caller: Caller, rid: str, after: int) -> Events:
    """The background response ``rid``'s typed events whose ``sequence_number`` is past
    ``after``, sent once it has ended (:meth:`BackgroundResponses.ended`); not a background
    response: a 400 naming ``stream``. No row is written for them (``on_end``)."""
    state = services.responses
    if state is None:
        raise RuntimeError("the app was built without stored responses")
    found = await state.visible(caller, rid)
    if found.response.get("background") is not True or services.background is None:
        raise BadRequest(
            f"Response '{rid}' is not a background response: only those can be streamed again.",
            param="stream",
        )
    background = services.background
    wait_s = services.settings.batch.flex_timeout_s

    async def chunks() -> AsyncGenerator[bytes, None]:
        response = await background.ended(caller, rid, wait_s=wait_s)
        for chunk in events(response):
            data = json.loads(chunk.split(b"data: ", 1)[1])
            if data["sequence_number"] > after:
                yield chunk

    def ended(finished: bool) -> None:
        """The queued request's run wrote the response's one row; its events write none."""

    return Events(chunks(), headers={}, on_end=ended)


def _cache_body(asked: dict[str, Any], conversation: list[dict[str, Any]]) -> dict[str, Any]:
    """What the cache keys a request on: every field asked (the cache leaves out those that
    do not change the answer, :data:`proxy.ledger.response_cache.IGNORED`), with the whole
    conversation in place of ``input`` and ``previous_response_id`` (the earlier turns
    themselves, not the id that named them), its items without their ids."""
    fields = {k: v for k, v in asked.items() if k != "previous_response_id"}
    fields["input"] = [{k: v for k, v in item.items() if k != "id"} for item in conversation]
    return fields
