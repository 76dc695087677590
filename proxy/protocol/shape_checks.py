"""Hand-written checks of the nested request values: messages, stop, prompts, metadata...

:data:`CHECKS` maps a shape of :mod:`proxy.protocol.shapes` to its check (the tool and
structured-answer shapes are :mod:`proxy.protocol.tool_checks`'); :mod:`proxy.protocol.validate`
calls it with the value (never None: an unset value is the driver's business) and the whole body (a
``tool_choice`` must name one of the ``tools``). The limits and enums come from
:mod:`proxy.protocol.shapes`, which builds the OpenAPI fragment of the same shape from them. Every
failure is a :class:`BadRequest` whose ``param`` names the field in OpenAI's style, e.g.
``messages[2].content[0].text``.

The small helpers (:func:`kind`, :func:`boolean`, :func:`string`, :func:`too_long`,
:func:`obj`, :func:`objects`, :func:`one_of`, :func:`function_or_custom`) check one member of an
object and are the driver's and :mod:`proxy.protocol.tool_checks`' too.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from proxy.errors import BadRequest
from proxy.logs import invisible
from proxy.protocol import shapes as s

Check = Callable[[Any, dict[str, Any]], None]


def kind(value: Any) -> str:
    """A JSON value's type in words, for an error message (never the value itself)."""
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


def boolean(holder: dict[str, Any], name: str, where: str) -> None:
    value = holder.get(name)
    if value is not None and not isinstance(value, bool):
        raise BadRequest(f"'{where}' must be true or false, got {kind(value)}", param=where)


def string(holder: dict[str, Any], name: str, where: str) -> None:
    value = holder.get(name)
    if value is not None and not isinstance(value, str):
        raise BadRequest(f"'{where}' must be a string, got {kind(value)}", param=where)


def too_long(where: str, limit: int, got: int) -> BadRequest:
    """OpenAI's own error for a string past its length: ``string_above_max_length``."""
    return BadRequest(
        f"Invalid '{where}': string too long. Expected a string with maximum length {limit}, "
        f"but got a string with length {got} instead.",
        param=where,
        code="string_above_max_length",
    )


def obj(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise BadRequest(f"'{where}' must be an object, got {kind(value)}", param=where)
    return value


def objects(items: list[Any], where: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """Each item of ``items`` with its ``param`` path (``where[i]``), each one an object."""
    for i, item in enumerate(items):
        at = f"{where}[{i}]"
        if not isinstance(item, dict):
            raise BadRequest(f"'{at}' must be an object", param=at)
        yield at, item


def one_of(value: Any, allowed: frozenset[str], where: str) -> str:
    if not isinstance(value, str) or value not in allowed:
        raise BadRequest(
            f"'{where}' must be one of {', '.join(sorted(allowed))}, got {value!r}", param=where
        )
    return value


def function_or_custom(item: dict[str, Any], where: str) -> bool:
    """Checks a tool's (or a tool call's) ``type``: ``custom`` with a ``custom.name``, or
    ``function`` (the default); True for a function, whose own members the caller checks."""
    item_type = item.get("type", "function")
    if item_type == "custom":
        custom = item.get("custom")
        if not isinstance(custom, dict) or not isinstance(custom.get("name"), str):
            raise BadRequest(f"'{where}.custom.name' is required", param=f"{where}.custom")
        return False
    if item_type != "function":
        raise BadRequest(
            f"'{where}.type' must be 'function' or 'custom', got {item_type!r}",
            param=f"{where}.type",
        )
    return True


def _token_ids(value: Any) -> bool:
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value)
    )


# -- scalars with a shape of their own ---------------------------------------------------------


def _model(model: Any, _body: dict[str, Any]) -> None:
    if not isinstance(model, str) or not model.strip():
        raise BadRequest("'model' must be a non-empty string", param="model")
    if len(model) > s.MAX_MODEL_CHARS:
        raise BadRequest(
            f"'model' must be at most {s.MAX_MODEL_CHARS} characters, got {len(model)}",
            param="model",
        )
    hidden = next((c for c in model if invisible(c)), None)
    if hidden is not None:
        raise BadRequest(
            "'model' must hold visible characters only (no control, format, private-use or "
            "unassigned characters, blank letters, or spaces other than ' '), got "
            f"U+{ord(hidden):04X}",
            param="model",
        )


def _stop(stop: Any, _body: dict[str, Any]) -> None:
    if isinstance(stop, str):
        return
    if isinstance(stop, list) and all(isinstance(x, str) for x in stop):
        if len(stop) > s.MAX_STOP:
            raise BadRequest(f"'stop' may hold at most {s.MAX_STOP} sequences", param="stop")
        return
    raise BadRequest("'stop' must be a string or a list of strings", param="stop")


def _stream_options(value: Any, _body: dict[str, Any]) -> None:
    options = obj(value, "stream_options")
    for key in s.STREAM_OPTIONS_KEYS:
        boolean(options, key, f"stream_options.{key}")


def _logit_bias(value: Any, _body: dict[str, Any]) -> None:
    for key, bias in obj(value, "logit_bias").items():
        if not s.TOKEN_ID.fullmatch(key):
            raise BadRequest(
                f"'logit_bias' keys must be token ids (non-negative integers), got {key!r}",
                param="logit_bias",
            )
        if isinstance(bias, bool) or not isinstance(bias, int | float):
            raise BadRequest("'logit_bias' values must be numbers", param="logit_bias")
        if not s.BIAS_LOW <= bias <= s.BIAS_HIGH:
            raise BadRequest(
                f"'logit_bias' values must be between {s.BIAS_LOW} and {s.BIAS_HIGH}",
                param="logit_bias",
            )


def _modalities(value: Any, _body: dict[str, Any]) -> None:
    if not isinstance(value, list) or not all(m in s.MODALITIES for m in value):
        raise BadRequest("'modalities' must be a list of 'text' and 'audio'", param="modalities")


def _string_map(name: str, value_chars: int = s.METADATA_VALUE_CHARS) -> Check:
    """The check of a map of tags (``metadata``, ``client_metadata``): at most
    ``METADATA_KEYS`` keys of ``METADATA_KEY_CHARS`` characters, each to a string of
    ``value_chars``."""

    def check(value: Any, _body: dict[str, Any]) -> None:
        tags = obj(value, name)
        if len(tags) > s.METADATA_KEYS:
            raise BadRequest(f"'{name}' may hold at most {s.METADATA_KEYS} keys", param=name)
        for key, text in tags.items():
            if (
                len(key) > s.METADATA_KEY_CHARS
                or not isinstance(text, str)
                or len(text) > value_chars
            ):
                raise BadRequest(
                    f"'{name}' maps keys of at most {s.METADATA_KEY_CHARS} characters to strings "
                    f"of at most {value_chars}",
                    param=name,
                )

    return check


# -- messages ----------------------------------------------------------------------------------


def _content(content: Any, where: str, role: str) -> None:
    if content is None:
        # An assistant turn may carry only tool calls (or a refusal, or audio) and no content.
        if role == "assistant":
            return
        raise BadRequest(f"'{where}' is required for role '{role}'", param=where)
    if isinstance(content, str):
        return
    if not isinstance(content, list):
        raise BadRequest(f"'{where}' must be a string or a list of content parts", param=where)
    for at, part in objects(content, where):
        part_type = one_of(part.get("type"), s.PART_TYPES, f"{at}.type")
        if part_type in s.TEXT_PARTS and not isinstance(part.get("text"), str):
            raise BadRequest(f"'{at}.text' must be a string", param=f"{at}.text")
        if part_type == "refusal" and not isinstance(part.get("refusal"), str):
            raise BadRequest(f"'{at}.refusal' must be a string", param=f"{at}.refusal")
        if part_type == "image_url":
            image = part.get("image_url")
            if not isinstance(image, dict) or not isinstance(image.get("url"), str):
                raise BadRequest(f"'{at}.image_url.url' is required", param=f"{at}.image_url")


def _tool_calls(calls: Any, where: str) -> None:
    if calls is None:
        return
    if not isinstance(calls, list):
        raise BadRequest(f"'{where}' must be a list", param=where)
    for at, call in objects(calls, where):
        if not isinstance(call.get("id"), str):
            raise BadRequest(f"'{at}.id' is required", param=f"{at}.id")
        if not function_or_custom(call, at):
            continue
        fn = call.get("function")
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise BadRequest(f"'{at}.function.name' is required", param=f"{at}.function.name")
        if not isinstance(fn.get("arguments"), str):
            raise BadRequest(
                f"'{at}.function.arguments' must be a string of JSON",
                param=f"{at}.function.arguments",
            )


def _messages(messages: Any, _body: dict[str, Any]) -> None:
    if not isinstance(messages, list):
        raise BadRequest("'messages' must be a list of message objects", param="messages")
    if not messages:
        raise BadRequest("'messages' must contain at least one message", param="messages")
    for where, message in objects(messages, "messages"):
        role = one_of(message.get("role"), s.ROLES, f"{where}.role")
        string(message, "name", f"{where}.name")
        name = message.get("name")
        if isinstance(name, str) and len(name) > s.MESSAGE_NAME_CHARS:
            raise too_long(f"{where}.name", s.MESSAGE_NAME_CHARS, len(name))
        _tool_calls(message.get("tool_calls"), f"{where}.tool_calls")
        fn_call = message.get("function_call")
        if fn_call is not None and (
            not isinstance(fn_call, dict) or not isinstance(fn_call.get("name"), str)
        ):
            raise BadRequest(
                f"'{where}.function_call' must be an object with a 'name'",
                param=f"{where}.function_call",
            )
        _content(message.get("content"), f"{where}.content", role)
        if role == "tool" and not isinstance(message.get("tool_call_id"), str):
            raise BadRequest(
                f"'{where}.tool_call_id' is required for role 'tool'",
                param=f"{where}.tool_call_id",
            )
        if role == "function" and not isinstance(message.get("name"), str):
            raise BadRequest(
                f"'{where}.name' is required for role 'function'", param=f"{where}.name"
            )


# -- legacy prompts and embeddings input -------------------------------------------------------


def _texts_or_token_ids(value: Any, *, empty_strings: bool) -> bool:
    """A string, a list of strings, a list of token ids or a list of lists of token ids; no
    list empty, and no string either unless ``empty_strings``."""

    def text(x: Any) -> bool:
        return isinstance(x, str) and (empty_strings or bool(x))

    if text(value):
        return True
    return (
        isinstance(value, list)
        and bool(value)
        and (all(text(x) for x in value) or _token_ids(value) or all(_token_ids(x) for x in value))
    )


def _texts_check(param: str, *, empty_strings: bool, must: str) -> Check:
    """The check of a parameter that is text or token ids (a completion's ``prompt``, the
    embeddings' ``input``): anything else is a 400 saying what it ``must`` be."""

    def check(value: Any, _body: dict[str, Any]) -> None:
        if not _texts_or_token_ids(value, empty_strings=empty_strings):
            raise BadRequest(f"'{param}' must be {must}", param=param)

    return check


_prompt = _texts_check(
    "prompt",
    empty_strings=True,
    must="a string, a list of strings, a list of token ids or a list of lists of token ids "
    "(none of them empty)",
)
_input = _texts_check(
    "input",
    empty_strings=False,
    must="a non-empty string, a list of them, a list of token ids or a list of lists of token ids",
)


CHECKS: dict[str, Check] = {
    "model": _model,
    "messages": _messages,
    "stop": _stop,
    "stream_options": _stream_options,
    "logit_bias": _logit_bias,
    "modalities": _modalities,
    "metadata": _string_map("metadata"),
    "client_metadata": _string_map("client_metadata", s.CLIENT_METADATA_VALUE_CHARS),
    "prompt": _prompt,
    "input": _input,
}
