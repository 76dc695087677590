"""The Batch API of a litellm-routed provider, where it is OpenAI's own: its lines at batch price.

A model that ``[fallback] models`` maps to ``<provider>/<model>`` is sent by litellm
(:mod:`proxy.upstream.litellm_route`), one call at a time. For the providers in
:data:`BATCH_PROVIDERS`, whose Files and Batch APIs have OpenAI's shape at the same base URL as
their chat endpoint (``POST /files`` with purpose ``batch``, ``POST /batches`` with
``input_file_id``, ``endpoint`` and a ``24h`` window, ``GET /batches/{id}``, ``GET
/files/{id}/content`` with OpenAI's output lines), the rejects of a batch go instead through
the proxy's own wire (:mod:`proxy.upstream.batch_api`) at that provider, as one batch, at its
batch rate:

- ``groq``: ``https://api.groq.com/openai/v1`` (its ``/files`` and ``/batches``);
- ``deepinfra``: ``https://api.deepinfra.com/v1/openai`` (chat, completions, embeddings);
- ``nebius``: Nebius AI Studio's ``/v1`` (chat, embeddings).

The base URL and the key are litellm's own answer for the target (``litellm.get_llm_provider``,
which reads the provider's variables: ``GROQ_API_BASE``, ``GROQ_API_KEY``...), with the key the
litellm route would hand it (``api_key_env``'s when ``api_base`` is empty), so a batch goes
where that provider's single calls go; with no base or no key found, the lines go one call each
as before. Each line's ``model`` is the provider's own name (the prefix litellm drops).

Every other litellm provider stays ``sync`` (one call per line through litellm), because its
batch support is not OpenAI's wire: ``together_ai`` uploads with purpose ``batch-api``;
``mistral`` makes ``/batch/jobs`` of ``input_files`` and a model; ``fireworks_ai`` runs
``batchInferenceJobs`` over datasets; ``xai`` and ``anthropic`` have batch APIs of their own
shape; ``novita``'s Batch API lives under another base than its chat; and ``hosted_vllm``,
``ollama``, ``openrouter`` and most others have none. (OpenAI itself, ``openai/<model>``, takes
the direct route to ``api_base`` and its Batch API already.) A provider here that refuses a
batch anyway (a 404, or a 400 that says batches are not supported: an account, a region or a
self-hosted base without them) has that batch's lines sent one call each, once, by
:mod:`proxy.upstream.deferred`.

:class:`LitellmBatches` keeps one :class:`~proxy.upstream.direct_route.DirectRoute` per base
URL and key: the direct route's pool, bounds and reads (an answer up to ``[fallback]
max_answer_bytes``, an output file up to ``[batch] max_output_bytes`` read line by line),
opened at its first call and closed with the litellm route. The key is held in memory only and
sent as the bearer token; it is never logged.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from proxy.config import FallbackSettings
from proxy.upstream.batch_api import DirectWire
from proxy.upstream.direct_route import DirectRoute
from proxy.upstream.route import Opened

__all__ = ["BATCH_PROVIDERS", "LitellmBatches", "ProviderWire"]

BATCH_PROVIDERS = frozenset({"groq", "deepinfra", "nebius"})
"""litellm's providers whose Files and Batch APIs are OpenAI's, at their chat base URL."""


class ProviderWire(DirectWire):
    """The :class:`~proxy.upstream.batch_api.Wire` of one litellm provider's base and key: the
    direct wire, over a route that is started at its first call."""

    def __init__(self, route: DirectRoute, provider: str) -> None:
        super().__init__(route)
        self._route = route
        self.provider = provider

    def ready(self) -> None:
        """Nothing to check before a call: the base and the key were found when it was made."""

    async def upload(self, content: bytes, request_id: str) -> dict[str, Any]:
        await self._route.start()
        return await super().upload(content, request_id)

    async def create(self, file_id: str, endpoint: str, request_id: str) -> dict[str, Any]:
        await self._route.start()
        return await super().create(file_id, endpoint, request_id)

    async def retrieve(self, batch_id: str, request_id: str) -> dict[str, Any]:
        await self._route.start()
        return await super().retrieve(batch_id, request_id)

    async def cancel(self, batch_id: str, request_id: str) -> dict[str, Any]:
        await self._route.start()
        return await super().cancel(batch_id, request_id)

    async def delete_file(self, file_id: str, request_id: str) -> dict[str, Any]:
        await self._route.start()
        return await super().delete_file(file_id, request_id)

    async def open_content(self, file_id: str, request_id: str) -> Opened:
        await self._route.start()
        return await super().open_content(file_id, request_id)


class LitellmBatches:
    """The Batch API wires of the litellm route's providers: one pool per base URL and key."""

    def __init__(self, settings: FallbackSettings) -> None:
        self._settings = settings
        self._routes: dict[tuple[str, str], DirectRoute] = {}

    def wire(
        self, litellm: Any, target: str, api_key: str | None
    ) -> tuple[ProviderWire, str] | None:
        """The wire for ``target`` (``groq/<model>``) and the model name its lines are sent
        as; None when its provider is not in :data:`BATCH_PROVIDERS`, litellm is not imported,
        or litellm's resolver finds no base or no key for it (``api_key``: the key the litellm
        route hands litellm, if any)."""
        provider = target.partition("/")[0]
        if provider not in BATCH_PROVIDERS or litellm is None:
            return None
        try:
            model, _, key, base = litellm.get_llm_provider(model=target, api_key=api_key)
        except Exception:  # an unknown model or provider: its lines go one call each
            return None
        if not all(isinstance(x, str) and x for x in (model, key, base)):
            return None
        base = base.rstrip("/")
        route = self._routes.get((base, key))
        if route is None:
            route = DirectRoute(dataclasses.replace(self._settings, api_base=base), api_key=key)
            self._routes[(base, key)] = route
        return ProviderWire(route, provider), model

    async def aclose(self) -> None:
        """Close every provider's pool (a later call opens it again)."""
        for route in list(self._routes.values()):
            await route.aclose()
