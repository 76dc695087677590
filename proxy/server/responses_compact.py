"""``POST /v1/responses/compact``: a conversation compacted by the upstream's own Responses API.

OpenAI's compaction returns the conversation's user messages and one ``compaction`` item whose
``encrypted_content`` only OpenAI can read back. The local model cannot make that item, nor
read one, so the request always goes to the API (route ``api``, reason ``unsupported``):

- with ``[fallback] responses = "responses"`` (the default) and a model on the direct route,
  the upstream's own ``/v1/responses/compact`` is sent the whole conversation (``input`` after
  the stored turns ``previous_response_id`` names, item references put in place, none of the
  proxy's ids: :func:`proxy.upstream.responses_api.compact_body`), and its answer is relayed
  as it came. A key's budget reserves the call's worst case first (:meth:`Cascade.reserve`),
  and the ledger row prices its ``usage`` as an API call's.
- with ``"translate"``, or a model routed through litellm, there is no such endpoint to ask: a
  400 ``unsupported_parameter`` naming ``model``, before anything is spent.

The body takes :data:`FIELDS`; any other field is a 400 naming it. The ledger row's
``endpoint`` is ``responses_compact``.
"""

from __future__ import annotations

import asyncio
from typing import Any

from proxy.errors import BadRequest
from proxy.protocol.shapes import Schema
from proxy.server.openapi.parts import responses_subset
from proxy.serving.call import Answer, Call, Outcome
from proxy.serving.cascade import Cascade
from proxy.serving.exchange import Exchange
from proxy.serving.responses_state import (
    ResponsesState,
    fields_checked,
    input_items,
    references,
)
from proxy.serving.services import Services
from proxy.upstream import responses_api
from proxy.upstream.client import COMPACT_PATH

FIELDS = ("model", "input", "instructions", "previous_response_id", "prompt_cache_key")
"""OpenAI's parameters of a compaction that this endpoint takes."""

COMPACT_REQUEST: Schema = responses_subset(
    "A conversation to compact, sent to the upstream's own Responses API.",
    FIELDS,
)

COMPACTED: Schema = {
    "type": "object",
    "description": "The upstream's answer, as it came.",
    "required": ["id", "object", "output", "usage"],
    "properties": {
        "id": {"type": "string"},
        "object": {"const": "response.compaction"},
        "created_at": {"type": "integer"},
        "output": {"type": "array", "items": {"type": "object"}},
        "usage": {"type": "object"},
    },
}


def _checked(body: dict[str, Any]) -> dict[str, Any]:
    return fields_checked(body, FIELDS)


def _compact_call(
    services: Services, body: dict[str, Any], ex: Exchange, sent: dict[str, Any] | None = None
) -> tuple[str, dict[str, Any]]:
    """The upstream's ``/v1/responses/compact`` posts ``sent``, as it is."""
    return COMPACT_PATH, services.upstream.sent(COMPACT_PATH, sent or body)


class CompactHandler:
    """``POST /v1/responses/compact``, on its own :class:`Cascade` (always the API)."""

    def __init__(self, services: Services) -> None:
        self.services = services
        self.cascade = Cascade(
            services,
            endpoint="responses_compact",
            prompt_param="input",
            prompt_noun="the input",
            api_call=_compact_call,
        )

    async def __call__(self, call: Call) -> Outcome:
        return await self.cascade.serve(call, self.handle)

    def _state(self) -> ResponsesState:
        state = self.services.responses
        if state is None:
            raise RuntimeError("the app was built without stored responses")
        return state

    async def handle(self, call: Call, ex: Exchange) -> Outcome:
        asked = await call.read(_checked)
        state = self._state()
        if references(asked):
            asked = await asyncio.to_thread(_checked, await state.resolved(call.caller, asked))
        model = asked["model"]
        ex.asked(model)
        upstream = self.services.upstream
        if self.services.settings.fallback.responses != "responses" or upstream.via_litellm(model):
            raise BadRequest(
                "Compaction needs the upstream's own Responses API: this proxy's fallback for "
                f"'{model}' is Chat Completions ([fallback] responses = \"translate\", or a "
                "model routed through litellm), which has no /v1/responses/compact.",
                param="model",
                code="unsupported_parameter",
            )
        previous = asked.get("previous_response_id")
        earlier = await state.history(call.caller, previous) if previous is not None else []
        conversation = [*earlier, *input_items(asked["input"])]
        sent = responses_api.compact_body(asked, conversation, upstream.target(model))
        await self.cascade.admit(call, {"model": model}, ex, cache=False)  # never cached
        ex.unsupported_locally()
        await self.cascade.reserve({"model": model}, ex, sent=sent)
        reply = await self.cascade.from_api(
            responses_api.compact(upstream, sent, request_id=ex.request_id), ex
        )
        return Answer(reply.body, ex.headers())
