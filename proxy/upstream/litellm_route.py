"""The litellm route: a mapped target with a provider prefix other than ``openai/``.

``[fallback] models`` may map a requested name to ``anthropic/claude-3-5-haiku`` or any other
provider litellm knows; :class:`LitellmRoute` sends those requests. litellm takes seconds to
import, so it is imported (in a thread, once) at start-up only when the mapping needs it.
``api_key_env`` names the key of ``api_base``; litellm providers read their own standard
variable (``ANTHROPIC_API_KEY``...), except when ``api_base`` is empty: then the key of
``api_key_env`` is theirs.

litellm is handed the allow-listed OpenAI parameters (:data:`LITELLM_PARAMETERS`) and the few
this route sets itself (:data:`LITELLM_OWN_KWARGS`), never a client's ``api_base``, ``api_key``,
``model_list``, ``mock_response`` or other routing keyword. ``metadata`` is not handed to
litellm either: there it is litellm's own logging and routing metadata, not OpenAI's. litellm's
own retries are turned off; the client's :class:`~proxy.upstream.retry.RetryPolicy` retries.

Size: litellm reads the provider's answer itself, with a client that differs by provider. Most
providers take one from the caller (``client=``), and this route hands them clients of its own,
made at :meth:`LitellmRoute.start` and closed with it (:mod:`proxy.upstream.litellm_clients`,
which says which providers and how): their transport counts each answer's bytes as httpx reads
them and raises :func:`~proxy.upstream.route.too_large` past ``[fallback] max_answer_bytes``: a
whole answer for a non-streamed call, each line (so each SSE event) for a stream. The other
providers take a client from litellm's own places, where :meth:`LitellmRoute.start` puts bounded
ones too, and :meth:`LitellmRoute.aclose` puts litellm's back; each call tells them whether it
streams. The error reaches the client as the same 502 as on the direct route
(:func:`proxy.upstream.failures.translate` finds it in the chain of litellm's wrapping errors).
What litellm hands back is still checked against the bound.

:class:`LitellmRoute` is a :class:`~proxy.upstream.route.Route`: each call is one attempt.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import os
from collections.abc import AsyncGenerator
from typing import Any

from proxy import logs
from proxy.config import FallbackSettings
from proxy.protocol.forwarding import forwarded
from proxy.protocol.params import CHAT_PARAMETERS
from proxy.upstream.litellm_batches import LitellmBatches, ProviderWire
from proxy.upstream.litellm_clients import (
    HANDLER_PROVIDERS,
    SDK_PROVIDERS,
    BoundedClients,
    BoundedTransport,
)
from proxy.upstream.route import Answer, Opened, too_large

__all__ = [
    "HANDLER_PROVIDERS",
    "SDK_PROVIDERS",
    "LITELLM_OWN_KWARGS",
    "LITELLM_PARAMETERS",
    "BoundedTransport",
    "LitellmRoute",
    "answer_of",
    "import_litellm",
    "sse_of",
]

_encode = json.JSONEncoder(check_circular=False, separators=(",", ":")).encode
# OpenAI's chat parameters litellm is handed. `metadata` is litellm's own (logging, routing
# hints) rather than OpenAI's; `model` and the stream flags are set by the call itself.
LITELLM_PARAMETERS = frozenset(CHAT_PARAMETERS) - {"metadata", "model", "stream", "stream_options"}
# The keywords the litellm call sets itself, besides LITELLM_PARAMETERS.
LITELLM_OWN_KWARGS = frozenset(
    {
        "model",
        "stream",
        "stream_options",
        "timeout",
        "num_retries",
        "max_retries",
        "drop_params",
        "extra_headers",
        "api_key",
        "client",
    }
)


class LitellmRoute:
    """litellm's keywords for a forwarded body, and one attempt of the call."""

    def __init__(self, settings: FallbackSettings) -> None:
        self._settings = settings
        self._litellm: Any = None
        self._clients = BoundedClients(settings.max_answer_bytes, settings.timeout_s)
        self._batches = LitellmBatches(settings)

    async def start(self) -> None:
        """Import litellm (seconds) in a thread, once, and make its bounded clients."""
        if self._litellm is None:
            self._litellm = await asyncio.to_thread(import_litellm)
        self._clients.start(self._litellm)

    async def aclose(self) -> None:
        """Close the bounded clients (and put litellm's own back in its places) and the batch
        wires' pools."""
        await self._clients.aclose()
        await self._batches.aclose()

    def batch_wire(self, target: str) -> tuple[ProviderWire, str] | None:
        """The Batch API wire of ``target``'s provider, where it is OpenAI's, and the model
        name its lines are sent as (:mod:`proxy.upstream.litellm_batches`); None: one call each."""
        return self._batches.wire(
            self._litellm, target, self.kwargs({"model": target}, "").get("api_key")
        )

    def ready(self) -> None:
        """Always ready: a missing key or base is the provider's answer, an attempt's failure."""

    async def complete(self, forward: dict[str, Any], request_id: str) -> Answer:
        data, raw = answer_of(await self.call(self.kwargs(forward, request_id)))
        if len(raw) > self._settings.max_answer_bytes:
            raise too_large("answer", self._settings.max_answer_bytes)
        return 200, data, raw

    async def open_stream(self, forward: dict[str, Any], request_id: str) -> Opened:
        kwargs = self.kwargs(forward, request_id)
        kwargs.update(stream=True, stream_options=forward["stream_options"])
        result = await self.call(kwargs)
        return Opened(sse_of(result), result.aclose)

    def kwargs(self, forward: dict[str, Any], request_id: str) -> dict[str, Any]:
        """litellm's keywords: allow-listed OpenAI parameters, then the call's own settings."""
        kwargs = forwarded(forward, LITELLM_PARAMETERS)
        kwargs.update(
            model=forward["model"],
            timeout=(
                self._settings.flex_timeout_s
                if forward.get("service_tier") == "flex"
                else self._settings.timeout_s
            ),
            num_retries=0,
            max_retries=0,
            drop_params=True,
            extra_headers={"x-request-id": request_id},
        )
        if not self._settings.api_base.rstrip("/"):
            kwargs["api_key"] = self._settings.api_key() or None
        return kwargs

    async def call(self, kwargs: dict[str, Any]) -> Any:
        """One attempt: litellm's answer (a model response, or its stream when streamed), read
        through a bounded client where the provider takes one."""
        await self.start()
        client = self._clients.for_call(self._litellm, kwargs)
        if client is not None:
            kwargs = {**kwargs, "client": client}
        token = self._clients.calling(bool(kwargs.get("stream")))
        try:
            return await self._litellm.acompletion(**kwargs)
        finally:
            self._clients.called(token)


def answer_of(result: Any) -> tuple[dict[str, Any], bytes]:
    """The JSON of a non-streamed litellm answer, and those bytes serialised once."""
    data: dict[str, Any] = result.model_dump()
    return data, _encode(data).encode()


async def sse_of(stream: Any) -> AsyncGenerator[bytes, None]:
    """A litellm stream as OpenAI's SSE bytes, ``[DONE]`` at its end."""
    async for chunk in stream:
        yield b"data: " + _encode(chunk.model_dump()).encode() + b"\n\n"
    yield b"data: [DONE]\n\n"


def import_litellm() -> Any:
    """Import litellm with its local cost map and without its feedback banner."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    litellm: Any = importlib.import_module("litellm")
    litellm.suppress_debug_info = True  # no "Give Feedback" banner on stdout for each error
    logs.adopt_library_loggers()  # its warnings as JSON fields, not its own plain text
    return litellm
