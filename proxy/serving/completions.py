"""``POST /v1/completions`` (legacy text completions) and ``POST /v1/embeddings``: their services,
each a :class:`~proxy.serving.call.Call` in and an answer or a stream of events out (the server's
handlers read the request and write the response, :mod:`proxy.server.calls`).

Legacy completions take the same cascade as chat, in the same life cycle (a
:class:`proxy.serving.cascade.Cascade` of their own): a pre-route check
(:mod:`proxy.protocol.params`), a local attempt (the raw prompt, no chat template) scored by the
quality gate, and the API when the answer is not good enough. A streamed request gets the local
answer replayed as OpenAI's ``text_completion`` chunks after it was scored; on the API route the
proxy asks for JSON and replays that, so a fallback can still happen before the first byte.

Embeddings are not made locally: they pass through to the API.

Both take the key's checks chat takes (:mod:`proxy.serving.quotas`): its rpm and its concurrency
share from the headers (:mod:`proxy.server.shares`), its models once the model is known, and its
monthly budget before any API call (the worst case reserved, settled to the real cost when the
row is written; the worst case of the exact body posted, every prompt of a list answered
``n`` or ``best_of`` times). A spent budget is a 429 ``insufficient_quota``, or, for
a completion sent to the API only for speed, the local answer when the gate accepts it (reason
``budget_exhausted``); a budget database that cannot be reached refuses the API (503).

The ledger row's ``endpoint`` is ``completions`` or ``embeddings``.
"""

from __future__ import annotations

from typing import Any

from proxy.engine import legacy
from proxy.errors import BadRequest, LocalUnavailable
from proxy.protocol.answers import public_answer
from proxy.protocol.params import LOCAL_ALIAS
from proxy.protocol.validate import completions_request, embeddings_request
from proxy.routing.reasons import Reason
from proxy.routing.router import ROUTE_HEADER
from proxy.serving import events
from proxy.serving.call import Answer, Call, Outcome
from proxy.serving.cascade import Cascade
from proxy.serving.events import aiter_of
from proxy.serving.exchange import Exchange
from proxy.serving.services import Services
from proxy.upstream.client import COMPLETIONS_PATH, EMBEDDINGS_PATH


def _without_stream(body: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in body.items() if k not in ("stream", "stream_options")}


def _completions_call(
    services: Services, body: dict[str, Any], ex: Exchange, sent: dict[str, Any] | None = None
) -> tuple[str, dict[str, Any]]:
    """What ``post_json`` posts: the body without ``stream`` (the API is asked for JSON)."""
    return COMPLETIONS_PATH, services.upstream.sent(COMPLETIONS_PATH, _without_stream(body))


def _embeddings_call(
    services: Services, body: dict[str, Any], ex: Exchange, sent: dict[str, Any] | None = None
) -> tuple[str, dict[str, Any]]:
    return EMBEDDINGS_PATH, services.upstream.sent(EMBEDDINGS_PATH, body)


class CompletionsService:
    """``POST /v1/completions``, on its own :class:`Cascade`."""

    def __init__(self, services: Services) -> None:
        self.services = services
        self.cascade = Cascade(
            services,
            endpoint="completions",
            prompt_param="prompt",
            prompt_noun="the prompt",
            api_call=_completions_call,
        )

    async def __call__(self, call: Call) -> Outcome:
        return await self.cascade.serve(call, self.handle)

    async def handle(self, call: Call, ex: Exchange) -> Outcome:
        cascade = self.cascade
        body = await call.read(completions_request)
        planned = cascade.begin(call, body, ex)
        await cascade.admit(call, body, ex)  # the key's models (its rpm: before the body)
        # The key's budget, before the API call; spent, a local answer the gate accepts is free.
        kept = await cascade.local_first(body, planned, ex, kind="complete")
        if kept is not None:
            return self._local(kept, ex, body)
        upstream = self.services.upstream
        asking = upstream.post_json(
            COMPLETIONS_PATH, _without_stream(body), request_id=ex.request_id
        )
        reply = (await cascade.from_api(asking, ex)).body
        if ex.stream:
            return self._replay(reply, ex, body)
        return Answer(reply, ex.headers())

    def _local(self, kept: dict[str, Any], ex: Exchange, body: dict[str, Any]) -> Outcome:
        """A kept local completion sent, as JSON or replayed as a stream."""
        # The ledger counts the answer with the requested model's tokenizer: give it the
        # prompt and the text in chat form.
        ex.counted_as_chat(*legacy.chat_view(body, kept))
        if ex.stream:  # one chunk per token, as OpenAI streams: keep them for that
            return self._replay(
                public_answer(kept, {"logprobs": 5, "model": body["model"]}, text=True), ex, body
            )
        return Answer(public_answer(kept, body, text=True), ex.headers())

    def _replay(self, answer: dict[str, Any], ex: Exchange, body: dict[str, Any]) -> Outcome:
        chunks = events.replay_text_completion(
            answer,
            include_usage=bool((body.get("stream_options") or {}).get("include_usage")),
            with_logprobs=body.get("logprobs") is not None,
        )
        return self.cascade.stream(aiter_of(chunks), ex)


class EmbeddingsService:
    """Embeddings pass through to the API (reason ``unsupported``: no local embeddings)."""

    def __init__(self, services: Services) -> None:
        self.services = services
        self.cascade = Cascade(services, endpoint="embeddings", api_call=_embeddings_call)

    async def __call__(self, call: Call) -> Outcome:
        return await self.cascade.serve(call, self.handle)

    async def handle(self, call: Call, ex: Exchange) -> Outcome:
        body = await call.read(embeddings_request)
        ex.asked(body["model"])
        forced = (call.route or "").strip().lower()
        if forced not in ("", "local", "api"):
            raise BadRequest(
                f"header '{ROUTE_HEADER}' must be 'local' or 'api', got {forced!r}",
                param=ROUTE_HEADER,
            )
        if body["model"] == LOCAL_ALIAS or forced == "local":
            raise BadRequest(
                "the local model does not make embeddings; ask for an API embedding model",
                param="model",
                code="unsupported_locally",
            )
        ex.fell_back(Reason.FORCED if forced == "api" else Reason.UNSUPPORTED)
        if not self.services.router.fallback_enabled:
            raise LocalUnavailable(
                "embeddings come from the API, and no API fallback is configured"
            )
        await self.cascade.admit(call, body, ex)  # the key's models (its rpm: before the body)
        await self.cascade.reserve(body, ex)  # embeddings answer no tokens: the input is the worst
        upstream = self.services.upstream
        asking = upstream.post_json(EMBEDDINGS_PATH, body, request_id=ex.request_id)
        reply = (await self.cascade.from_api(asking, ex)).body
        ex.answered_nothing()
        return Answer(reply, ex.headers())
