"""The one description of OpenAI's request bodies: every parameter, its JSON shape, and what the
local route does with it. Data, but for the row helpers.

Each endpoint's request is a tuple of :class:`Param` rows (:data:`CHAT`, :data:`COMPLETIONS`,
:data:`EMBEDDINGS`; ``/v1/responses``' own rows are :mod:`proxy.protocol.responses_params`)
plus the :class:`Rule` rows that join two fields (:data:`CHAT_RULES`,
:data:`COMPLETIONS_RULES`). A row says, for one parameter:

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

The names are also allow-lists (:mod:`proxy.protocol.forwarding`): any other key is refused
with a 400 that names it, and the body sent upstream is built from the table's keys only.

This module imports nothing but ``proxy.errors``.
"""

from __future__ import annotations

from dataclasses import dataclass

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


def model_param(doc: str, handling: str = HONOURED) -> Param:
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


SERVICE_TIER = Param(
    name="service_tier",
    handling=HONOURED,
    doc=f"At most {ID_CHARS} characters, forwarded to the API. `flex` is deferred work: the "
    "local model gets `[batch] flex_timeout_s` to answer, and the request is priced at the "
    "flex rate.",
    type="string",
    max_chars=ID_CHARS,
)
"""The provider's processing tier; ``flex`` gives the local attempt the long deadline of
deferred work (:mod:`proxy.routing.router`)."""


CHAT: tuple[Param, ...] = (
    model_param(
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
    SERVICE_TIER,
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
    model_param("The model asked for, as for chat. At most 256 printable characters."),
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
    SERVICE_TIER,
)

COMPLETIONS_RULES: tuple[Rule, ...] = CHAT_RULES[:1]

EMBEDDINGS: tuple[Param, ...] = (
    model_param("At most 256 printable characters.", API),
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


def handling_of(table: tuple[Param, ...]) -> dict[str, str]:
    """``{name: handling}`` of a table, in its order."""
    return {p.name: p.handling for p in table}


CHAT_PARAMETERS: dict[str, str] = handling_of(CHAT)
COMPLETIONS_PARAMETERS: dict[str, str] = handling_of(COMPLETIONS)
EMBEDDINGS_PARAMETERS: dict[str, str] = handling_of(EMBEDDINGS)
