"""Cheap validation of an OpenAI chat-completions request body.

The body is parsed once, checked here in plain Python (no schema library on the hot path), and
passed on as the same dict. Every failure is a :class:`BadRequest` whose ``param`` names the field
in OpenAI's style, e.g. ``messages[2].role``.
"""

from __future__ import annotations

import json
from typing import Any

from proxy.errors import BadRequest

ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
PART_TYPES = frozenset({"text", "image_url", "input_audio", "file", "refusal", "input_text"})


def parse_json(raw: bytes) -> dict[str, Any]:
    if not raw.strip():
        raise BadRequest("the request body is empty; expected a JSON object", code="invalid_json")
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(
            f"the request body is not valid JSON ({exc.__class__.__name__})", code="invalid_json"
        ) from exc
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object", code="invalid_json")
    return body


def _number(body: dict[str, Any], name: str, low: float, high: float) -> None:
    value = body.get(name)
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise BadRequest(f"'{name}' must be a number, got {type(value).__name__}", param=name)
    if not low <= value <= high:
        raise BadRequest(f"'{name}' must be between {low} and {high}, got {value}", param=name)


def _integer(body: dict[str, Any], name: str, low: int, high: int | None = None) -> None:
    value = body.get(name)
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest(f"'{name}' must be an integer, got {type(value).__name__}", param=name)
    if value < low or (high is not None and value > high):
        bound = f"between {low} and {high}" if high is not None else f"at least {low}"
        raise BadRequest(f"'{name}' must be {bound}, got {value}", param=name)


def _boolean(body: dict[str, Any], name: str) -> None:
    value = body.get(name)
    if value is not None and not isinstance(value, bool):
        raise BadRequest(f"'{name}' must be true or false", param=name)


def _content(content: Any, where: str, role: str, has_tool_calls: bool) -> None:
    if content is None:
        if role == "assistant" and has_tool_calls:
            return
        if role == "assistant":
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
        if kind not in PART_TYPES:
            raise BadRequest(
                f"'{part_where}.type' must be one of {', '.join(sorted(PART_TYPES))}, got {kind!r}",
                param=f"{part_where}.type",
            )
        if kind in ("text", "input_text") and not isinstance(part.get("text"), str):
            raise BadRequest(f"'{part_where}.text' must be a string", param=f"{part_where}.text")


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
        if role not in ROLES:
            raise BadRequest(
                f"'{where}.role' must be one of {', '.join(sorted(ROLES))}, got {role!r}",
                param=f"{where}.role",
            )
        tool_calls = message.get("tool_calls")
        if tool_calls is not None and not isinstance(tool_calls, list):
            raise BadRequest(f"'{where}.tool_calls' must be a list", param=f"{where}.tool_calls")
        _content(message.get("content"), f"{where}.content", role, bool(tool_calls))
        if role == "tool" and not isinstance(message.get("tool_call_id"), str):
            raise BadRequest(
                f"'{where}.tool_call_id' is required for role 'tool'",
                param=f"{where}.tool_call_id",
            )


def chat_request(body: dict[str, Any]) -> dict[str, Any]:
    """Check a chat-completions body; returns it unchanged or raises BadRequest."""
    model = body.get("model")
    if model is None:
        raise BadRequest("'model' is required", param="model", code="missing_required")
    if not isinstance(model, str) or not model.strip():
        raise BadRequest("'model' must be a non-empty string", param="model")
    _messages(body.get("messages"))
    _number(body, "temperature", 0, 2)
    _number(body, "top_p", 0, 1)
    _number(body, "presence_penalty", -2, 2)
    _number(body, "frequency_penalty", -2, 2)
    _integer(body, "n", 1, 128)
    _integer(body, "max_tokens", 1)
    _integer(body, "max_completion_tokens", 1)
    _integer(body, "top_logprobs", 0, 20)
    _integer(body, "seed", -(2**63), 2**63 - 1)
    _boolean(body, "stream")
    _boolean(body, "logprobs")
    stop = body.get("stop")
    if stop is not None:
        if isinstance(stop, str):
            pass
        elif isinstance(stop, list) and all(isinstance(s, str) for s in stop):
            if len(stop) > 4:
                raise BadRequest("'stop' may hold at most 4 sequences", param="stop")
        else:
            raise BadRequest("'stop' must be a string or a list of strings", param="stop")
    options = body.get("stream_options")
    if options is not None:
        if not isinstance(options, dict):
            raise BadRequest("'stream_options' must be an object", param="stream_options")
        if not body.get("stream"):
            raise BadRequest(
                "'stream_options' is only allowed when 'stream' is true", param="stream_options"
            )
    bias = body.get("logit_bias")
    if bias is not None:
        if not isinstance(bias, dict):
            raise BadRequest("'logit_bias' must be an object of token ids", param="logit_bias")
        for key, value in bias.items():
            if not str(key).lstrip("-").isdigit():
                raise BadRequest(
                    f"'logit_bias' keys must be token ids, got {key!r}", param="logit_bias"
                )
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise BadRequest("'logit_bias' values must be numbers", param="logit_bias")
            if not -100 <= value <= 100:
                raise BadRequest(
                    "'logit_bias' values must be between -100 and 100", param="logit_bias"
                )
    fmt = body.get("response_format")
    if fmt is not None:
        if not isinstance(fmt, dict) or fmt.get("type") not in (
            "text",
            "json_object",
            "json_schema",
        ):
            raise BadRequest(
                "'response_format.type' must be one of text, json_object, json_schema",
                param="response_format",
            )
        if fmt.get("type") == "json_schema":
            spec = fmt.get("json_schema")
            if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
                raise BadRequest(
                    "'response_format.json_schema' must be an object with a 'name'",
                    param="response_format.json_schema",
                )
            schema = spec.get("schema")
            if schema is not None and not isinstance(schema, dict | bool):
                raise BadRequest(
                    "'response_format.json_schema.schema' must be a JSON schema object",
                    param="response_format.json_schema.schema",
                )
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            raise BadRequest("'tools' must be a list", param="tools")
        for i, tool in enumerate(tools):
            fn = tool.get("function") if isinstance(tool, dict) else None
            if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                raise BadRequest(
                    f"'tools[{i}].function.name' is required", param=f"tools[{i}].function.name"
                )
    user = body.get("user")
    if user is not None and not isinstance(user, str):
        raise BadRequest("'user' must be a string", param="user")
    return body


def local_blocker(body: dict[str, Any]) -> str | None:
    """Why the local engine cannot serve this request, or None when it can."""
    if (body.get("n") or 1) > 1:
        return "n > 1"
    if body.get("tools") or body.get("functions"):
        return "tools"
    fmt = body.get("response_format")
    if isinstance(fmt, dict) and fmt.get("type") in ("json_object", "json_schema"):
        return "response_format"
    for message in body.get("messages") or ():
        content = message.get("content")
        if isinstance(content, list) and any(
            isinstance(p, dict) and p.get("type") not in ("text", "input_text") for p in content
        ):
            return "non-text content"
    return None
