"""A flat, typed view of an OpenAI request and chat.completion, read once per score."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from quality.turns import answered_calls, last_results


def _text_of(content: Any) -> str:
    """Message content as text: a string, or the text parts of a list of parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(part["text"])
            elif isinstance(part, str):
                parts.append(part)
        return "\n".join(parts)
    return ""


def _int_or_none(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return int(value)


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str


@dataclass(frozen=True)
class View:
    prompt: str
    """Text of the last user message."""
    instructions: str
    """System/developer messages and the last user message: where format instructions live."""
    content: str
    tool_calls: tuple[ToolCall, ...]
    finish_reason: str | None
    stop_cause: str | None
    max_tokens: int | None
    completion_tokens: int | None
    tokens: tuple[str, ...] | None
    logprobs: tuple[float, ...] | None
    response_format: dict[str, Any] | None
    tools: tuple[dict[str, Any], ...]
    tool_choice: Any
    parallel_tool_calls: bool = True
    """False when the request allows one tool call at most."""
    answered_calls: frozenset[str] = frozenset()
    """The calls made since the user's last message whose results (not errors) are in the
    request (:func:`quality.turns.answered_calls`)."""
    tool_results: tuple[str, ...] = ()
    """The tool results that end the request's messages (:func:`quality.turns.last_results`)."""


def view_of(request: dict[str, Any], completion: dict[str, Any]) -> View:
    messages = request.get("messages") or []
    if not isinstance(messages, list):
        messages = []
    prompt = ""
    system_parts: list[str] = []
    for message in messages:
        if not isinstance(message, dict):
            continue
        role = message.get("role")
        if role == "user":
            prompt = _text_of(message.get("content"))
        elif role in ("system", "developer"):
            system_parts.append(_text_of(message.get("content")))
    instructions = "\n".join([*system_parts, prompt])

    choices = completion.get("choices") or [{}]
    choice = choices[0] if isinstance(choices, list) and choices else {}
    if not isinstance(choice, dict):
        choice = {}
    message = choice.get("message") or {}
    if not isinstance(message, dict):
        message = {}
    content = _text_of(message.get("content"))

    calls: list[ToolCall] = []
    for call in message.get("tool_calls") or []:
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict):
            arguments = function.get("arguments")
            if not isinstance(arguments, str):
                arguments = json.dumps(arguments)
            calls.append(ToolCall(name=str(function.get("name") or ""), arguments=arguments))

    tokens: tuple[str, ...] | None = None
    logprobs: tuple[float, ...] | None = None
    lp = choice.get("logprobs")
    if isinstance(lp, dict) and isinstance(lp.get("content"), list):
        entries = [e for e in lp["content"] if isinstance(e, dict)]
        values = [e.get("logprob") for e in entries]
        if entries and all(isinstance(v, int | float) for v in values):
            tokens = tuple(str(e.get("token", "")) for e in entries)
            logprobs = tuple(float(v) for v in values)  # type: ignore[arg-type]

    frugal = completion.get("frugal")
    stop_cause = frugal.get("stop_cause") if isinstance(frugal, dict) else None
    usage = completion.get("usage")
    completion_tokens = (
        _int_or_none(usage.get("completion_tokens")) if isinstance(usage, dict) else None
    )
    max_tokens = _int_or_none(request.get("max_completion_tokens"))
    if max_tokens is None:
        max_tokens = _int_or_none(request.get("max_tokens"))

    response_format = request.get("response_format")
    tools = request.get("tools") or []
    return View(
        prompt=prompt,
        instructions=instructions,
        content=content,
        tool_calls=tuple(calls),
        finish_reason=choice.get("finish_reason"),
        stop_cause=stop_cause if isinstance(stop_cause, str) else None,
        max_tokens=max_tokens,
        completion_tokens=completion_tokens,
        tokens=tokens,
        logprobs=logprobs,
        response_format=response_format if isinstance(response_format, dict) else None,
        tools=tuple(t for t in tools if isinstance(t, dict)) if isinstance(tools, list) else (),
        tool_choice=request.get("tool_choice"),
        parallel_tool_calls=request.get("parallel_tool_calls") is not False,
        answered_calls=answered_calls(messages),
        tool_results=last_results(messages),
    )
