"""``POST /v1/responses/input_tokens``: how many input tokens a Responses request would take.

The body is a Responses request's input side (:data:`FIELDS`): ``model``, ``input``,
``instructions``, ``tools`` and the fields that shape them. It is checked as
``/v1/responses`` checks them (:func:`proxy.protocol.validate.responses_request`, off the event loop
when large: :mod:`proxy.serving.body_check`), its ``item_reference`` items and its
``previous_response_id`` put in place as there (:mod:`proxy.serving.responses_state`: the key's
own stored items only), and translated to the chat request it becomes
(:func:`proxy.protocol.responses_translate.chat_of`). That request's messages and tools are counted
as the ledger counts a local answer's prompt: with the requested model's tokenizer, on the
ledger's token-counter thread (:class:`proxy.ledger.writing.tokens.TokenCounter`), so the
count never runs on the event loop. What the chat request cannot carry (image, file and audio
parts, built-in tools) is not counted. The answer is OpenAI's
``{"object": "response.input_tokens", "input_tokens": N}``.

Bounds: the body's own (``[server] max_body_bytes``, the checks' limits) and
:data:`COUNT_WAIT_S`: a count not done by then (the counter's thread busy, or its tokenizer
not loaded) is a 503 ``count_unavailable``, and the count is dropped. A key's models are
checked as for a model request (:mod:`proxy.serving.quotas`); its share and rpm count it (the
middleware, as for every POST that serves a model). Nothing is spent, so there is no ledger
row, as for ``GET /v1/responses/{id}``.
"""

from __future__ import annotations

import asyncio
from typing import Any

from proxy.errors import CountUnavailable
from proxy.ledger.writing.tokens import CountJob
from proxy.protocol.responses_translate import chat_of, stand_in
from proxy.protocol.shapes import Schema
from proxy.server.openapi.parts import responses_subset
from proxy.serving.call import Answer, Call, Outcome
from proxy.serving.responses_state import (
    ResponsesState,
    fields_checked,
    input_items,
    references,
)
from proxy.serving.services import Services
from proxy.upstream.responses_api import API_ONLY

COUNT_WAIT_S = 10.0
"""Longest wait for the token counter's count; past it, a 503."""

FIELDS = (
    "model",
    "input",
    "instructions",
    "tools",
    "tool_choice",
    "previous_response_id",
    "parallel_tool_calls",
    "text",
    "reasoning",
    "truncation",
)
"""OpenAI's parameters of the count that this endpoint takes (``conversation`` is not)."""

INPUT_TOKENS_REQUEST: Schema = responses_subset(
    "A Responses request's input side, counted with the model's tokenizer.",
    FIELDS,
)

INPUT_TOKENS: Schema = {
    "type": "object",
    "required": ["object", "input_tokens"],
    "properties": {
        "object": {"const": "response.input_tokens"},
        "input_tokens": {"type": "integer", "minimum": 0},
    },
}


def _checked(body: dict[str, Any]) -> dict[str, Any]:
    return fields_checked(body, FIELDS)


class InputTokensHandler:
    """The endpoint's handler, made once from the app's services."""

    def __init__(self, services: Services) -> None:
        self.services = services

    def _state(self) -> ResponsesState:
        state = self.services.responses
        if state is None:
            raise RuntimeError("the app was built without stored responses")
        return state

    async def __call__(self, call: Call) -> Outcome:
        body = await call.read(_checked)
        state = self._state()
        if references(body):
            body = await asyncio.to_thread(_checked, await state.resolved(call.caller, body))
        await self._admit(call, body["model"])
        previous = body.get("previous_response_id")
        earlier = await state.history(call.caller, previous) if previous is not None else []
        given = [*earlier, *input_items(body["input"])] if earlier else body["input"]
        chat = chat_of(stand_in({**body, "input": given}, API_ONLY)[0])
        job = CountJob(model=body["model"], body=chat, completion={})
        future = self.services.ledger.counter.submit(job)
        try:
            prompt, _ = await asyncio.wait_for(asyncio.wrap_future(future), COUNT_WAIT_S)
        except TimeoutError:
            future.cancel()
            raise CountUnavailable(
                f"The input tokens could not be counted within {COUNT_WAIT_S:g} s; try again."
            ) from None
        except Exception as exc:  # the tokenizer's own failure, without the prompt in it
            raise CountUnavailable(
                f"The input tokens could not be counted ({exc.__class__.__name__})."
            ) from None
        return Answer({"object": "response.input_tokens", "input_tokens": prompt})

    async def _admit(self, call: Call, model: str) -> None:
        """A stored key may count only for its own models, as it may ask only them."""
        quotas = self.services.quotas
        if quotas is None:
            return
        key = self.services.auth.stored_key(call.key_name)
        if key is not None:
            await quotas.admit(key, model)
