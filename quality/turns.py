"""The tool turns of a conversation, as the gate and the engine read them: which calls have
been answered since the user's last message, which results end it, and whether a result reports
an error. Read by :mod:`quality._view` for :mod:`quality.tool_use`, and by the local engine, which
keeps its model from making an answered call again."""

from __future__ import annotations

import json
import re
from typing import Any

_ERROR = re.compile(
    r"\b(errors?|exception|traceback|fail(ed|ure|s)?|invalid|not found|no such|unknown|denied|"
    r"forbidden|unauthori[sz]ed|timed? ?out|unavailable|could not|couldn't|cannot|can't|"
    r"rate.?limit(ed)?)\b",
    re.IGNORECASE,
)


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            str(part.get("text"))
            for part in content
            if isinstance(part, dict) and isinstance(part.get("text"), str)
        )
    return "" if content is None else json.dumps(content)


def call_key(name: str, arguments: Any) -> str:
    """One string per distinct call: the name and the arguments as canonical JSON (arguments
    that do not parse are compared as their text, white space at the ends dropped)."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except ValueError:
            arguments = arguments.strip()
    return name + "\x00" + json.dumps(arguments, sort_keys=True, ensure_ascii=False)


def is_error(result: str) -> bool:
    """Whether a tool's result reports a failure (a JSON object with an ``error`` key, or text
    that says so), after which the same call may rightly be made again."""
    try:
        data = json.loads(result)
    except ValueError:
        data = None
    if isinstance(data, dict) and (
        data.get("error") or data.get("errors") or data.get("ok") is False
    ):
        return True
    return _ERROR.search(result) is not None


def _current_turn(messages: Any) -> list[dict[str, Any]]:
    """The messages since the user's last one."""
    if not isinstance(messages, list):
        return []
    turn: list[dict[str, Any]] = []
    for message in messages:
        if not isinstance(message, dict):
            continue
        if message.get("role") == "user":
            turn = []
        else:
            turn.append(message)
    return turn


def answered_calls(messages: Any) -> frozenset[str]:
    """The :func:`call_key` of each call made since the user's last message whose result is in
    ``messages`` and is not an error."""
    made: dict[str, str] = {}  # call id (or the function's name, for ``function_call``) -> key
    answered: set[str] = set()
    for message in _current_turn(messages):
        role = message.get("role")
        if role == "assistant":
            for call in message.get("tool_calls") or ():
                function = call.get("function") if isinstance(call, dict) else None
                if isinstance(function, dict):
                    key = call_key(str(function.get("name") or ""), function.get("arguments"))
                    made[str(call.get("id"))] = key
            legacy = message.get("function_call")
            if isinstance(legacy, dict):
                made[str(legacy.get("name"))] = call_key(
                    str(legacy.get("name") or ""), legacy.get("arguments")
                )
        elif role in ("tool", "function"):
            key_of = str(message.get("tool_call_id") if role == "tool" else message.get("name"))
            if key_of in made and not is_error(_text(message.get("content"))):
                answered.add(made[key_of])
    return frozenset(answered)


def last_results(messages: Any) -> tuple[str, ...]:
    """The text of the tool results that end ``messages`` (none when a user or assistant
    message is last)."""
    if not isinstance(messages, list):
        return ()
    results: list[str] = []
    for message in reversed(messages):
        if not isinstance(message, dict) or message.get("role") not in ("tool", "function"):
            break
        results.append(_text(message.get("content")))
    return tuple(reversed(results))
