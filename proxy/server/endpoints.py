"""The endpoints that answer requests, each declared once.

An :class:`Endpoint` names its path, the service the lifespan makes for it from the services
(a :class:`~proxy.serving.call.Call` in, an answer or a stream of events out), and what
``/openapi.json`` says of it (:attr:`Endpoint.openapi`, its request's and answer's
schemas). :data:`ENDPOINTS` opens the
list of every route, :data:`proxy.server.routes.ROUTES`: from it ``app.py`` makes one
:class:`Mounted` per endpoint and serves its :meth:`Mounted.serve` at the path and again
without ``/v1`` (and lets a client that leaves cancel the cascade ones); the lifespan is handed
the same :class:`Mounted` objects and fills each with its service once the services exist
(:meth:`Mounted.fill`); the OpenAPI document writes each path and its request schema. So a
route's handler is found by reading: the route is ``Mounted.serve``, which makes the request a
call and sends what the service ``Endpoint.make`` made returns (:mod:`proxy.server.calls`).
Adding an endpoint is its parameter table (:mod:`proxy.protocol.params`), its service module and
one entry here (``docs/architecture.md``, "An endpoint").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from proxy.protocol.answer_schemas import CHAT_COMPLETION, EMBEDDINGS, RESPONSE, TEXT_COMPLETION
from proxy.protocol.request_schema import (
    CHAT_REQUEST,
    COMPLETIONS_REQUEST,
    EMBEDDINGS_REQUEST,
    RESPONSES_REQUEST,
)
from proxy.protocol.shapes import Schema
from proxy.server.calls import Service, call_of, respond
from proxy.server.openapi.parts import post
from proxy.server.responses_compact import COMPACT_REQUEST, COMPACTED, CompactHandler
from proxy.server.responses_tokens import INPUT_TOKENS, INPUT_TOKENS_REQUEST, InputTokensHandler
from proxy.serving.chat import ChatService
from proxy.serving.completions import CompletionsService, EmbeddingsService
from proxy.serving.responses import ResponsesService
from proxy.serving.services import Services


@dataclass(frozen=True, kw_only=True)
class Endpoint:
    name: str  # what the endpoint is called (its handler's name in logs and tests)
    path: str  # with ``/v1``; also served without it, as OpenAI's clients use both
    make: Callable[[Services], Service]  # its service, made once when the app starts
    summary: str  # the OpenAPI path's summary
    request: tuple[str, Schema]  # the request schema: its component name, and the schema
    response: tuple[str, Schema]  # the answer's schema: its component name, and the schema
    cascade: bool = True  # local first: the routing headers, and a client that leaves cancels
    stream: bool = True  # ``stream: true`` answers with Server-Sent Events
    events: str = "With `stream: true`: `data: <chunk>` events, then `data: [DONE]`."
    also: tuple[int, ...] = ()  # statuses beyond the ones every POST may answer

    @property
    def bare(self) -> bool:
        """Served without ``/v1`` too, as OpenAI's clients use both."""
        return True

    @property
    def methods(self) -> tuple[str, ...]:
        return ("POST",)

    @property
    def openapi(self) -> dict[str, Any]:
        """Its OpenAPI path item."""
        return post(
            self.summary,
            self.request[0],
            self.response[0],
            stream=self.stream,
            cascade=self.cascade,
            events=self.events,
            also=self.also,
        )


ENDPOINTS: tuple[Endpoint, ...] = (
    Endpoint(
        name="chat",
        path="/v1/chat/completions",
        make=ChatService,
        summary="Chat completion, local first",
        request=("ChatCompletionRequest", CHAT_REQUEST),
        response=("ChatCompletion", CHAT_COMPLETION),
    ),
    Endpoint(
        name="completions",
        path="/v1/completions",
        make=CompletionsService,
        summary="Legacy text completion, local first",
        request=("CompletionRequest", COMPLETIONS_REQUEST),
        response=("TextCompletion", TEXT_COMPLETION),
    ),
    Endpoint(
        name="embeddings",
        path="/v1/embeddings",
        make=EmbeddingsService,
        summary="Embeddings, passed through to the API",
        request=("EmbeddingsRequest", EMBEDDINGS_REQUEST),
        response=("Embeddings", EMBEDDINGS),
        cascade=False,
        stream=False,
    ),
    Endpoint(
        name="responses",
        path="/v1/responses",
        make=ResponsesService,
        summary="A Responses answer, local first (translated to chat; stored unless "
        "`store: false`)",
        request=("ResponsesRequest", RESPONSES_REQUEST),
        response=("Response", RESPONSE),
        events="With `stream: true`: the typed events (`event: response.created` ... "
        "`response.completed`, `response.incomplete` or `response.failed`), each with its "
        "`sequence_number`; no `[DONE]`.",
        also=(404,),  # previous_response_id: not stored, or another key's
    ),
    Endpoint(
        name="responses_input_tokens",
        path="/v1/responses/input_tokens",
        make=InputTokensHandler,
        summary="The input tokens of a Responses request, counted with the model's tokenizer "
        "(no ledger row)",
        request=("ResponsesInputTokensRequest", INPUT_TOKENS_REQUEST),
        response=("ResponseInputTokens", INPUT_TOKENS),
        cascade=False,
        stream=False,
        also=(404,),  # previous_response_id: not stored, or another key's
    ),
    Endpoint(
        name="responses_compact",
        path="/v1/responses/compact",
        make=CompactHandler,
        summary="A conversation compacted by the upstream's own Responses API (always the "
        "API; a 400 when the fallback translates to chat)",
        request=("ResponsesCompactRequest", COMPACT_REQUEST),
        response=("CompactedResponse", COMPACTED),
        cascade=False,
        stream=False,
        also=(404,),  # previous_response_id: not stored, or another key's
    ),
)


def both_paths(path: str) -> tuple[str, str]:
    """``/v1/x`` and ``/x``."""
    return path, path.removeprefix("/v1")


class Mounted:
    """One endpoint's place in the app: the route serves :meth:`serve`, which hands each request,
    as a call, to the service the lifespan made from the services (:meth:`fill`), and sends what
    it returns."""

    def __init__(self, endpoint: Endpoint) -> None:
        self.endpoint = endpoint
        self.handler: Service | None = None  # None until the lifespan has built the services
        self.services: Services | None = None

    def fill(self, services: Services) -> None:
        self.services = services
        self.handler = self.endpoint.make(services)

    async def serve(self, request: Request) -> Response:
        if self.handler is None or self.services is None:  # nothing is served before it
            raise RuntimeError("the app's lifespan has not started: no handler")
        return respond(await self.handler(call_of(request, self.services)))
