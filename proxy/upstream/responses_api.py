"""The upstream's own ``POST /v1/responses``: the fallback of ``/v1/responses`` by default.

    upstream_body(asked, conversation, model)
                    the body sent: the request's OpenAI fields (allow-listed), ``input`` the
                    WHOLE conversation (earlier turns from the proxy's store, then this turn's
                    items), ``store: false``, and none of the proxy's ids: no
                    ``previous_response_id``, no item ``id``
    create(upstream, body, request_id)
                    one JSON call (an :class:`UpstreamResponse` whose body is a ``response``)
    open_stream(upstream, body, request_id)
                    a streamed call (an :class:`UpstreamStream` of typed events)
    compact_body(asked, conversation, model), compact(upstream, body, request_id)
                    ``POST /v1/responses/compact``: the whole conversation, its items without
                    ids, sent for the upstream to compact (a ``response.compaction`` object)
    chat_usage(usage)
                    the Responses' usage as chat's (the arithmetic is wire shapes:
                    :mod:`proxy.protocol.responses_usage`)

Only the direct route (``api_base``) has this endpoint: a model routed through litellm is
translated to Chat Completions instead (:mod:`proxy.serving.responses`). Retries, timeouts and the
translation of failures are the client's (:meth:`Upstream.post_direct`,
:meth:`Upstream.open_direct`), and so is the exact body posted (:meth:`Upstream.sent`: ``body``
with its ``stream`` flag), which a key's budget reserves the worst case of.
"""

from __future__ import annotations

from typing import Any

from proxy.protocol.responses_params import RESPONSES_PARAMETERS
from proxy.protocol.responses_usage import chat_usage
from proxy.upstream.client import COMPACT_PATH, RESPONSES_PATH, Upstream, UpstreamResponse
from proxy.upstream.stream import UpstreamStream

__all__ = [
    "API_ONLY",
    "PARTLY_LOCAL",
    "chat_usage",
    "compact",
    "compact_body",
    "create",
    "open_stream",
    "upstream_body",
]

PATH = RESPONSES_PATH
API_ONLY = ("reasoning", "max_tool_calls", "top_logprobs")
"""Parameters that only the API's own ``/v1/responses`` can honour: forwarded there (reason
``unsupported``), a 400 when the fallback is Chat Completions."""
PARTLY_LOCAL = frozenset({"reasoning"})
"""Of :data:`API_ONLY`, those a local answer may still serve in part: a ``reasoning`` that holds
only an ``effort`` is chat's ``reasoning_effort`` (``proxy/serving/responses.py``)."""
# The proxy's own: the conversation is sent whole and never stored upstream.
_OURS = frozenset({"previous_response_id", "store", "input", "model"})
_FORWARDED = tuple(name for name in (*RESPONSES_PARAMETERS, *API_ONLY) if name not in _OURS)


def _sendable(item: dict[str, Any]) -> dict[str, Any] | None:
    """An input item as the upstream gets it: without its id (ours, or one the upstream did
    not store); a reasoning item only with its encrypted content (the only form a store-less
    upstream can read back)."""
    if item.get("type") == "reasoning" and not item.get("encrypted_content"):
        return None
    return {k: v for k, v in item.items() if k != "id"}


def upstream_body(
    asked: dict[str, Any], conversation: list[dict[str, Any]], model: str
) -> dict[str, Any]:
    """The body of the upstream call for the checked request ``asked`` whose whole
    conversation is ``conversation`` (input items), asking for ``model``."""
    body: dict[str, Any] = {k: asked[k] for k in _FORWARDED if asked.get(k) is not None}
    body["model"] = model
    body["input"] = [sent for item in conversation if (sent := _sendable(item)) is not None]
    body["store"] = False
    if not body.get("stream"):
        body.pop("stream", None)
        body.pop("stream_options", None)
    return body


def compact_body(
    asked: dict[str, Any], conversation: list[dict[str, Any]], model: str
) -> dict[str, Any]:
    """The body of the upstream's ``/v1/responses/compact`` for the checked request ``asked``
    (``instructions``, ``prompt_cache_key``) whose whole conversation is ``conversation``."""
    body: dict[str, Any] = {
        k: asked[k] for k in ("instructions", "prompt_cache_key") if asked.get(k) is not None
    }
    body["model"] = model
    body["input"] = [sent for item in conversation if (sent := _sendable(item)) is not None]
    return body


async def compact(upstream: Upstream, body: dict[str, Any], *, request_id: str) -> UpstreamResponse:
    """The upstream's ``response.compaction`` object for ``body``."""
    sent = upstream.sent(COMPACT_PATH, body)
    return await upstream.post_direct(COMPACT_PATH, sent, request_id=request_id)


async def create(upstream: Upstream, body: dict[str, Any], *, request_id: str) -> UpstreamResponse:
    """The upstream's ``response`` object to ``body`` (not streamed)."""
    return await upstream.post_direct(PATH, upstream.sent(PATH, body), request_id=request_id)


async def open_stream(
    upstream: Upstream, body: dict[str, Any], *, request_id: str
) -> UpstreamStream:
    """The upstream's typed events for ``body``; returns once it has answered 200."""
    sent = upstream.sent(PATH, body, stream=True)
    return await upstream.open_direct(PATH, sent, request_id=request_id)
