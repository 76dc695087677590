"""``POST /v1/responses``: OpenAI's Responses API, local first, the API's own as the fallback.

The request is checked (:func:`proxy.protocol.validate.responses_request`) and translated to a chat
request (:func:`proxy.protocol.responses_translate.chat_of`), which the cascade plans and, on the
local route, answers as chat answers it: the gate, the ``x-frugal-*`` headers. A local answer is
sent as a ``response`` object, or, with ``stream: true``, replayed as the Responses' typed
events (built from the finished answer, judged before its first byte as a ``verify`` chat
stream is); with ``[router] stream_mode = "live"`` a text answer's tokens are sent as they come,
ungated, as a ``live`` chat stream's are (:mod:`proxy.server.responses_live`).

The budget reserves the worst case of the exact body the API is sent (:meth:`Handler.reserve`,
:meth:`ResponsesHandler.api_call`): the upstream's own body, the whole conversation in it, with
a stated bound for images, files and built-in tools
(:func:`proxy.serving.quotas.unmeasured_tokens`); with ``"translate"``, the chat request.
The response cache is chat's, with chat's rules, but keyed on what was asked: the
whole conversation (``previous_response_id`` expanded, item ids left out) and every field
(:func:`_cache_body`); it keeps the ``response`` object sent, local or the API's, and a hit is
sent as a new response, with ids of its own (:func:`_renewed`), stored for the key that asked.

The fallback, ``[fallback] responses``:

- ``"responses"`` (the default): the upstream's own ``/v1/responses``
  (:mod:`proxy.upstream.responses_api`), sent ``store: false``, the whole conversation as input
  items and none of our ids. Its answer goes back with our response id: as JSON, or as its own
  typed events relayed as they come (renumbered, ``sequence_number`` from 0), into the store
  and the ledger (usage priced as chat's). What only that API can do (built-in tools,
  ``reasoning``, ``max_tool_calls``, ``top_logprobs``, image, file and audio parts) goes there
  at once with reason ``unsupported``.
- ``"translate"``: the upstream's Chat Completions, as the local route is asked; what cannot
  be mapped is a 400 that says so. A model routed through litellm always translates.

State (:mod:`proxy.serving.responses_state`): with ``previous_response_id`` the stored conversation
it ended (every earlier turn's input and output items, whichever route answered each) comes
before this turn's input, so the request, local or sent upstream, carries the whole
conversation and never one of our ids. With ``store`` (the default) the finished response and
its input items are kept, before the answer (or a stream's last event) is sent, so that the next
turn can name it; a key at its quota of stored responses gets a 400 before anything is spent.

The ledger row's ``endpoint`` is ``responses``.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from proxy.errors import BadRequest, ProxyError
from proxy.protocol.responses_answer import (
    API_USED,
    Used,
    completed,
    completed_item,
    completed_part,
    events,
    local_used,
    response_of,
    timed_out,
)
from proxy.protocol.responses_shapes import asks
from proxy.protocol.responses_translate import (
    chat_of,
    check_as_chat,
    completion_of,
    effort_only,
    stand_in,
)
from proxy.protocol.validate import responses_request
from proxy.routing.reasons import Reason
from proxy.routing.router import Plan
from proxy.routing.servable import live_streamable
from proxy.server.answers import public_answer
from proxy.server.chat import ChatHandler
from proxy.server.handler import aiter_of
from proxy.server.responses_live import live_events
from proxy.serving import charges
from proxy.serving.exchange import Exchange
from proxy.serving.responses_state import (
    ResponsesState,
    check_references,
    input_items,
    references,
)
from proxy.upstream import responses_api
from proxy.upstream.responses_api import API_ONLY, chat_usage
from proxy.upstream.stream import UpstreamStream

_LAST = frozenset({"response.completed", "response.incomplete", "response.failed"})
Keep = Callable[[dict[str, Any]], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class _Turn:
    """What every step of one Responses request carries: the request as asked, the chat request
    it became, the exchange, and ``keep`` (stores and caches the finished response)."""

    asked: dict[str, Any]
    body: dict[str, Any]
    ex: Exchange
    keep: Keep


class ResponsesHandler(ChatHandler):
    endpoint = "responses"
    prompt_param = "input"
    prompt_noun = "the input"

    def api_call(
        self, body: dict[str, Any], ex: Exchange, sent: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        """The upstream's own ``/v1/responses`` posts ``sent`` with its ``stream`` flag
        (:func:`responses_api.create`, :func:`responses_api.open_stream`); without ``sent``,
        the translated request goes to Chat Completions, as chat's does."""
        if sent is None:
            return super().api_call(body, ex)
        path = responses_api.PATH
        return path, self.services.upstream.sent(path, sent, stream=ex.stream)

    def failed_stream_end(self, err: ProxyError) -> tuple[bytes, ...]:
        """A Responses stream's own ``error`` event; it never sends chat's ``[DONE]``."""
        return (_event({"type": "error", "code": err.code, "message": str(err), "param": None}),)

    def _api_own(self, model: Any) -> bool:
        """Whether the fallback of a request for ``model`` is the upstream's /v1/responses."""
        if self.services.settings.fallback.responses != "responses" or not isinstance(model, str):
            return False
        return not self.services.upstream.via_litellm(model)

    def _checked(self, body: dict[str, Any]) -> dict[str, Any]:
        """The checks of :func:`responses_request`, then the chat check of what the cascade
        is asked (:func:`check_as_chat`: the schemas), both where the body is read, off the
        event loop when it is large; with the API's own as the fallback, what only it can do
        is let through (its own checks are the API's). A body with ``item_reference`` items
        has only those checked here: the rest is checked once they are put in place
        (:meth:`_resolved`)."""
        at = references(body)
        if at:
            check_references(body, at)
            return body
        if isinstance(body, dict) and self._api_own(body.get("model")):
            stand, taken = stand_in(body, API_ONLY)
            if taken:
                responses_request(stand)
                check_as_chat(stand)
                return body
            # an API-only parameter that asks for nothing (Codex's ``reasoning: {}``) is no
            # reason to refuse, nor to skip the local model; the API is still sent it
            checked = {k: v for k, v in body.items() if k not in API_ONLY or asks(v)}
            responses_request(checked)
            check_as_chat(stand_in(checked, API_ONLY)[0])
            return body
        responses_request(body)
        check_as_chat(stand_in(body, API_ONLY)[0])
        return body

    async def handle(self, request: Request, ex: Exchange) -> Response:
        asked = await self.services.bodies.read(request, self._checked)
        state = self._state()
        if references(asked):
            asked = await self._resolved(request, asked, state)
        previous = asked.get("previous_response_id")
        items = input_items(asked["input"])
        earlier = await state.history(request, previous) if previous is not None else []
        if asked.get("store") is not False:  # its key's quota, before anything is spent
            await state.admit(request, items)
        conversation = [*earlier, *items]
        api_own = self._api_own(asked["model"])
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
        if self.services.settings.server.log_content:
            ex.content_out = []
            ex.content_in = body["messages"]
        ex.body = body
        plan, threshold = self.begin(request, body, ex)
        ex.stream = bool(asked.get("stream"))  # the chat request itself is asked for JSON
        # The key's models; the cache entry, keyed on what was asked: the whole conversation.
        await self.admit(request, _cache_body(asked, conversation), ex)
        hit = await self.cached(ex)
        cache_key = ex.cache_key  # None after a hit, or when this request is not cached
        ex.cache_key, ex.cache_read = None, False  # chat's steps below cache nothing of their own

        async def keep(response: dict[str, Any]) -> None:
            response["previous_response_id"] = previous
            usage = response.get("usage")
            if ex.route == "local" and isinstance(usage, dict):
                # The prefix the engine reused (chat's public usage leaves its details out).
                usage["input_tokens_details"] = {
                    "cached_tokens": ex.cached_tokens,
                    "cache_write_tokens": 0,  # the engine's prefix cache is not billed
                }
            if (
                cache_key is not None
                and self.services.quotas is not None
                and _cacheable(response, ex)
            ):
                self.services.quotas.remember(cache_key, {**response, "store": False})
            if asked.get("store") is not False:
                response["store"] = await state.keep(request, response, items, ex.route)

        turn = _Turn(asked, body, ex, keep)
        if hit is not None:
            ex.keep(completion_of(hit))
            return await self._send_kept(_renewed(hit, asked), turn)
        sent = None
        if api_own:
            target = self.services.upstream.target(asked["model"])
            sent = responses_api.upstream_body(asked, conversation, target)
        # Earlier built-in calls are said already; a compaction only the API can read.
        only_api = [t for t in taken if "item" not in t or "'compaction'" in t]
        if sent is not None and only_api:
            if plan.local_only or not self.router.fallback_enabled:
                raise BadRequest(
                    "the local model cannot serve this request (" + ", ".join(only_api) + ")",
                    param="model",
                    code="unsupported_locally",
                )
            ex.route, ex.reason = "api", Reason.UNSUPPORTED
            await self.reserve(body, ex, sent=sent)
            return await self._api(turn, sent)
        tried = False  # a live stream that fell back: the local model has answered already
        if ex.stream and plan.route == "local" and self._live_mode(body):
            live = await self._live_stream(turn, plan, threshold)
            if live is not None:
                return live
            tried = True
        if sent is None:
            return await self._translated(turn, plan, threshold, tried)
        answer = await self._local(body, plan, threshold, ex, sent, tried)
        if answer is None:
            return await self._api(turn, sent)
        return await self._send_kept(self._answered(answer, asked, ex), turn)

    async def _resolved(
        self, request: Request, asked: dict[str, Any], state: ResponsesState
    ) -> dict[str, Any]:
        """``asked`` with its item references put in place, then checked as any body is (off
        the event loop: the items put in place may make it large)."""
        resolved = await state.resolved(request, asked)
        return await asyncio.to_thread(self._checked, resolved)

    def _answered(
        self, answer: dict[str, Any], asked: dict[str, Any], ex: Exchange
    ) -> dict[str, Any]:
        """The chat ``answer`` as a ``response``; a local one the deadline cut as ``failed``."""
        response = response_of(answer, asked, self._used(ex))
        frugal = (ex.local_completion or {}).get("frugal") or {}
        if ex.route == "local" and frugal.get("stop_cause") == "deadline":
            ex.error = Reason.LOCAL_TIMEOUT.value
            return timed_out(response)
        return response

    def _used(self, ex: Exchange) -> Used:
        """The sampling values the route that answered used where the request named none."""
        if ex.route == "local":
            return local_used(self.services.settings.local.default_max_tokens)
        return API_USED

    async def _send_kept(self, response: dict[str, Any], turn: _Turn) -> Response:
        """Keep ``response`` (stored, cached), then send it: as JSON, or replayed as events."""
        await turn.keep(response)
        ex = turn.ex
        if ex.stream:
            return self.stream(aiter_of(events(response)), ex)
        return JSONResponse(response, headers=ex.headers())

    async def _translated(self, turn: _Turn, plan: Plan, threshold: float, tried: bool) -> Response:
        """The whole chat cascade, the API's Chat Completions as its fallback."""
        answers: list[dict[str, Any]] = []

        def take(answer: dict[str, Any], _ex: Exchange, _raw: bytes | None) -> Response:
            answers.append(answer)
            return Response()  # not sent: the answer is stored first, then sent below

        await self._json(turn.body, plan, threshold, turn.ex, take, local_tried=tried)
        return await self._send_kept(self._answered(answers[0], turn.asked, turn.ex), turn)

    async def _local(
        self,
        body: dict[str, Any],
        plan: Plan,
        threshold: float,
        ex: Exchange,
        sent: dict[str, Any],
        tried: bool,
    ) -> dict[str, Any] | None:
        """The cascade up to its API call: a local answer, or None (the worst case of ``sent``,
        the upstream's body, reserved) to ask the API; ``tried``: the local model has answered
        already (a ``live`` stream that fell back)."""
        if plan.route == "local" and not tried:
            kept = await self.try_local(body, plan, threshold, ex, kind="chat")
            if kept is not None:
                answer = public_answer(kept, body)
                ex.keep(answer)
                return answer
        kept = await self.reserve_or_local(body, plan, threshold, ex, kind="chat", sent=sent)
        return None if kept is None else public_answer(kept, body)

    # -- stream_mode = "live" --------------------------------------------------------------------

    def _live_mode(self, body: dict[str, Any]) -> bool:
        """Whether a local stream of ``body`` (the chat request) sends its tokens as they come."""
        return self.services.settings.router.stream_mode == "live" and live_streamable(body)

    async def _live_stream(self, turn: _Turn, plan: Plan, threshold: float) -> Response | None:
        """Chat's live stream, sent as typed events (:mod:`proxy.server.responses_live`); None
        when the local model failed before its first token and the cascade falls back."""

        asked, body, ex = turn.asked, turn.body, turn.ex

        async def replay(kept: dict[str, Any]) -> Response:  # kept, but it came without a token
            answer = public_answer(kept, body)
            ex.keep(answer)
            return await self._send_kept(self._answered(answer, asked, ex), turn)

        used = local_used(self.services.settings.local.default_max_tokens)
        return await self._live(
            body,
            plan,
            threshold,
            ex,
            False,
            replay=replay,
            chunks=lambda task, queue: live_events(task, queue, ex, asked, turn.keep, used),
        )

    # -- the API's own /v1/responses ------------------------------------------------------------

    async def _api(self, turn: _Turn, sent: dict[str, Any]) -> Response:
        upstream, ex = self.services.upstream, turn.ex
        if ex.stream:
            return await self._relay(turn, sent)
        reply = await self.from_api(
            responses_api.create(upstream, sent, request_id=ex.request_id), ex
        )
        ex.take_usage(chat_usage(reply.body.get("usage")))
        ex.take_billing(reply.body)
        if ex.audit is not None:
            ex.audit_reference = completion_of(reply.body)
        response = _ours(reply.body, turn.asked)
        ex.keep(completion_of(response))
        await turn.keep(response)
        return JSONResponse(response, headers=ex.headers())

    async def _relay(self, turn: _Turn, sent: dict[str, Any]) -> Response:
        """The API's typed events, relayed as they come (see :func:`_relayed`)."""
        ex, body = turn.ex, turn.body
        ex.route = "api"
        started = time.perf_counter()
        opening = asyncio.ensure_future(
            responses_api.open_stream(self.services.upstream, sent, request_id=ex.request_id)
        )
        upstream_stream = await charges.open_stream(opening, ex, self.services, body, started)
        close = charges.stream_closer(upstream_stream, ex, self.services, body, started)

        relayed = _relayed(upstream_stream, ex, close, turn.keep, turn.asked)
        return self.stream(relayed, ex, cleanups=(close,))

    def _state(self) -> ResponsesState:
        state = self.services.responses
        if state is None:
            raise RuntimeError("the app was built without stored responses")
        return state


def _cache_body(asked: dict[str, Any], conversation: list[dict[str, Any]]) -> dict[str, Any]:
    """What the cache keys a request on: every field asked (the cache leaves out those that
    do not change the answer, :data:`proxy.ledger.response_cache.IGNORED`), with the whole
    conversation in place of ``input`` and ``previous_response_id`` (the earlier turns
    themselves, not the id that named them), its items without their ids."""
    fields = {k: v for k, v in asked.items() if k != "previous_response_id"}
    fields["input"] = [{k: v for k, v in item.items() if k != "id"} for item in conversation]
    return fields


def _cacheable(response: dict[str, Any], ex: Exchange) -> bool:
    """Whether a finished answer goes into the cache, as chat's would: not a failed one, nor
    a local answer sent only because the budget was spent."""
    return response.get("status") != "failed" and ex.reason is not Reason.BUDGET_EXHAUSTED


def _renewed(cached: dict[str, Any], asked: dict[str, Any]) -> dict[str, Any]:
    """A cached ``response`` as a new one to ``asked``: its own response id and output item
    ids (never those of the answer it was cached from, which may be another key's), made now,
    with this request's ``metadata`` and ``user``."""
    output = []
    for item in cached.get("output") or []:
        if isinstance(item, dict) and isinstance(item.get("id"), str):
            prefix = item["id"].split("_", 1)[0] if "_" in item["id"] else "item"
            item = {**item, "id": f"{prefix}_{uuid.uuid4().hex}"}
        output.append(item)
    fresh = {**cached, "output": output, "created_at": int(time.time())}
    return {**_ours(fresh, asked), "user": asked.get("user")}


def _ours(
    response: dict[str, Any], asked: dict[str, Any], our_id: str | None = None
) -> dict[str, Any]:
    """The API's ``response`` as ours: our id, the request's metadata, not yet stored, and
    what the published schema requires and it left out filled in (:func:`completed`)."""
    return {
        **completed(response, asked),
        "id": our_id or f"resp_{uuid.uuid4().hex}",
        "metadata": asked.get("metadata") or {},
        "previous_response_id": asked.get("previous_response_id"),
        "store": False,  # True once stored
    }


def _mended(payload: dict[str, Any], names: dict[str, str]) -> None:
    """A relayed event with what the published schema requires and the upstream left out
    filled in: an item's and a part's fields (:func:`completed_item`), a text event's
    ``logprobs``, the function's ``name`` on ``response.function_call_arguments.done`` (from
    its ``output_item.added``, kept in ``names`` by item id)."""
    kind = payload.get("type")
    item = payload.get("item")
    if isinstance(item, dict):
        status = "in_progress" if kind == "response.output_item.added" else "completed"
        payload["item"] = item = completed_item(item, status)
        if item.get("type") == "function_call" and isinstance(item.get("id"), str):
            names[item["id"]] = str(item.get("name") or "")
    if "part" in payload:
        payload["part"] = completed_part(payload["part"])
    if kind in ("response.output_text.delta", "response.output_text.done"):
        payload.setdefault("logprobs", [])
    if kind == "response.function_call_arguments.done" and "name" not in payload:
        payload["name"] = names.get(str(payload.get("item_id")), "")


def _event(payload: dict[str, Any]) -> bytes:
    data = json.dumps(payload, separators=(",", ":"))
    return f"event: {payload.get('type')}\ndata: {data}\n\n".encode()


async def _relayed(
    stream: UpstreamStream,
    ex: Exchange,
    close: Callable[[], Awaitable[None]],
    keep: Keep,
    asked: dict[str, Any],
) -> AsyncGenerator[bytes, None]:
    """The upstream's events as they come, each with our response id and its place in our
    numbering, and what the published schema requires filled in (:func:`_mended`,
    :func:`_ours`); the finished response stored before its last event is sent. A stream that
    breaks off ends with an ``error`` event."""
    our_id = f"resp_{uuid.uuid4().hex}"
    sequence = 0
    names: dict[str, str] = {}  # a function call's name by its item id

    def numbered(payload: dict[str, Any]) -> bytes:
        nonlocal sequence
        payload["sequence_number"] = sequence
        sequence += 1
        return _event(payload)

    try:
        async for chunk in stream:
            out: list[bytes] = []
            for raw in chunk.split(b"\n\n"):
                data = b"".join(
                    line[5:].strip() for line in raw.split(b"\n") if line.startswith(b"data:")
                )
                if not data.startswith(b"{"):
                    continue  # a comment, or a [DONE] some servers add
                try:
                    payload = json.loads(data)
                except ValueError:
                    out.append(raw + b"\n\n")  # not ours to mend: relayed as it came
                    continue
                if not isinstance(payload, dict):
                    continue
                _mended(payload, names)
                response = payload.get("response")
                if isinstance(response, dict):
                    payload["response"] = response = _ours(response, asked, our_id)
                    if payload.get("type") == "response.failed":  # the API's own failure
                        ex.error = str((response.get("error") or {}).get("code") or "failed")
                    if payload.get("type") in _LAST:
                        usage = chat_usage(response.get("usage"))
                        stream.usage = usage
                        ex.take_usage(usage)
                        ex.take_billing(response)
                        ex.keep(completion_of(response))
                        if ex.audit is not None:  # a rejected local answer's reference
                            ex.audit_reference = completion_of(response)
                        await keep(response)
                out.append(numbered(payload))
            if out:
                yield b"".join(out)
    except ProxyError as err:  # translated by the stream itself (proxy.upstream.failures)
        ex.error = err.code or "stream_cut"
        yield numbered({"type": "error", "code": err.code, "message": str(err), "param": None})
    finally:
        await close()
