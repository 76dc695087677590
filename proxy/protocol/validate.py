"""Cheap validation of OpenAI request bodies: chat completions, legacy completions, embeddings,
responses.

The body is parsed once, checked here in plain Python (no schema library on the hot path), and
passed on as the same dict: the API route forwards it unchanged. Every failure is a
:class:`BadRequest` whose ``param`` names the field in OpenAI's style, e.g. ``messages[2].role``.

The checks are driven by the tables of :mod:`proxy.protocol.params`, the same rows the OpenAPI
document is generated from (:mod:`proxy.protocol.request_schema`):

1. the keys: one outside the endpoint's allow-list (a routing field such as ``base_url``, a
   vendor extension such as ``top_k``, a typo) is a 400 naming it;
2. each row in the table's order: a required one that is missing is a 400; an unset (or null)
   optional one is skipped; the :class:`proxy.protocol.params.Rule` rows on it (``top_logprobs``
   needs ``logprobs``...) run; then its value is checked: a scalar against the row's type, bounds,
   enum and length (``max_chars``: OpenAI's ``string_above_max_length``), here, and a nested
   value by its shape's check (:mod:`proxy.protocol.shape_checks`,
   :mod:`proxy.protocol.tool_checks`);
3. what joins fields in ways the table does not say (``best_of`` against ``n`` and ``stream``).

Which parameters the local engine honours, and which send a request to the API, is
:mod:`proxy.protocol.params` too. The model name is at most :data:`MAX_MODEL_CHARS` printable
characters (no control characters, no line breaks): it is logged, stored in the ledger and shown in
reports.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from proxy.errors import BadRequest
from proxy.protocol import params, responses_params, responses_shapes, shape_checks, tool_checks
from proxy.protocol.forwarding import check_parameters
from proxy.protocol.params import Param, Rule, handling_of
from proxy.protocol.responses_params import RESPONSES_NOT_YET
from proxy.protocol.shape_checks import Check, kind, too_long
from proxy.protocol.shapes import MAX_MODEL_CHARS

__all__ = [
    "MAX_MODEL_CHARS",
    "chat_request",
    "checker",
    "completions_request",
    "embeddings_request",
    "parse_json",
    "responses_request",
]


def parse_json(raw: bytes) -> dict[str, Any]:
    """The body as a JSON object; a 400 when it is not one, or when one of its strings is not
    text (:func:`_lone_surrogate`)."""
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
    if _SURROGATE.search(raw):  # rare: a pair (an escaped emoji) is fine, a lone half is not
        where = _lone_surrogate(body)
        if where is not None:
            raise BadRequest(
                f"'{where}' holds a lone UTF-16 surrogate (an escape from \\ud800 to \\udfff "
                "without its pair), which is not Unicode text",
                param=where,
                code="invalid_value",
            )
    return body


# A surrogate as JSON can spell it: an escape, or its UTF-8 form (which json.loads lets through).
_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]|\xed[\xa0-\xbf]")


def _text(value: str) -> bool:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _lone_surrogate(body: dict[str, Any]) -> str | None:
    """The path (``input[0].content[0].text``) of a string or key of ``body`` that holds
    a lone surrogate, which Python keeps in a str but no UTF-8 writer takes (the ledger, a stored
    response, the upstream's JSON): caught here, before anything is spent on the request."""
    stack: list[tuple[str, Any]] = [("", body)]
    while stack:
        where, value = stack.pop()
        if isinstance(value, str):
            if not _text(value):
                return where or "body"
        elif isinstance(value, dict):
            for key, item in value.items():
                at = f"{where}.{key}" if where else str(key)
                if not _text(str(key)):
                    return where or "body"
                stack.append((at, item))
        elif isinstance(value, list):
            stack.extend((f"{where}[{i}]", item) for i, item in enumerate(value))
    return None


CHECKS: dict[str, Check] = {
    **shape_checks.CHECKS,
    **tool_checks.CHECKS,
    **responses_shapes.CHECKS,
}


# -- a scalar row's check ----------------------------------------------------------------------


def _bounds(param: Param) -> str:
    low, high = param.low, param.high
    if low is not None and high is not None:
        return f"between {low} and {high}"
    return f"at least {low}" if low is not None else f"at most {high}"


def _in_bounds(param: Param, value: float) -> None:
    if (param.low is not None and value < param.low) or (
        param.high is not None and value > param.high
    ):
        name = param.name
        raise BadRequest(f"'{name}' must be {_bounds(param)}, got {value}", param=name)


def _scalar(param: Param) -> Check:
    """The check of a scalar row: its JSON type, then its bounds or its enum."""
    name = param.name

    def number(value: Any, _body: dict[str, Any]) -> None:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise BadRequest(f"'{name}' must be a number, got {kind(value)}", param=name)
        _in_bounds(param, value)

    def integer(value: Any, _body: dict[str, Any]) -> None:
        if isinstance(value, bool) or not isinstance(value, int):
            raise BadRequest(f"'{name}' must be an integer, got {kind(value)}", param=name)
        _in_bounds(param, value)

    def boolean(value: Any, _body: dict[str, Any]) -> None:
        if not isinstance(value, bool):
            raise BadRequest(f"'{name}' must be true or false, got {kind(value)}", param=name)

    def string(value: Any, _body: dict[str, Any]) -> None:
        if not isinstance(value, str):
            raise BadRequest(f"'{name}' must be a string, got {kind(value)}", param=name)
        if param.max_chars is not None and len(value) > param.max_chars:
            raise too_long(name, param.max_chars, len(value))

    def choice(value: Any, _body: dict[str, Any]) -> None:
        if value not in param.enum:
            allowed = ", ".join(param.enum)
            raise BadRequest(f"'{name}' must be one of {allowed}, got {value!r}", param=name)

    def an_object(value: Any, _body: dict[str, Any]) -> None:
        if not isinstance(value, dict):
            raise BadRequest(f"'{name}' must be an object, got {kind(value)}", param=name)

    if param.enum:
        return choice
    checks: dict[Any, Check] = {
        "number": number,
        "integer": integer,
        "boolean": boolean,
        "string": string,
        "object": an_object,
    }
    if param.type not in checks:
        raise ValueError(f"{name}: a {param.type} value needs a shape")
    return checks[param.type]


# -- the driver --------------------------------------------------------------------------------

Step = tuple[str, bool, tuple[Rule, ...], Check]


def _steps(table: tuple[Param, ...], rules: tuple[Rule, ...]) -> tuple[Step, ...]:
    """Each row's name, whether it is required, its rules and its check, made once."""
    return tuple(
        (
            p.name,
            p.required,
            tuple(r for r in rules if r.name == p.name),
            CHECKS[p.shape] if p.shape is not None else _scalar(p),
        )
        for p in table
    )


def _run(body: dict[str, Any], steps: tuple[Step, ...]) -> None:
    for name, required, rules, check in steps:
        value = body.get(name)
        if value is None:
            if required:
                raise BadRequest(f"'{name}' is required", param=name, code="missing_required")
            continue
        for rule in rules:
            if bool(body.get(rule.other)) is not rule.needs:
                raise BadRequest(rule.message, param=name)
        check(value, body)


def checker(
    table: tuple[Param, ...],
    rules: tuple[Rule, ...] = (),
    then: Callable[[dict[str, Any]], None] | None = None,
) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """The check of one endpoint's body, made from its parameter table
    (:mod:`proxy.protocol.params`): a key outside the table is a 400 naming it, each row's value is
    checked, then ``rules``, then ``then`` (what the table cannot say). Returns the body unchanged
    or raises BadRequest."""
    steps = _steps(table, rules)
    names = handling_of(table)

    def validate(body: dict[str, Any]) -> dict[str, Any]:
        check_parameters(body, names)
        _run(body, steps)
        if then is not None:
            then(body)
        return body

    return validate


def _best_of(body: dict[str, Any]) -> None:
    best_of, n = body.get("best_of"), body.get("n")
    if best_of is not None and best_of < (n or 1):
        raise BadRequest("'best_of' must be at least 'n'", param="best_of")
    if best_of is not None and best_of > 1 and body.get("stream"):
        raise BadRequest("'best_of' cannot be used with 'stream'", param="best_of")


# The shipped endpoints' checks, from their tables in proxy.protocol.params.
_chat = checker(params.CHAT, params.CHAT_RULES)
_completions = checker(params.COMPLETIONS, params.COMPLETIONS_RULES, _best_of)
_embeddings = checker(params.EMBEDDINGS)
_responses = checker(responses_params.RESPONSES)


def chat_request(body: dict[str, Any]) -> dict[str, Any]:
    """Check a chat-completions body; returns it unchanged or raises BadRequest."""
    return _chat(body)


def completions_request(body: dict[str, Any]) -> dict[str, Any]:
    """Check a legacy ``/v1/completions`` body; returns it unchanged or raises BadRequest."""
    return _completions(body)


def embeddings_request(body: dict[str, Any]) -> dict[str, Any]:
    """Check a ``/v1/embeddings`` body; returns it unchanged or raises BadRequest."""
    return _embeddings(body)


def responses_request(body: dict[str, Any]) -> dict[str, Any]:
    """Check a ``/v1/responses`` body; returns it unchanged or raises BadRequest. A parameter
    of OpenAI's that is not served yet (:data:`proxy.protocol.responses_params.RESPONSES_NOT_YET`)
    is a 400 that says so, before any unknown one."""
    for name, why in RESPONSES_NOT_YET.items():
        if body.get(name) is not None:
            raise BadRequest(
                f"'{name}' is not supported yet by the proxy's /v1/responses: {why}",
                param=name,
                code="unsupported_parameter",
            )
    return _responses(body)
