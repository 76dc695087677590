"""Cheap validation of OpenAI request bodies: chat completions, legacy completions, embeddings.

The body is parsed once, checked here in plain Python (no schema library on the hot path), and
passed on as the same dict: the API route forwards it unchanged. Every failure is a
:class:`BadRequest` whose ``param`` names the field in OpenAI's style, e.g. ``messages[2].role``.

Only what a request's *shape* can get wrong is checked here, and first which keys it has: a key
outside the endpoint's allow-list in :mod:`proxy.params` (a routing field such as ``base_url``,
a vendor extension such as ``top_k``, a typo) is a 400 naming it. Which parameters the local
engine honours, and which send a request to the API, is :mod:`proxy.params` too.

The model name is at most :data:`MAX_MODEL_CHARS` printable characters (no control characters,
no line breaks): it is logged, stored in the ledger and shown in reports.
"""

from __future__ import annotations

import json
import re
from typing import Any

from proxy.errors import BadRequest
from proxy.params import (
    CHAT_PARAMETERS,
    COMPLETIONS_PARAMETERS,
    EMBEDDINGS_PARAMETERS,
    check_parameters,
    unknown_parameters,
)

__all__ = [
    "MAX_MODEL_CHARS",
    "PART_TYPES",
    "ROLES",
    "chat_request",
    "completions_request",
    "embeddings_request",
    "parse_json",
    "unknown_parameters",
]

ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
PART_TYPES = frozenset({"text", "image_url", "input_audio", "file", "refusal", "input_text"})
TOOL_CHOICES = ("none", "auto", "required")
NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
MAX_N = 128
MAX_STOP = 4
MAX_MODEL_CHARS = 256


def parse_json(raw: bytes) -> dict[str, Any]:
    if not raw.strip():
        raise BadRequest("the request body is empty; expected a JSON object", code="invalid_json")
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise BadRequest(
            f"the request body is not valid JSON ({exc.__class__.__name__})", code="invalid_json"
        ) from exc
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object", code="invalid_json")
    return body


# -- small checks ----------------------------------------------------------------------------


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


def _number(body: dict[str, Any], name: str, low: float, high: float) -> None:
    value = body.get(name)
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise BadRequest(f"'{name}' must be a number, got {_kind(value)}", param=name)
    if not low <= value <= high:
        raise BadRequest(f"'{name}' must be between {low} and {high}, got {value}", param=name)


def _integer(body: dict[str, Any], name: str, low: int, high: int | None = None) -> None:
    value = body.get(name)
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest(f"'{name}' must be an integer, got {_kind(value)}", param=name)
    if value < low or (high is not None and value > high):
        bound = f"between {low} and {high}" if high is not None else f"at least {low}"
        raise BadRequest(f"'{name}' must be {bound}, got {value}", param=name)


def _boolean(body: dict[str, Any], name: str, where: str | None = None) -> None:
    value = body.get(name)
    if value is not None and not isinstance(value, bool):
        where = where or name
        raise BadRequest(f"'{where}' must be true or false, got {_kind(value)}", param=where)


def _string(body: dict[str, Any], name: str, where: str | None = None) -> None:
    value = body.get(name)
    if value is not None and not isinstance(value, str):
        where = where or name
        raise BadRequest(f"'{where}' must be a string, got {_kind(value)}", param=where)


def _object(body: dict[str, Any], name: str, where: str | None = None) -> dict[str, Any] | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, dict):
        where = where or name
        raise BadRequest(f"'{where}' must be an object, got {_kind(value)}", param=where)
    return value


def _choice(body: dict[str, Any], name: str, allowed: tuple[str, ...]) -> None:
    value = body.get(name)
    if value is not None and value not in allowed:
        raise BadRequest(f"'{name}' must be one of {', '.join(allowed)}, got {value!r}", param=name)


def _model(body: dict[str, Any]) -> None:
    model = body.get("model")
    if model is None:
        raise BadRequest("'model' is required", param="model", code="missing_required")
    if not isinstance(model, str) or not model.strip():
        raise BadRequest("'model' must be a non-empty string", param="model")
    if len(model) > MAX_MODEL_CHARS:
        raise BadRequest(
            f"'model' must be at most {MAX_MODEL_CHARS} characters, got {len(model)}",
            param="model",
        )
    if not model.isprintable():
        raise BadRequest(
            "'model' must hold printable characters only (no control characters or line breaks)",
            param="model",
        )


def _stop(body: dict[str, Any]) -> None:
    stop = body.get("stop")
    if stop is None or isinstance(stop, str):
        return
    if isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        if len(stop) > MAX_STOP:
            raise BadRequest(f"'stop' may hold at most {MAX_STOP} sequences", param="stop")
        return
    raise BadRequest("'stop' must be a string or a list of strings", param="stop")


def _stream_options(body: dict[str, Any]) -> None:
    options = _object(body, "stream_options")
    if options is None:
        return
    if not body.get("stream"):
        raise BadRequest(
            "'stream_options' is only allowed when 'stream' is true", param="stream_options"
        )
    for key in ("include_usage", "include_obfuscation"):
        _boolean(options, key, f"stream_options.{key}")


def _logit_bias(body: dict[str, Any]) -> None:
    bias = _object(body, "logit_bias")
    if bias is None:
        return
    for key, value in bias.items():
        if not key.isdigit() or len(key) > 9:
            raise BadRequest(
                f"'logit_bias' keys must be token ids (non-negative integers), got {key!r}",
                param="logit_bias",
            )
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise BadRequest("'logit_bias' values must be numbers", param="logit_bias")
        if not -100 <= value <= 100:
            raise BadRequest("'logit_bias' values must be between -100 and 100", param="logit_bias")


def _sampling(body: dict[str, Any]) -> None:
    """What chat and legacy completions share."""
    _number(body, "temperature", 0, 2)
    _number(body, "top_p", 0, 1)
    _number(body, "presence_penalty", -2, 2)
    _number(body, "frequency_penalty", -2, 2)
    _integer(body, "n", 1, MAX_N)
    _integer(body, "max_tokens", 1)
    _integer(body, "seed", -(2**63), 2**63 - 1)
    _boolean(body, "stream")
    _stop(body)
    _stream_options(body)
    _logit_bias(body)
    _string(body, "user")


# -- chat completions ------------------------------------------------------------------------


def _content(content: Any, where: str, role: str, may_be_empty: bool) -> None:
    if content is None:
        if may_be_empty:
            return
        raise BadRequest(f"'{where}' is required for role '{role}'", param=where)
    if isinstance(content, str):
        return
    if not isinstance(content, list):
        raise BadRequest(f"'{where}' must be a string or a list of content parts", param=where)
    for j, part in enumerate(content):
        part_where = f"{where}[{j}]"
        if not isinstance(part, dict):
            raise BadRequest(f"'{part_where}' must be an object", param=part_where)
        kind = part.get("type")
        if not isinstance(kind, str) or kind not in PART_TYPES:
            raise BadRequest(
                f"'{part_where}.type' must be one of {', '.join(sorted(PART_TYPES))}, got {kind!r}",
                param=f"{part_where}.type",
            )
        if kind in ("text", "input_text") and not isinstance(part.get("text"), str):
            raise BadRequest(f"'{part_where}.text' must be a string", param=f"{part_where}.text")
        if kind == "refusal" and not isinstance(part.get("refusal"), str):
            raise BadRequest(
                f"'{part_where}.refusal' must be a string", param=f"{part_where}.refusal"
            )
        if kind == "image_url":
            image = part.get("image_url")
            if not isinstance(image, dict) or not isinstance(image.get("url"), str):
                raise BadRequest(
                    f"'{part_where}.image_url.url' is required", param=f"{part_where}.image_url"
                )


def _tool_calls(calls: Any, where: str) -> None:
    if calls is None:
        return
    if not isinstance(calls, list):
        raise BadRequest(f"'{where}' must be a list", param=where)
    for k, call in enumerate(calls):
        at = f"{where}[{k}]"
        if not isinstance(call, dict):
            raise BadRequest(f"'{at}' must be an object", param=at)
        if not isinstance(call.get("id"), str):
            raise BadRequest(f"'{at}.id' is required", param=f"{at}.id")
        kind = call.get("type", "function")
        if kind == "custom":
            custom = call.get("custom")
            if not isinstance(custom, dict) or not isinstance(custom.get("name"), str):
                raise BadRequest(f"'{at}.custom.name' is required", param=f"{at}.custom")
            continue
        if kind != "function":
            raise BadRequest(
                f"'{at}.type' must be 'function' or 'custom', got {kind!r}", param=f"{at}.type"
            )
        fn = call.get("function")
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise BadRequest(f"'{at}.function.name' is required", param=f"{at}.function.name")
        if not isinstance(fn.get("arguments"), str):
            raise BadRequest(
                f"'{at}.function.arguments' must be a string of JSON",
                param=f"{at}.function.arguments",
            )


def _messages(messages: Any) -> None:
    if messages is None:
        raise BadRequest("'messages' is required", param="messages", code="missing_required")
    if not isinstance(messages, list):
        raise BadRequest("'messages' must be a list of message objects", param="messages")
    if not messages:
        raise BadRequest("'messages' must contain at least one message", param="messages")
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise BadRequest(f"'{where}' must be an object", param=where)
        role = message.get("role")
        if not isinstance(role, str) or role not in ROLES:
            raise BadRequest(
                f"'{where}.role' must be one of {', '.join(sorted(ROLES))}, got {role!r}",
                param=f"{where}.role",
            )
        _string(message, "name", f"{where}.name")
        _tool_calls(message.get("tool_calls"), f"{where}.tool_calls")
        fn_call = message.get("function_call")
        if fn_call is not None and (
            not isinstance(fn_call, dict) or not isinstance(fn_call.get("name"), str)
        ):
            raise BadRequest(
                f"'{where}.function_call' must be an object with a 'name'",
                param=f"{where}.function_call",
            )
        # An assistant turn may carry only tool calls (or a refusal, or audio) and no content.
        _content(message.get("content"), f"{where}.content", role, role == "assistant")
        if role == "tool" and not isinstance(message.get("tool_call_id"), str):
            raise BadRequest(
                f"'{where}.tool_call_id' is required for role 'tool'",
                param=f"{where}.tool_call_id",
            )
        if role == "function" and not isinstance(message.get("name"), str):
            raise BadRequest(
                f"'{where}.name' is required for role 'function'", param=f"{where}.name"
            )


def _schema(schema: Any, where: str) -> None:
    from quality import check_schema

    problem = check_schema(schema)
    if problem is not None:
        raise BadRequest(f"'{where}' is not a valid JSON Schema: {problem}", param=where)


def _response_format(body: dict[str, Any]) -> None:
    fmt = body.get("response_format")
    if fmt is None:
        return
    kinds = ("text", "json_object", "json_schema")
    if not isinstance(fmt, dict) or fmt.get("type") not in kinds:
        raise BadRequest(
            "'response_format.type' must be one of text, json_object, json_schema",
            param="response_format.type",
        )
    if fmt["type"] != "json_schema":
        return
    spec = fmt.get("json_schema")
    if not isinstance(spec, dict):
        raise BadRequest(
            "'response_format.json_schema' is required when the type is json_schema",
            param="response_format.json_schema",
        )
    name = spec.get("name")
    if not isinstance(name, str) or not NAME.match(name):
        raise BadRequest(
            "'response_format.json_schema.name' must be 1 to 64 letters, digits, '_' or '-'",
            param="response_format.json_schema.name",
        )
    _boolean(spec, "strict", "response_format.json_schema.strict")
    _string(spec, "description", "response_format.json_schema.description")
    if spec.get("schema") is not None:
        _schema(spec["schema"], "response_format.json_schema.schema")


def _function(fn: Any, where: str) -> None:
    if not isinstance(fn, dict):
        raise BadRequest(f"'{where}' must be an object", param=where)
    name = fn.get("name")
    if not isinstance(name, str) or not NAME.match(name):
        raise BadRequest(
            f"'{where}.name' must be 1 to 64 letters, digits, '_' or '-'", param=f"{where}.name"
        )
    _string(fn, "description", f"{where}.description")
    _boolean(fn, "strict", f"{where}.strict")
    params = fn.get("parameters")
    if params is not None:
        if not isinstance(params, dict):
            raise BadRequest(
                f"'{where}.parameters' must be a JSON Schema object", param=f"{where}.parameters"
            )
        _schema(params, f"{where}.parameters")


def _tools(body: dict[str, Any]) -> set[str]:
    """Check ``tools`` (and the deprecated ``functions``); returns the function names."""
    names: set[str] = set()
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            raise BadRequest("'tools' must be a list", param="tools")
        for i, tool in enumerate(tools):
            where = f"tools[{i}]"
            if not isinstance(tool, dict):
                raise BadRequest(f"'{where}' must be an object", param=where)
            kind = tool.get("type", "function")
            if kind == "custom":
                custom = tool.get("custom")
                if not isinstance(custom, dict) or not isinstance(custom.get("name"), str):
                    raise BadRequest(f"'{where}.custom.name' is required", param=f"{where}.custom")
                continue
            if kind != "function":
                raise BadRequest(
                    f"'{where}.type' must be 'function' or 'custom', got {kind!r}",
                    param=f"{where}.type",
                )
            if tool.get("function") is None:
                raise BadRequest(
                    f"'{where}.function.name' is required", param=f"{where}.function.name"
                )
            _function(tool.get("function"), f"{where}.function")
            names.add(tool["function"]["name"])
    functions = body.get("functions")
    if functions is not None:
        if not isinstance(functions, list) or not functions:
            raise BadRequest("'functions' must be a non-empty list", param="functions")
        for i, fn in enumerate(functions):
            _function(fn, f"functions[{i}]")
        if tools:
            raise BadRequest("use either 'tools' or 'functions', not both", param="functions")
    return names


def _tool_choice(body: dict[str, Any], names: set[str]) -> None:
    choice = body.get("tool_choice")
    if choice is not None:
        if not body.get("tools"):
            raise BadRequest(
                "'tool_choice' is only allowed when 'tools' are specified", param="tool_choice"
            )
        if isinstance(choice, str):
            if choice not in TOOL_CHOICES:
                raise BadRequest(
                    f"'tool_choice' must be one of none, auto, required or an object, "
                    f"got {choice!r}",
                    param="tool_choice",
                )
        elif not isinstance(choice, dict):
            raise BadRequest("'tool_choice' must be a string or an object", param="tool_choice")
        elif choice.get("type") == "function":
            fn = choice.get("function")
            name = fn.get("name") if isinstance(fn, dict) else None
            if not isinstance(name, str):
                raise BadRequest(
                    "'tool_choice.function.name' is required", param="tool_choice.function"
                )
            if name not in names:
                raise BadRequest(
                    f"'tool_choice' names the function {name!r}, which is not in 'tools'",
                    param="tool_choice",
                )
        elif choice.get("type") == "allowed_tools":
            allowed = choice.get("allowed_tools")
            if (
                not isinstance(allowed, dict)
                or allowed.get("mode") not in ("auto", "required")
                or not isinstance(allowed.get("tools"), list)
            ):
                raise BadRequest(
                    "'tool_choice.allowed_tools' needs a mode (auto or required) and a list of "
                    "tools",
                    param="tool_choice.allowed_tools",
                )
        elif choice.get("type") != "custom":
            raise BadRequest(
                "'tool_choice.type' must be function, allowed_tools or custom",
                param="tool_choice.type",
            )
    _boolean(body, "parallel_tool_calls")
    call = body.get("function_call")
    if call is not None:
        if not body.get("functions"):
            raise BadRequest(
                "'function_call' is only allowed when 'functions' are specified",
                param="function_call",
            )
        if isinstance(call, str):
            if call not in ("none", "auto"):
                raise BadRequest(
                    f"'function_call' must be none, auto or an object, got {call!r}",
                    param="function_call",
                )
        elif not isinstance(call, dict) or not isinstance(call.get("name"), str):
            raise BadRequest("'function_call' must have a 'name'", param="function_call")
        elif call["name"] not in {f["name"] for f in body["functions"]}:
            raise BadRequest(
                f"'function_call' names {call['name']!r}, which is not in 'functions'",
                param="function_call",
            )


def _api_only_shapes(body: dict[str, Any]) -> None:
    """Parameters only the API acts on: checked for type, values left to the API."""
    modalities = body.get("modalities")
    if modalities is not None and (
        not isinstance(modalities, list) or not all(m in ("text", "audio") for m in modalities)
    ):
        raise BadRequest("'modalities' must be a list of 'text' and 'audio'", param="modalities")
    for name in ("audio", "prediction", "web_search_options", "moderation"):
        _object(body, name)
    for name in ("prompt_cache_options",):
        _object(body, name)
    for name in (
        "reasoning_effort",
        "verbosity",
        "service_tier",
        "prompt_cache_key",
        "prompt_cache_retention",
        "safety_identifier",
    ):
        _string(body, name)
    _boolean(body, "store")
    metadata = _object(body, "metadata")
    if metadata is not None:
        if len(metadata) > 16:
            raise BadRequest("'metadata' may hold at most 16 keys", param="metadata")
        for key, value in metadata.items():
            if len(key) > 64 or not isinstance(value, str) or len(value) > 512:
                raise BadRequest(
                    "'metadata' maps keys of at most 64 characters to strings of at most 512",
                    param="metadata",
                )


def chat_request(body: dict[str, Any]) -> dict[str, Any]:
    """Check a chat-completions body; returns it unchanged or raises BadRequest."""
    check_parameters(body, CHAT_PARAMETERS)
    _model(body)
    _messages(body.get("messages"))
    _sampling(body)
    _integer(body, "max_completion_tokens", 1)
    _boolean(body, "logprobs")
    _integer(body, "top_logprobs", 0, 20)
    if body.get("top_logprobs") is not None and not body.get("logprobs"):
        raise BadRequest("'top_logprobs' requires 'logprobs' to be true", param="top_logprobs")
    _response_format(body)
    _tool_choice(body, _tools(body))
    _api_only_shapes(body)
    return body


# -- legacy completions ----------------------------------------------------------------------


def _prompt(prompt: Any) -> None:
    if prompt is None:
        raise BadRequest("'prompt' is required", param="prompt", code="missing_required")
    if isinstance(prompt, str):
        return
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, str) for p in prompt):
            return
        if all(isinstance(p, int) and not isinstance(p, bool) and p >= 0 for p in prompt):
            return
        if all(
            isinstance(p, list)
            and p
            and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in p)
            for p in prompt
        ):
            return
    raise BadRequest(
        "'prompt' must be a string, a list of strings, a list of token ids or a list of lists "
        "of token ids (none of them empty)",
        param="prompt",
    )


def completions_request(body: dict[str, Any]) -> dict[str, Any]:
    """Check a legacy ``/v1/completions`` body; returns it unchanged or raises BadRequest."""
    check_parameters(body, COMPLETIONS_PARAMETERS)
    _model(body)
    _prompt(body.get("prompt"))
    _sampling(body)
    _integer(body, "logprobs", 0, 5)
    _integer(body, "best_of", 1, 20)
    _boolean(body, "echo")
    _string(body, "suffix")
    best_of, n = body.get("best_of"), body.get("n")
    if best_of is not None and best_of < (n or 1):
        raise BadRequest("'best_of' must be at least 'n'", param="best_of")
    if best_of is not None and best_of > 1 and body.get("stream"):
        raise BadRequest("'best_of' cannot be used with 'stream'", param="best_of")
    return body


# -- embeddings ------------------------------------------------------------------------------


def embeddings_request(body: dict[str, Any]) -> dict[str, Any]:
    """Check a ``/v1/embeddings`` body; returns it unchanged or raises BadRequest."""
    check_parameters(body, EMBEDDINGS_PARAMETERS)
    _model(body)
    data = body.get("input")
    if data is None:
        raise BadRequest("'input' is required", param="input", code="missing_required")
    ok = (isinstance(data, str) and data != "") or (
        isinstance(data, list)
        and bool(data)
        and (
            all(isinstance(x, str) and x for x in data)
            or all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in data)
            or all(
                isinstance(x, list)
                and x
                and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in x)
                for x in data
            )
        )
    )
    if not ok:
        raise BadRequest(
            "'input' must be a non-empty string, a list of them, a list of token ids or a list "
            "of lists of token ids",
            param="input",
        )
    _choice(body, "encoding_format", ("float", "base64"))
    _integer(body, "dimensions", 1)
    _string(body, "user")
    return body
