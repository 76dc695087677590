"""The one description of OpenAI's request bodies: every parameter, its JSON shape, and what the
local route does with it. Data (hence over 400 lines), but for the allow-list's four small
functions at the end.

Each endpoint's request is a tuple of :class:`Param` rows (:data:`CHAT`, :data:`COMPLETIONS`,
:data:`EMBEDDINGS`, :data:`RESPONSES`, whose :data:`RESPONSES_NOT_YET` names OpenAI's
parameters that are not served yet) plus the :class:`Rule` rows that join two fields
(:data:`CHAT_RULES`, :data:`COMPLETIONS_RULES`). A row says, for one parameter:

- its JSON ``type`` (``number``, ``integer``, ``boolean``, ``string``, ``object``, ``array``; a
  nested value of several types lists them all), and whether it is ``required``;
- its bounds (``low``, ``high``) or ``enum``, for a scalar; for a string, the most characters
  it may have (``max_chars``: an identifier the client makes up, such as ``user``, is
  :data:`ID_CHARS` at most, as OpenAI's own limit, so that no free-text field carries
  megabytes into logs, the ledger or a stored response);
- for a nested value (messages, tools, response_format...), the name of its ``shape``:
  ``proxy.protocol.shapes`` holds that shape's JSON-Schema fragment once, and the hand-written check
  in ``proxy.protocol.validate`` reads its limits from the same place;
- its ``handling`` on the local route (the API route forwards it unchanged):

  - ``honoured``: the local engine does what the parameter asks.
  - ``ignored``: accepted and ignored on the local route, because it cannot change the answer
    (billing, caching, storage and abuse-tracking hints meant for the provider).
  - ``depends``: honoured for some values; the others send the request to the API.
  - ``api``: a request that sets it goes to the API (pre-route reason ``unsupported``).

- a one-line ``doc`` for users.

From these rows ``proxy.protocol.request_schema`` generates the OpenAPI request schemas, and
``proxy.protocol.validate`` drives its checks (types, ranges, enums, required fields, the rules);
``proxy.routing.servable`` reads the handling (which requests the engine can serve) and the
upstream client the names (what is forwarded). :data:`CHAT_PARAMETERS` (and the two others) is
the ``{name: handling}`` view those read. ``docs/openai-compatibility.md`` is the same table for
users, and tests keep the SDK, this table, the OpenAPI document and the doc in step.

The names are also allow-lists: :func:`check_parameters` refuses any other key with a 400 that
names it, as OpenAI does ("Unrecognized request argument supplied"), and :func:`forwarded` builds
the body sent upstream from the table's keys only, never from the client's dict minus a
deny-list. A routing or credential field (``base_url``, ``api_key``, ``model_list``,
``mock_response``... see :func:`is_routing_parameter`) gets its own message: where a request goes,
and with which key, is the operator's choice, never the client's.

This module imports nothing but ``proxy.errors``.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from proxy.errors import BadRequest

HONOURED, IGNORED, DEPENDS, API = "honoured", "ignored", "depends", "api"

MAX_N = 128  # answers per request, on either route
ID_CHARS = 64  # an identifier the client makes up (user, safety_identifier...): OpenAI's limit
LOCAL_ALIAS = "local"  # the model name that means the local model only, never the API


@dataclass(frozen=True, kw_only=True, slots=True)
class Param:
    """One request parameter: its JSON shape, its local handling and a line for users."""

    name: str
    handling: str
    doc: str
    type: str | tuple[str, ...]
    required: bool = False
    low: float | None = None
    high: float | None = None
    enum: tuple[str, ...] = ()
    max_chars: int | None = None
    shape: str | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class Rule:
    """Two fields joined: when ``name`` is set, ``other`` must be set (``needs``) or not."""

    name: str
    other: str
    needs: bool
    message: str


def _num(name: str, low: float, high: float, doc: str) -> Param:
    return Param(name=name, handling=HONOURED, doc=doc, type="number", low=low, high=high)


SAMPLING: tuple[Param, ...] = (
    _num("temperature", 0, 2, "Sampling temperature; the local default is greedy (0)."),
    _num("top_p", 0, 1, "Nucleus sampling."),
    _num("presence_penalty", -2, 2, "Penalty for tokens already present."),
    _num("frequency_penalty", -2, 2, "Penalty by token frequency."),
    Param(
        name="n",
        handling=HONOURED,
        doc="How many answers to generate; up to 8 locally, more go to the API.",
        type="integer",
        low=1,
        high=MAX_N,
    ),
    Param(
        name="max_tokens",
        handling=HONOURED,
        doc="The most tokens the answer may have.",
        type="integer",
        low=1,
    ),
    Param(
        name="seed",
        handling=HONOURED,
        doc="Seed for sampling: same seed, same request, same local answer.",
        type="integer",
        low=-(2**63),
        high=2**63 - 1,
    ),
    Param(name="stream", handling=HONOURED, doc="Answer as server-sent events.", type="boolean"),
    Param(
        name="stop",
        handling=HONOURED,
        doc="A string, or up to 4, where the answer stops.",
        type=("string", "array"),
        shape="stop",
    ),
    Param(
        name="stream_options",
        handling=HONOURED,
        doc="include_usage: a final chunk with the token counts. Only with `stream: true`.",
        type="object",
        shape="stream_options",
    ),
    Param(
        name="logit_bias",
        handling=DEPENDS,  # token ids are the local model's only with model "local"
        doc="Token ids of the model's own tokenizer: applied locally only with the model "
        "`local`; otherwise the request goes to the API.",
        type="object",
        shape="logit_bias",
    ),
    Param(
        name="user",
        handling=IGNORED,
        doc=f"An end-user id of at most {ID_CHARS} characters; ignored locally, forwarded to "
        "the API.",
        type="string",
        max_chars=ID_CHARS,
    ),
)


def _model(doc: str, handling: str = HONOURED) -> Param:
    return Param(
        name="model", handling=handling, doc=doc, type="string", required=True, shape="model"
    )


def _api_object(name: str, doc: str) -> Param:
    return Param(name=name, handling=API, doc=doc, type="object")


def _ignored(name: str, kind: str, doc: str = "Ignored locally, forwarded to the API.") -> Param:
    return Param(name=name, handling=IGNORED, doc=doc, type=kind)


def _ignored_id(name: str) -> Param:
    """A string the provider reads (a cache key, a tier, an end user's id): at most
    :data:`ID_CHARS` characters."""
    return Param(
        name=name,
        handling=IGNORED,
        doc=f"At most {ID_CHARS} characters; ignored locally, forwarded to the API.",
        type="string",
        max_chars=ID_CHARS,
    )


CHAT: tuple[Param, ...] = (
    _model(
        "The model asked for: the API fallback's target and the price that savings are counted "
        "against. `local` means the local model only. At most 256 printable characters."
    ),
    Param(
        name="messages",
        handling=DEPENDS,  # text parts locally; image, audio and file parts go to the API
        doc="The conversation. Text parts are answered locally; image, audio and file parts go "
        "to the API.",
        type="array",
        required=True,
        shape="messages",
    ),
    *SAMPLING,
    Param(
        name="max_completion_tokens",
        handling=HONOURED,
        doc="Same as max_tokens.",
        type="integer",
        low=1,
    ),
    Param(name="logprobs", handling=HONOURED, doc="Each token's logprob.", type="boolean"),
    Param(
        name="top_logprobs",
        handling=HONOURED,
        doc="The most likely tokens at each position; needs `logprobs: true`.",
        type="integer",
        low=0,
        high=20,
    ),
    Param(
        name="response_format",
        handling=HONOURED,
        doc="JSON mode: locally, a grammar built from the schema constrains the answer.",
        type="object",
        shape="response_format",
    ),
    Param(
        name="tools",
        handling=DEPENDS,  # function tools locally; custom tools go to the API
        doc="Function tools are called locally; custom tools go to the API.",
        type="array",
        shape="tools",
    ),
    Param(
        name="functions",
        handling=HONOURED,
        doc="Deprecated form of `tools`; not with `tools`.",
        type="array",
        shape="functions",
    ),
    Param(
        name="tool_choice",
        handling=DEPENDS,  # allowed_tools and custom choices go to the API
        doc="Only with `tools`; a named function must be one of them.",
        type=("string", "object"),
        shape="tool_choice",
    ),
    Param(
        name="parallel_tool_calls",
        handling=HONOURED,
        doc="Not false: a local answer may make up to 8 calls, each with its own id; false: one.",
        type="boolean",
    ),
    Param(
        name="function_call",
        handling=HONOURED,
        doc="Deprecated form of `tool_choice`; only with `functions`.",
        type=("string", "object"),
        shape="function_call",
    ),
    Param(
        name="modalities",
        handling=DEPENDS,  # ["text"] locally
        doc='["text"] is answered locally; audio output by the API.',
        type="array",
        shape="modalities",
    ),
    _api_object("audio", "Audio output: the API answers."),
    _api_object("web_search_options", "Web search: the API answers."),
    _api_object("moderation", "Moderation: the API answers."),
    _ignored("prediction", "object", "Predicted output: ignored locally, forwarded to the API."),
    _ignored("prompt_cache_options", "object"),
    Param(
        name="reasoning_effort",
        handling=DEPENDS,  # none / minimal locally; the others when the local model thinks
        doc="none and minimal are answered locally; the others locally when the local model "
        "thinks (within [local] thinking_budget), else by the API.",
        type="string",
        max_chars=ID_CHARS,
    ),
    Param(
        name="verbosity",
        handling=DEPENDS,  # medium (the default) locally
        doc="medium is answered locally; others by the API.",
        type="string",
        max_chars=ID_CHARS,
    ),
    _ignored_id("service_tier"),
    _ignored_id("prompt_cache_key"),
    _ignored_id("prompt_cache_retention"),
    _ignored_id("safety_identifier"),
    _ignored("store", "boolean", "Whether the provider stores the answer; ignored locally."),
    Param(
        name="metadata",
        handling=IGNORED,
        doc="Tags for stored completions: at most 16 keys of 64 characters, values of 512.",
        type="object",
        shape="metadata",
    ),
)

CHAT_RULES: tuple[Rule, ...] = (
    Rule(
        name="stream_options",
        other="stream",
        needs=True,
        message="'stream_options' is only allowed when 'stream' is true",
    ),
    Rule(
        name="top_logprobs",
        other="logprobs",
        needs=True,
        message="'top_logprobs' requires 'logprobs' to be true",
    ),
    Rule(
        name="functions",
        other="tools",
        needs=False,
        message="use either 'tools' or 'functions', not both",
    ),
    Rule(
        name="tool_choice",
        other="tools",
        needs=True,
        message="'tool_choice' is only allowed when 'tools' are specified",
    ),
    Rule(
        name="function_call",
        other="functions",
        needs=True,
        message="'function_call' is only allowed when 'functions' are specified",
    ),
)

COMPLETIONS: tuple[Param, ...] = (
    _model("The model asked for, as for chat. At most 256 printable characters."),
    Param(
        name="prompt",
        handling=DEPENDS,  # text locally; token-id prompts go to the API (they are its tokens)
        doc="Text, or token ids (answered by the API, except for the model `local`).",
        type=("string", "array"),
        required=True,
        shape="prompt",
    ),
    *SAMPLING,
    Param(
        name="logprobs",
        handling=DEPENDS,  # with echo, prompt logprobs need the API
        doc="Logprobs of the most likely tokens at each position.",
        type="integer",
        low=0,
        high=5,
    ),
    Param(
        name="best_of",
        handling=DEPENDS,  # 1 locally
        doc="At least n; above 1 the API answers. Not with stream.",
        type="integer",
        low=1,
        high=20,
    ),
    Param(
        name="echo",
        handling=HONOURED,
        doc="Put the prompt back in front of the answer.",
        type="boolean",
    ),
    Param(
        name="suffix",
        handling=API,
        doc="Text after the completion: the API answers.",
        type="string",
    ),
)

COMPLETIONS_RULES: tuple[Rule, ...] = CHAT_RULES[:1]

EMBEDDINGS: tuple[Param, ...] = (
    _model("At most 256 printable characters.", API),
    Param(
        name="input",
        handling=API,
        doc="A string, strings, token ids or lists of token ids; none of them empty.",
        type=("string", "array"),
        required=True,
        shape="input",
    ),
    Param(
        name="encoding_format",
        handling=API,
        doc="How the vectors are written.",
        type="string",
        enum=("float", "base64"),
    ),
    Param(name="dimensions", handling=API, doc="Output dimensions.", type="integer", low=1),
    Param(
        name="user",
        handling=API,
        doc=f"At most {ID_CHARS} characters; forwarded to the API.",
        type="string",
        max_chars=ID_CHARS,
    ),
)


# /v1/responses: translated to a chat request (proxy.protocol.responses_translate), which the
# cascade answers; ``handling`` is what that chat request gets. The names of RESPONSES_NOT_YET are
# OpenAI's too, but not served yet: a 400 that says so, never an unknown-field error.
_CHAT_ROWS = {p.name: p for p in CHAT}
RESPONSES: tuple[Param, ...] = (
    _model("The model asked for, as for chat. At most 256 printable characters."),
    Param(
        name="input",
        handling=DEPENDS,  # text messages and function items; images and other items: 400
        doc="A string (one user message), or a list of items: messages with text parts, "
        "`function_call` and `function_call_output` items.",
        type=("string", "array"),
        required=True,
        shape="responses_input",
    ),
    Param(
        name="instructions",
        handling=HONOURED,
        doc="A system message put before the input.",
        type="string",
    ),
    Param(
        name="max_output_tokens",
        handling=HONOURED,
        doc="The most tokens the answer may have; an answer cut by it is `incomplete`.",
        type="integer",
        low=1,
    ),
    *(_CHAT_ROWS[name] for name in ("temperature", "top_p")),
    Param(
        name="tools",
        handling=HONOURED,
        doc="Function tools, in the Responses' flat shape; a built-in tool sends the request to "
        "the API's own /v1/responses (a 400 with [fallback] responses = translate).",
        type="array",
        shape="responses_tools",
    ),
    Param(
        name="tool_choice",
        handling=HONOURED,
        doc="none, auto, required, or `{type: function, name}` naming one of the tools.",
        type=("string", "object"),
        shape="responses_tool_choice",
    ),
    _CHAT_ROWS["parallel_tool_calls"],
    Param(
        name="text",
        handling=HONOURED,
        doc="format: text, json_object, or json_schema (name, schema, strict); verbosity.",
        type="object",
        shape="responses_text",
    ),
    Param(name="stream", handling=HONOURED, doc="Answer as typed events.", type="boolean"),
    Param(
        name="stream_options",
        handling=IGNORED,
        doc="include_obfuscation: accepted and ignored (no obfuscation events are sent).",
        type="object",
        shape="responses_stream_options",
    ),
    Param(
        name="metadata",
        handling=IGNORED,
        doc="Tags echoed in the response: at most 16 keys of 64 characters, values of 512.",
        type="object",
        shape="metadata",
    ),
    Param(
        name="client_metadata",
        handling=IGNORED,
        doc="The client's own tags (Codex CLI sends them): at most 16 keys of 64 characters, "
        "values of 4,096; ignored locally, sent to the API's own /v1/responses.",
        type="object",
        shape="client_metadata",
    ),
    _CHAT_ROWS["user"],
    Param(
        name="store",
        handling=HONOURED,
        doc="true (the default): the response and its input items are kept in the ledger "
        "database, for `previous_response_id` and GET /v1/responses/{id}; false: not kept.",
        type="boolean",
    ),
    Param(
        name="previous_response_id",
        handling=HONOURED,
        doc="A stored response of the same key to continue: its conversation (every earlier "
        f"turn's input and output items) comes before `input`. At most {ID_CHARS} characters.",
        type="string",
        max_chars=ID_CHARS,
    ),
    Param(
        name="truncation",
        handling=IGNORED,
        doc="Accepted; an input too long for the model is a 400 or goes to the API either way.",
        type="string",
        enum=("auto", "disabled"),
    ),
    Param(
        name="include",
        handling=IGNORED,
        doc="Accepted and ignored: no extra output data is included.",
        type="array",
        shape="responses_include",
    ),
    *(_CHAT_ROWS[name] for name in ("service_tier", "prompt_cache_key", "prompt_cache_retention")),
    _CHAT_ROWS["safety_identifier"],
)

RESPONSES_NOT_YET: dict[str, str] = {
    "conversation": "conversations are not served: use previous_response_id, or send the whole "
    "conversation in 'input'",
    "background": "background responses need stored responses",
    "reasoning": "the local model does not reason, and the fallback is Chat Completions "
    '([fallback] responses = "translate")',
    "prompt": "stored prompt templates are OpenAI's own",
    "max_tool_calls": "built-in tools are not served by Chat Completions",
    "top_logprobs": "logprobs are not in Responses answers yet",
    "access_programs": "it is OpenAI's own",
    "background_options": "background responses need stored responses",
    "context_management": "the fallback is Chat Completions",
    "image": "image output is not served",
    "moderation": "the fallback is Chat Completions",
    "prompt_cache_options": "the fallback is Chat Completions",
}


def handling_of(table: tuple[Param, ...]) -> dict[str, str]:
    """``{name: handling}`` of a table, in its order."""
    return {p.name: p.handling for p in table}


CHAT_PARAMETERS: dict[str, str] = handling_of(CHAT)
COMPLETIONS_PARAMETERS: dict[str, str] = handling_of(COMPLETIONS)
EMBEDDINGS_PARAMETERS: dict[str, str] = handling_of(EMBEDDINGS)
RESPONSES_PARAMETERS: dict[str, str] = handling_of(RESPONSES)

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
