"""``/v1/responses``' fallback to the upstream's own Responses API: its answer, or its typed
events as they come, sent back as ours.

    responses_call(services, body, ex, sent)
                    the exact call the cascade reserves for: ``sent`` posted to the upstream's
                    ``/v1/responses`` (with its ``stream`` flag), or, without it, the translated
                    chat request posted to Chat Completions
    error_event(err)
                    how a Responses stream that failed after its first byte ends: its own
                    ``error`` event, never chat's ``[DONE]``
    answer(cascade, ex, asked, sent, keep)
                    one JSON call: the answer under our id, its usage priced as chat's, stored
                    (``keep``) before it is sent
    relay(cascade, ex, body, asked, sent, keep)
                    the API's typed events relayed as they come, renumbered
                    (``sequence_number`` from 0), what the published schema requires filled in
                    (:func:`_mended`), the finished response stored before its last event
    ours(response, asked)
                    an API's (or a cached) ``response`` as ours: our id, the request's metadata
    renewed(cached, asked)
                    a cached ``response`` as a new answer, with ids of its own

Imports :mod:`proxy.upstream` (the call, the stream), :mod:`proxy.errors`, the Responses
shapes of :mod:`proxy.protocol`, and this room's call, cascade, exchange and services modules.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any

from proxy.errors import ProxyError
from proxy.protocol.responses_answer import completed, completed_item, completed_part
from proxy.protocol.responses_translate import completion_of
from proxy.protocol.responses_usage import chat_usage
from proxy.serving.call import Answer, Outcome
from proxy.serving.cascade import Cascade, chat_call
from proxy.serving.exchange import Exchange
from proxy.serving.services import Services
from proxy.upstream import responses_api
from proxy.upstream.stream import UpstreamStream

_LAST = frozenset({"response.completed", "response.incomplete", "response.failed"})
Keep = Callable[[dict[str, Any]], Awaitable[None]]


def responses_call(
    services: Services, body: dict[str, Any], ex: Exchange, sent: dict[str, Any] | None = None
) -> tuple[str, dict[str, Any]]:
    """The upstream's own ``/v1/responses`` posts ``sent`` with its ``stream`` flag
    (:func:`responses_api.create`, :func:`responses_api.open_stream`); without ``sent``,
    the translated request goes to Chat Completions, as chat's does."""
    if sent is None:
        return chat_call(services, body, ex)
    path = responses_api.PATH
    return path, services.upstream.sent(path, sent, stream=ex.stream)


def error_event(err: ProxyError) -> tuple[bytes, ...]:
    """A Responses stream's own ``error`` event; it never sends chat's ``[DONE]``."""
    return (_event({"type": "error", "code": err.code, "message": str(err), "param": None}),)


async def answer(
    cascade: Cascade, ex: Exchange, asked: dict[str, Any], sent: dict[str, Any], keep: Keep
) -> Outcome:
    """The upstream's own answer to ``sent``, as ours, stored (``keep``) and sent as JSON."""
    upstream = cascade.services.upstream
    reply = await cascade.from_api(
        responses_api.create(upstream, sent, request_id=ex.request_id), ex
    )
    ex.take_usage(chat_usage(reply.body.get("usage")))
    ex.take_billing(reply.body)
    ex.api_heard(completion_of(reply.body))  # a rejected local answer's reference
    response = ours(reply.body, asked)
    ex.keep(completion_of(response))
    await keep(response)
    return Answer(response, ex.headers())


async def relay(
    cascade: Cascade,
    ex: Exchange,
    body: dict[str, Any],
    asked: dict[str, Any],
    sent: dict[str, Any],
    keep: Keep,
) -> Outcome:
    """The API's typed events for ``sent``, relayed as they come (see :func:`_relayed`);
    ``body``, the chat request, is what an estimate of an abandoned stream counts."""
    opening = responses_api.open_stream(cascade.services.upstream, sent, request_id=ex.request_id)
    stream, close = await cascade.open_stream(opening, ex, body)
    relayed = _relayed(stream, ex, close, keep, asked)
    return cascade.stream(relayed, ex, cleanups=(close,))


def renewed(cached: dict[str, Any], asked: dict[str, Any]) -> dict[str, Any]:
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
    return {**ours(fresh, asked), "user": asked.get("user")}


def ours(
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
    :func:`ours`); the finished response stored before its last event is sent. A stream that
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
                    payload["response"] = response = ours(response, asked, our_id)
                    if payload.get("type") == "response.failed":  # the API's own failure
                        ex.broke(str((response.get("error") or {}).get("code") or "failed"))
                    if payload.get("type") in _LAST:
                        usage = chat_usage(response.get("usage"))
                        stream.usage = usage
                        ex.take_usage(usage)
                        ex.take_billing(response)
                        ex.keep(completion_of(response))
                        ex.api_heard(completion_of(response))  # a rejected answer's reference
                        await keep(response)
                out.append(numbered(payload))
            if out:
                yield b"".join(out)
    except ProxyError as err:  # translated by the stream itself (proxy.upstream.failures)
        ex.broke(err.code or "stream_cut")
        yield numbered({"type": "error", "code": err.code, "message": str(err), "param": None})
    finally:
        await close()
