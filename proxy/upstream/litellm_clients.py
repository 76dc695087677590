"""The clients the litellm route hands litellm, so that a provider's answer is read only up to
``[fallback] max_answer_bytes``.

litellm reads each provider's answer itself, and how differs by provider. Checked against the
source of the litellm this project locks (and by ``tests/upstream/test_litellm_clients.py``,
which sends every provider named here an answer far past the bound), two kinds take a client
from the caller (``client=``):

- :data:`HANDLER_PROVIDERS` send with litellm's own httpx handler (its ``BaseLLMHTTPHandler``),
  and take an ``AsyncHTTPHandler``: this module makes one for plain calls and one for streams,
  whose transport is :class:`BoundedTransport`, for every such provider.
- :data:`SDK_PROVIDERS` are the OpenAI-compatible providers litellm sends with the ``openai``
  SDK, and take an ``openai.AsyncOpenAI``. Such a client carries its own key and base URL, which
  litellm then uses instead of resolving them: they are taken from litellm's own resolver
  (``litellm.get_llm_provider``, the function litellm calls itself for each call, reading each
  provider's variables), and where it finds no key or no base the call is handed no client, so
  that litellm's own fallbacks decide as before. One ``AsyncOpenAI`` is kept per base URL, key
  and kind of call (plain or stream), over two shared ``httpx.AsyncClient`` with the bounded
  transport: the connections are reused, never one client per request. Keys stay in memory;
  none is logged.

Every other provider is handed no client, and litellm reads its answer whole; what it hands
back is then checked against the bound (:mod:`proxy.upstream.litellm_route`). Among them:
``azure`` (it wants an ``AsyncAzureOpenAI`` with an API version and Azure's own authentication,
which would be ours to resolve), ``bedrock`` (its stream is AWS's binary event stream, which a
bound per line does not fit), ``bytez``, ``langgraph`` and ``microsoft_365_copilot`` (they take
the client, but drop the bound's error for one of their own), ``cohere``, ``replicate``,
``vertex_ai``, ``sagemaker``, ``watsonx``, ``cloudflare``, ``oci`` and the text-completion
providers.

:class:`BoundedTransport` counts each answer's bytes as httpx reads them and raises
:func:`~proxy.upstream.route.too_large` past the bound: a whole answer for a plain call, each
line (so each SSE event, or each line of an NDJSON stream) for a stream.
"""

from __future__ import annotations

import importlib
from collections.abc import AsyncIterator
from typing import Any

import httpx

from proxy.upstream.route import too_large

__all__ = [
    "HANDLER_PROVIDERS",
    "SDK_PROVIDERS",
    "BoundedClients",
    "BoundedTransport",
]

# Providers whose litellm handler reads with the AsyncHTTPHandler handed to it as `client`.
HANDLER_PROVIDERS = frozenset(
    {
        "a2a",
        "anthropic",
        "azure_ai",
        "bedrock_mantle",
        "cometapi",
        "compactifai",
        "databricks",
        "databricks_agent",
        "datarobot",
        "deepseek",
        "edenai",
        "fireworks_ai",
        "gemini",
        "groq",
        "heroku",
        "hosted_vllm",
        "huggingface",
        "langflow",
        "lemonade",
        "minimax",
        "mistral",
        "nadir",
        "ollama",
        "ollama_chat",
        "opencode_go",
        "openrouter",
        "ovhcloud",
        "snowflake",
        "together_ai",
        "xai",
    }
)
# OpenAI-compatible providers litellm sends with the `openai` SDK (an AsyncOpenAI as `client`).
SDK_PROVIDERS = frozenset(
    {
        "abliteration",
        "ai21",
        "ai21_chat",
        "aiand",
        "aiml",
        "apertis",
        "assemblyai",
        "baseten",
        "bigmodel",
        "cerebras",
        "charity_engine",
        "chutes",
        "clf_ai_gateway",
        "codestral",
        "cognition",
        "coralbricks",
        "cortecs",
        "custom_openai",
        "darkbloom",
        "dashscope",
        "deepinfra",
        "docker_model_runner",
        "empiriolabs",
        "empower",
        "featherless_ai",
        "friendliai",
        "galadriel",
        "github",
        "helicone",
        "hostinger_router",
        "hyperbolic",
        "inception",
        "inferenceapis",
        "kyma",
        "lambda_ai",
        "libertai",
        "litellm_proxy",
        "llamafile",
        "lm_studio",
        "meta",
        "meta_llama",
        "modelscope",
        "moonshot",
        "morph",
        "nebius",
        "neosantara",
        "novita",
        "nscale",
        "nvidia_nim",
        "openinfer",
        "parasail",
        "perplexity",
        "pinstripes",
        "poe",
        "prism",
        "publicai",
        "qwen_ai_platform",
        "qwencloud",
        "refuseless",
        "reka",
        "sail",
        "sambanova",
        "scaleway",
        "streamlake",
        "synthetic",
        "tencent",
        "tensormesh",
        "v0",
        "vercel_ai_gateway",
        "volcengine",
        "wally",
        "wandb",
        "xiaomi_mimo",
        "xinference",
        "zai",
        "zerogpu",
    }
)
MAX_SDK_CLIENTS = 64
"""``AsyncOpenAI`` clients kept at most (one per base URL, key and kind of call); past it they
are made again as needed."""


class _BoundedBody(httpx.AsyncByteStream):
    """A response body read through, raising past ``limit`` bytes: in all, or per line."""

    def __init__(self, inner: httpx.AsyncByteStream, limit: int, per_line: bool) -> None:
        self._inner = inner
        self._limit = limit
        self._per_line = per_line

    async def __aiter__(self) -> AsyncIterator[bytes]:
        run = 0  # bytes in all, or since the last newline
        async for chunk in self._inner:
            newline = chunk.rfind(b"\n") if self._per_line else -1
            run = len(chunk) - newline - 1 if newline >= 0 else run + len(chunk)
            if run > self._limit:
                raise too_large("stream event" if self._per_line else "answer", self._limit)
            yield chunk

    async def aclose(self) -> None:
        await self._inner.aclose()


class BoundedTransport(httpx.AsyncBaseTransport):
    """httpx's own transport, each response body bounded as httpx reads it: ``limit`` bytes in
    all, or per line when ``per_line`` (a stream's events). A non-streamed answer that declares a
    ``Content-Length`` past the bound is refused before a byte of it is read."""

    def __init__(self, limit: int, *, per_line: bool) -> None:
        self._inner = httpx.AsyncHTTPTransport()
        self._limit = limit
        self._per_line = per_line

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self._inner.handle_async_request(request)
        declared = response.headers.get("content-length", "")
        if not self._per_line and declared.isdigit() and int(declared) > self._limit:
            await response.aclose()
            raise too_large("answer", self._limit)
        body = response.stream
        assert isinstance(body, httpx.AsyncByteStream)
        return httpx.Response(
            status_code=response.status_code,
            headers=response.headers,
            stream=_BoundedBody(body, self._limit, self._per_line),
            extensions=response.extensions,
        )

    async def aclose(self) -> None:
        await self._inner.aclose()


class BoundedClients:
    """The bounded clients of one litellm route: made at :meth:`start`, closed at
    :meth:`aclose`; :meth:`for_call` picks the one a call's provider takes."""

    def __init__(self, limit: int, timeout_s: float) -> None:
        self._limit = limit
        self._timeout_s = timeout_s
        self._handlers: dict[bool, Any] = {}  # litellm AsyncHTTPHandlers, by "for a stream"
        self._http: dict[bool, httpx.AsyncClient] = {}  # under the AsyncOpenAI clients
        self._sdk: dict[tuple[str, str, bool], Any] = {}  # (base, key, stream): AsyncOpenAI

    def start(self) -> None:
        """Make the two handlers and the two httpx clients (litellm is imported already)."""
        if self._handlers:
            return
        handler = importlib.import_module("litellm.llms.custom_httpx.http_handler")
        for per_line in (False, True):
            transport = BoundedTransport(self._limit, per_line=per_line)
            self._handlers[per_line] = handler.AsyncHTTPHandler(transport=transport)
            self._http[per_line] = httpx.AsyncClient(
                transport=BoundedTransport(self._limit, per_line=per_line),
                timeout=httpx.Timeout(self._timeout_s),
            )

    async def aclose(self) -> None:
        handlers, self._handlers = list(self._handlers.values()), {}
        http, self._http = list(self._http.values()), {}
        self._sdk.clear()
        for handler in handlers:
            await handler.close()
        for client in http:
            await client.aclose()

    def for_call(self, litellm: Any, kwargs: dict[str, Any]) -> Any | None:
        """The client litellm's call with ``kwargs`` should read through; None: its provider
        takes none of ours (or litellm's resolver found no key or base for it)."""
        model = str(kwargs["model"])
        provider = model.partition("/")[0]
        stream = bool(kwargs.get("stream"))
        if provider in HANDLER_PROVIDERS:
            return self._handlers[stream]
        if provider not in SDK_PROVIDERS:
            return None
        try:
            _model, _provider, key, base = litellm.get_llm_provider(
                model=model, api_base=kwargs.get("api_base"), api_key=kwargs.get("api_key")
            )
        except Exception:  # litellm's own call raises it again, and it is translated there
            return None
        if not isinstance(key, str) or not key or not isinstance(base, str) or not base:
            return None
        found = self._sdk.get((base, key, stream))
        if found is None:
            if len(self._sdk) >= MAX_SDK_CLIENTS:
                self._sdk.clear()  # they share the two httpx clients: nothing to close
            openai = importlib.import_module("openai")
            found = openai.AsyncOpenAI(
                api_key=key, base_url=base, http_client=self._http[stream], max_retries=0
            )
            self._sdk[(base, key, stream)] = found
        return found
