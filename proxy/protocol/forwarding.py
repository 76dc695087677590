"""The parameter tables as allow-lists: a body with a key outside its endpoint's table is
refused with a 400 that names it, as OpenAI does ("Unrecognized request argument supplied"), and
the body sent upstream is built from the table's keys only (:func:`forwarded`), never from the
client's dict minus a deny-list. A routing or credential field (``base_url``, ``api_key``,
``model_list``, ``mock_response``... see :func:`is_routing_parameter`) gets its own message:
where a request goes, and with which key, is the operator's choice, never the client's.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from proxy.errors import BadRequest

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
