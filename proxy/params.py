"""The one table of OpenAI request parameters: which are accepted, and what the local route does.

Every parameter of OpenAI's chat-completions request is in :data:`CHAT_PARAMETERS`, with what
the local route does with it (the API route forwards it unchanged):

- ``honoured``: the local engine does what the parameter asks.
- ``ignored``: accepted and ignored on the local route, because it cannot change the answer
  (billing, caching, storage and abuse-tracking hints meant for the provider).
- ``depends``: honoured for some values; the others send the request to the API.
- ``api``: a request that sets it goes to the API (pre-route reason ``unsupported``).

The tables are also allow-lists: :func:`check_parameters` refuses any other key with a 400 that
names it, as OpenAI does ("Unrecognized request argument supplied"), and :func:`forwarded` builds
the body sent upstream from the table's keys only, never from the client's dict minus a
deny-list. A routing or credential field (``base_url``, ``api_key``, ``model_list``,
``mock_response``... see :func:`is_routing_parameter`) gets its own message: where a request goes,
and with which key, is the operator's choice, never the client's.
:data:`COMPLETIONS_PARAMETERS` and :data:`EMBEDDINGS_PARAMETERS` are the same for the other two
endpoints. ``docs/openai-compatibility.md`` is the same table for users, and a test keeps the
three (the SDK, this table, the document) in step.

Validation (``proxy.http.validate``), the OpenAPI description, routing
(``proxy.routing.servable``: which requests the engine can serve) and the upstream client (what
is forwarded) all read these tables; this module imports nothing but ``proxy.errors``.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from proxy.errors import BadRequest

HONOURED, IGNORED, DEPENDS, API = "honoured", "ignored", "depends", "api"

CHAT_PARAMETERS: dict[str, str] = {
    "model": HONOURED,
    "messages": DEPENDS,  # text parts locally; image, audio and file parts go to the API
    "stream": HONOURED,
    "stream_options": HONOURED,
    "temperature": HONOURED,
    "top_p": HONOURED,
    "max_tokens": HONOURED,
    "max_completion_tokens": HONOURED,
    "stop": HONOURED,
    "seed": HONOURED,
    "n": HONOURED,
    "presence_penalty": HONOURED,
    "frequency_penalty": HONOURED,
    "logit_bias": DEPENDS,  # token ids are the local model's only with model "local"
    "logprobs": HONOURED,
    "top_logprobs": HONOURED,
    "response_format": HONOURED,
    "tools": DEPENDS,  # function tools locally; custom tools go to the API
    "tool_choice": DEPENDS,  # allowed_tools and custom choices go to the API
    "parallel_tool_calls": HONOURED,
    "functions": HONOURED,
    "function_call": HONOURED,
    "reasoning_effort": DEPENDS,  # none / minimal locally: the local model does not reason
    "verbosity": DEPENDS,  # medium (the default) locally
    "modalities": DEPENDS,  # ["text"] locally
    "audio": API,
    "web_search_options": API,
    "moderation": API,
    "prediction": IGNORED,
    "user": IGNORED,
    "safety_identifier": IGNORED,
    "store": IGNORED,
    "metadata": IGNORED,
    "service_tier": IGNORED,
    "prompt_cache_key": IGNORED,
    "prompt_cache_retention": IGNORED,
    "prompt_cache_options": IGNORED,
}

COMPLETIONS_PARAMETERS: dict[str, str] = {
    "model": HONOURED,
    "prompt": DEPENDS,  # text locally; token-id prompts go to the API (they are its tokens)
    "stream": HONOURED,
    "stream_options": HONOURED,
    "temperature": HONOURED,
    "top_p": HONOURED,
    "max_tokens": HONOURED,
    "stop": HONOURED,
    "seed": HONOURED,
    "n": HONOURED,
    "presence_penalty": HONOURED,
    "frequency_penalty": HONOURED,
    "logit_bias": DEPENDS,
    "logprobs": DEPENDS,  # with echo, prompt logprobs need the API
    "echo": HONOURED,
    "best_of": DEPENDS,  # 1 locally
    "suffix": API,
    "user": IGNORED,
}

EMBEDDINGS_PARAMETERS: dict[str, str] = {
    "model": API,
    "input": API,
    "encoding_format": API,
    "dimensions": API,
    "user": API,
}

# Keys of litellm's (or a provider SDK's) own that choose where a request goes, with which
# credentials, or what is answered without asking anyone. None is an OpenAI parameter; a body
# that carries one is refused with its own message. Any other unknown key is refused too.
ROUTING_PARAMETERS = frozenset(
    {
        "api_base",
        "api_key",
        "api_version",
        "azure_ad_token",
        "azure_ad_token_provider",
        "azure_username",
        "azure_password",
        "base_url",
        "cache",
        "caching",
        "client",
        "client_id",
        "client_secret",
        "context_window_fallback_dict",
        "context_window_fallbacks",
        "custom_llm_provider",
        "default_headers",
        "deployment_id",
        "drop_params",
        "extra_body",
        "extra_headers",
        "extra_query",
        "fallbacks",
        "headers",
        "http_client",
        "input_cost_per_second",
        "input_cost_per_token",
        "litellm_call_id",
        "litellm_logging_obj",
        "litellm_metadata",
        "litellm_params",
        "logger_fn",
        "max_retries",
        "mock_response",
        "mock_tool_calls",
        "mock_timeout",
        "mock_delay",
        "model_info",
        "model_list",
        "num_retries",
        "organization",
        "output_cost_per_second",
        "output_cost_per_token",
        "project",
        "proxy_server_request",
        "region_name",
        "request_timeout",
        "retry_policy",
        "tenant_id",
        "timeout",
        "use_litellm_proxy",
    }
)
ROUTING_PREFIXES = ("aws_", "vertex_", "azure_", "litellm_", "watsonx_", "mock_")

MAX_SHOWN = 128  # characters of a client's key quoted back in an error


def unknown_parameters(body: dict[str, Any], table: Collection[str]) -> list[str]:
    return sorted(k for k in body if k not in table)


def is_routing_parameter(name: str) -> bool:
    """Whether ``name`` is a key that would choose the upstream, its key or a canned answer."""
    return name in ROUTING_PARAMETERS or name.startswith(ROUTING_PREFIXES)


def _shown(name: str) -> str:
    """A client's key as it may appear in an error: short and printable."""
    if len(name) <= MAX_SHOWN and name.isprintable():
        return name
    return ascii(name[:MAX_SHOWN])[1:-1] + ("..." if len(name) > MAX_SHOWN else "")


def check_parameters(body: dict[str, Any], table: Collection[str]) -> None:
    """Refuse a body with a key outside ``table``: a 400 naming it, routing keys first."""
    unknown = [k for k in body if k not in table]
    if not unknown:
        return
    routing = [k for k in unknown if is_routing_parameter(k)]
    if routing:
        name = _shown(routing[0])
        raise BadRequest(
            f"'{name}' is not accepted: the proxy's configuration chooses the upstream API, its "
            "credentials and its options, not the request",
            param=name,
            code="unsupported_parameter",
        )
    name = _shown(unknown[0])
    raise BadRequest(
        f"Unrecognized request argument supplied: {name}", param=name, code="unknown_parameter"
    )


def forwarded(body: dict[str, Any], table: Collection[str]) -> dict[str, Any]:
    """The body to send upstream: the keys of the allow-list ``table`` that ``body`` sets."""
    return {k: v for k, v in body.items() if k in table}
