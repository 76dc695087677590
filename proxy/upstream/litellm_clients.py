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

Every other provider is handed no client, and litellm takes one from its own places: its cache
of clients (``litellm.in_memory_llm_clients_cache``, which its ``get_async_httpx_client`` asks),
its module-level ``AsyncHTTPHandler`` and the ``httpx.AsyncClient`` it gives the ``openai`` SDK
clients it makes itself (``litellm.aclient_session``). :meth:`BoundedClients.start` puts bounded
clients there, and :meth:`BoundedClients.aclose` puts litellm's own back: ``azure`` (litellm
makes its ``AsyncAzureOpenAI``, with its own API version and authentication, over the bounded
session), ``bedrock`` (its stream, AWS's binary event stream, bounded per frame by the length
each frame declares), ``cohere``, ``cloudflare``, ``watsonx``, the text-completion providers,
``langgraph``, and the others that read through litellm's httpx helpers (``vertex_ai``,
``sagemaker``, ``replicate``, ``oci``, ``bytez``, ``microsoft_365_copilot``: the same clients,
but not tested here, as they cannot be pointed at a fake server on loopback). Those shared
clients are not told by litellm whether a call streams; the route tells them
(:meth:`BoundedClients.calling`).

:class:`BoundedTransport` counts each answer's bytes as httpx reads them and raises
:func:`~proxy.upstream.route.too_large` past the bound: a whole answer for a plain call, each
line (so each SSE event, or each line of an NDJSON stream) for a stream.
"""

from __future__ import annotations

import contextvars
import importlib
from collections.abc import AsyncIterator, Callable
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


EVENT_STREAM_TYPES = ("text/event-stream", "application/x-ndjson", "application/jsonl")
"""Answers bounded per line when the call's kind is not known (a stream's events)."""
AWS_EVENT_STREAM = "application/vnd.amazon.eventstream"
"""AWS's binary event stream (bedrock, sagemaker): bounded per frame, by its declared length."""


class _BoundedBody(httpx.AsyncByteStream):
    """A response body read through, raising past ``limit`` bytes: in all (``whole``), per line
    (``lines``), or per AWS event-stream frame (``frames``: each frame's first four bytes say its
    length, refused when past the bound before the frame is read)."""

    def __init__(self, inner: httpx.AsyncByteStream, limit: int, unit: str) -> None:
        self._inner = inner
        self._limit = limit
        self._unit = unit

    async def __aiter__(self) -> AsyncIterator[bytes]:
        run = 0  # bytes in all, or since the last newline
        left, head = 0, b""  # frames: bytes left of the current frame, its length read so far
        async for chunk in self._inner:
            if self._unit == "frames":
                at = 0
                while at < len(chunk):
                    if left > 0:
                        step = min(left, len(chunk) - at)
                        left, at = left - step, at + step
                        continue
                    head, at = head + chunk[at : at + 4 - len(head)], at + 4 - len(head)
                    if len(head) == 4:
                        length = int.from_bytes(head, "big")
                        if length > self._limit:
                            raise too_large("stream event", self._limit)
                        left, head = max(length - 4, 0), b""
                yield chunk
                continue
            newline = chunk.rfind(b"\n") if self._unit == "lines" else -1
            run = len(chunk) - newline - 1 if newline >= 0 else run + len(chunk)
            if run > self._limit:
                raise too_large("answer" if self._unit == "whole" else "stream event", self._limit)
            yield chunk

    async def aclose(self) -> None:
        await self._inner.aclose()


class BoundedTransport(httpx.AsyncBaseTransport):
    """httpx's own transport, each response body bounded as httpx reads it: ``limit`` bytes in
    all, or per line when ``per_line`` (a stream's events). A non-streamed answer that declares a
    ``Content-Length`` past the bound is refused before a byte of it is read.

    ``per_line`` None: the call's kind is asked of ``streaming`` (a stream: True, a plain call:
    False, not known: None) when the answer's head arrives; not known, an answer whose type is an
    event stream (:data:`EVENT_STREAM_TYPES`) is bounded per line and any other in all. AWS's
    binary event stream (:data:`AWS_EVENT_STREAM`) is bounded per frame in a stream."""

    def __init__(
        self,
        limit: int,
        *,
        per_line: bool | None,
        streaming: Callable[[], bool | None] | None = None,
    ) -> None:
        self._inner = httpx.AsyncHTTPTransport()
        self._limit = limit
        self._per_line = per_line
        self._streaming = streaming

    def _unit(self, response: httpx.Response) -> str:
        kind = response.headers.get("content-type", "").partition(";")[0].strip().lower()
        stream = self._per_line
        if stream is None and self._streaming is not None:
            stream = self._streaming()
        if stream is None:
            stream = kind in EVENT_STREAM_TYPES or kind == AWS_EVENT_STREAM
        if not stream:
            return "whole"
        return "frames" if kind == AWS_EVENT_STREAM else "lines"

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self._inner.handle_async_request(request)
        unit = self._unit(response)
        declared = response.headers.get("content-length", "")
        if unit == "whole" and declared.isdigit() and int(declared) > self._limit:
            await response.aclose()
            raise too_large("answer", self._limit)
        body = response.stream
        assert isinstance(body, httpx.AsyncByteStream)
        return httpx.Response(
            status_code=response.status_code,
            headers=response.headers,
            stream=_BoundedBody(body, self._limit, unit),
            extensions=response.extensions,
        )

    async def aclose(self) -> None:
        await self._inner.aclose()


class _LitellmClientCache:
    """The cache of clients the route puts in litellm's place (``litellm.
    in_memory_llm_clients_cache``) while it runs: the async httpx client litellm asks it for
    (its ``get_async_httpx_client``, for every provider handed no client) is the route's bounded
    one; the clients litellm makes meanwhile (``AsyncAzureOpenAI`` over the route's bounded
    ``aclient_session``...) are kept in ``inner``, a cache of litellm's own kind that goes with
    the route, so that none outlives the session it was made over."""

    def __init__(self, inner: Any, handler: Any, owner: BoundedClients) -> None:
        self.inner = inner
        self._handler = handler
        self.owner = owner

    def get_cache(self, key: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(key, str) and key.startswith("async_httpx_client"):
            return self._handler
        return self.inner.get_cache(key, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


_ABSENT = object()
_LITELLM_CLIENTS = ("in_memory_llm_clients_cache", "module_level_aclient", "aclient_session")
"""What litellm reads when a call is handed no client: its cache of clients, its module-level
``AsyncHTTPHandler`` and the ``httpx.AsyncClient`` it gives the ``AsyncOpenAI`` and
``AsyncAzureOpenAI`` clients it makes itself."""


class BoundedClients:
    """The bounded clients of one litellm route: made at :meth:`start`, closed at
    :meth:`aclose`; :meth:`for_call` picks the one a call's provider takes.

    For the providers handed none of them, :meth:`start` also puts bounded clients in litellm's
    own places (:data:`_LITELLM_CLIENTS`), and :meth:`aclose` puts litellm's back: so every
    provider whose answer litellm reads with httpx reads it through :class:`BoundedTransport`
    (azure through the ``AsyncAzureOpenAI`` litellm makes, with its own API version and
    authentication). Those clients cannot be told by litellm whether the call streams: the
    route says so in :meth:`calling`, a context variable of this object read by the transport
    when an answer's head arrives (a plain call: the whole answer bounded; a stream, or a call
    it was not told of: per line, as its content type says)."""

    def __init__(self, limit: int, timeout_s: float) -> None:
        self._limit = limit
        self._timeout_s = timeout_s
        self._handlers: dict[bool, Any] = {}  # litellm AsyncHTTPHandlers, by "for a stream"
        self._http: dict[bool, httpx.AsyncClient] = {}  # under the AsyncOpenAI clients
        self._sdk: dict[tuple[str, str, bool], Any] = {}  # (base, key, stream): AsyncOpenAI
        self._streams: contextvars.ContextVar[bool | None] = contextvars.ContextVar(
            f"frugal_litellm_streams_{id(self)}", default=None
        )
        self._shared: dict[str, Any] = {}  # what this route put in litellm's places
        self._saved: dict[str, Any] = {}  # litellm's own, put back at aclose
        self._litellm: Any = None

    def start(self, litellm: Any) -> None:
        """Make the handlers and the httpx clients, and put the shared ones in litellm's places
        (litellm is imported already)."""
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
        shared = BoundedTransport(self._limit, per_line=None, streaming=self._streams.get)
        module_handler = handler.AsyncHTTPHandler(transport=shared)
        session = httpx.AsyncClient(transport=shared, timeout=httpx.Timeout(self._timeout_s))
        self._litellm = litellm
        cache = litellm.in_memory_llm_clients_cache  # made now if litellm has not made it yet
        kind = type(cache.inner if isinstance(cache, _LitellmClientCache) else cache)
        self._saved = {name: vars(litellm).get(name, _ABSENT) for name in _LITELLM_CLIENTS}
        self._shared = {
            "in_memory_llm_clients_cache": _LitellmClientCache(kind(), module_handler, self),
            "module_level_aclient": module_handler,
            "aclient_session": session,
        }
        for name, value in self._shared.items():
            setattr(litellm, name, value)

    def calling(self, stream: bool) -> contextvars.Token[bool | None]:
        """Tell the shared clients whether the call about to be made streams; hand the token
        back to :meth:`called` once the call has returned."""
        return self._streams.set(stream)

    def called(self, token: contextvars.Token[bool | None]) -> None:
        self._streams.reset(token)

    async def aclose(self) -> None:
        litellm, self._litellm = self._litellm, None
        shared, self._shared = self._shared, {}
        saved = self._saved
        while True:  # what was there before, past any route closed since (closed out of order)
            before = saved.get("in_memory_llm_clients_cache")
            if not isinstance(before, _LitellmClientCache) or before.owner._litellm is not None:
                break
            saved = before.owner._saved
        for name, value in shared.items():  # put back, unless replaced since (by another route)
            if litellm is not None and vars(litellm).get(name) is value:
                old = saved.get(name, _ABSENT)
                if old is _ABSENT:
                    delattr(litellm, name)
                else:
                    setattr(litellm, name, old)
        handlers, self._handlers = list(self._handlers.values()), {}
        http, self._http = list(self._http.values()), {}
        self._sdk.clear()
        if shared:
            handlers.append(shared["module_level_aclient"])
            http.append(shared["aclient_session"])
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
