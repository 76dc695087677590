"""``/v1/responses``' parameter table: the rows of OpenAI's Responses request, read as
:mod:`proxy.protocol.params`' chat rows are (validation, the OpenAPI request schema, the
upstream's allow-list), and the parameters of OpenAI's that are not served yet.

A Responses request is translated to a chat request (:mod:`proxy.protocol.responses_translate`),
which the cascade answers; a row's ``handling`` is what that chat request gets, and the rows it
shares with chat are chat's own. The names of :data:`RESPONSES_NOT_YET` are OpenAI's too, but
not served yet: a 400 that says so, never an unknown-field error.
"""

from __future__ import annotations

from proxy.protocol.params import (
    CHAT,
    DEPENDS,
    HONOURED,
    ID_CHARS,
    IGNORED,
    Param,
    handling_of,
    model_param,
)

_CHAT_ROWS = {p.name: p for p in CHAT}
RESPONSES: tuple[Param, ...] = (
    model_param("The model asked for, as for chat. At most 256 printable characters."),
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
        name="background",
        handling=HONOURED,
        doc="true: answered at once with a `queued` response, run afterwards as deferred work "
        "(local first, with `[batch] flex_timeout_s` as its deadline, then the API); poll it "
        "with GET /v1/responses/{id}, cancel it with POST /v1/responses/{id}/cancel. Needs "
        "`store` (false is a 400 naming `store`).",
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
    "reasoning": "the local model does not reason, and the fallback is Chat Completions "
    '([fallback] responses = "translate")',
    "prompt": "stored prompt templates are OpenAI's own",
    "max_tool_calls": "built-in tools are not served by Chat Completions",
    "top_logprobs": "logprobs are not in Responses answers yet",
    "access_programs": "it is OpenAI's own",
    "background_options": "background responses take no options",
    "context_management": "the fallback is Chat Completions",
    "image": "image output is not served",
    "moderation": "the fallback is Chat Completions",
    "prompt_cache_options": "the fallback is Chat Completions",
}

RESPONSES_PARAMETERS: dict[str, str] = handling_of(RESPONSES)
