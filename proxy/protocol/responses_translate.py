"""A Responses request as a chat request (the answer's way back, a chat completion as a
``response`` object or its events, is :mod:`proxy.protocol.responses_answer`).

    check_as_chat(body)            a ``/v1/responses`` body checked as the chat request it
                                   becomes (a tool's or a format's JSON Schema, named by its
                                   Responses path): part of the body's check, off the loop
    chat_of(body)                  a checked body, earlier turns and all, as the chat request
                                   the cascade answers (its messages checked as chat)
    stand_in(body)                 the body without what only OpenAI's own /v1/responses can
                                   do (built-in tools, ``reasoning``, image and file parts),
                                   and what was taken out: the chat the cascade plans, budgets
                                   and (when nothing was) answers
    completion_of(response)        a Responses answer (the API's own) as a chat completion, for
                                   an audit's reference
    effort_only(body)              the ``reasoning.effort`` of a body that asks nothing else of
                                   ``reasoning``: chat's ``reasoning_effort``

Storing an answer is :mod:`proxy.serving.responses`'s.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from proxy.errors import BadRequest
from proxy.protocol.responses_shapes import (
    LATER_ITEMS,
    LATER_PARTS,
    LATER_TOOLS,
    TEXT_PARTS,
    asks,
)
from proxy.protocol.shape_checks import CHECKS as _SHAPE_CHECKS
from proxy.protocol.validate import chat_request

# Responses' names of what chat calls otherwise, for a chat check's error.
_RENAMES = (
    (re.compile(r"^messages\b.*"), "input"),
    (re.compile(r"^max_completion_tokens"), "max_output_tokens"),
    (re.compile(r"^response_format\.json_schema"), "text.format"),
    (re.compile(r"^response_format"), "text.format"),
    (re.compile(r"^tools\[(\d+)\]\.function"), r"tools[\1]"),
    (re.compile(r"^tool_choice\.function"), "tool_choice"),
)
# Passed to the chat request as they are.
_SAME = (
    *("model", "temperature", "top_p", "user", "service_tier", "safety_identifier"),
    *("prompt_cache_key", "prompt_cache_retention"),
)
_check_messages = _SHAPE_CHECKS["messages"]


def _text_of(parts: list[dict[str, Any]]) -> str:
    return "".join(str(p.get("text") or p.get("refusal") or "") for p in parts)


def _messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    if body.get("instructions"):
        messages.append({"role": "system", "content": body["instructions"]})
    given = body["input"]
    if isinstance(given, str):
        return [*messages, {"role": "user", "content": given}]
    for item in given:
        item_type = item.get("type", "message")
        if item_type == "function_call":
            call = {
                "id": item["call_id"],
                "type": "function",
                "function": {"name": item["name"], "arguments": item["arguments"]},
            }
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant" and "tool_calls" in last:
                last["tool_calls"].append(call)  # parallel calls: one assistant turn
            elif last is not None and last["role"] == "assistant":
                last["tool_calls"] = [call]
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif item_type == "function_call_output":
            output = item["output"]
            said = output if isinstance(output, str) else _text_of(output)
            messages.append({"role": "tool", "tool_call_id": item["call_id"], "content": said})
        elif item_type != "message":
            continue  # an earlier turn's built-in tool call or reasoning: said in its message
        else:
            content: Any = item["content"]
            if item["role"] == "assistant":
                content = content if isinstance(content, str) else _text_of(content)
            elif not isinstance(content, str):
                content = [
                    {"type": "text", "text": p["text"]} for p in content if _typed(p, TEXT_PARTS)
                ]
            messages.append({"role": item["role"], "content": content})
    return messages


def _set(holder: dict[str, Any], *names: str) -> dict[str, Any]:
    """The members of ``holder`` among ``names`` that are set (not None)."""
    return {k: holder[k] for k in names if holder.get(k) is not None}


def _tools(body: dict[str, Any]) -> list[dict[str, Any]]:
    tools = []
    for tool in body["tools"]:
        function = _set(tool, "name", "description", "parameters", "strict")
        tools.append({"type": "function", "function": function})
    return tools


def _response_format(fmt: dict[str, Any]) -> dict[str, Any] | None:
    if fmt["type"] == "text":
        return None
    if fmt["type"] == "json_object":
        return {"type": "json_object"}
    schema = _set(fmt, "name", "schema", "description", "strict")
    return {"type": "json_schema", "json_schema": schema}


def effort_only(body: dict[str, Any]) -> str | None:
    """The effort of a ``reasoning`` that asks for nothing else (no summary): chat's
    ``reasoning_effort``, which a local model that thinks serves; None otherwise."""
    reasoning = body.get("reasoning")
    if not isinstance(reasoning, dict) or set(reasoning) - {"effort", "summary"}:
        return None
    effort = reasoning.get("effort")
    if reasoning.get("summary") is not None or not isinstance(effort, str):
        return None
    return effort


def _translated(body: dict[str, Any]) -> dict[str, Any]:
    chat: dict[str, Any] = _set(body, *_SAME)
    chat["messages"] = _messages(body)
    if body.get("max_output_tokens") is not None:
        chat["max_completion_tokens"] = body["max_output_tokens"]
    if body.get("tools"):
        chat["tools"] = _tools(body)
        if body.get("parallel_tool_calls") is not None:
            chat["parallel_tool_calls"] = body["parallel_tool_calls"]
        choice = body.get("tool_choice")
        if isinstance(choice, dict):
            chat["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
        elif choice is not None:
            chat["tool_choice"] = choice
    text = body.get("text") or {}
    if text.get("format") is not None:
        response_format = _response_format(text["format"])
        if response_format is not None:
            chat["response_format"] = response_format
    if text.get("verbosity") is not None:
        chat["verbosity"] = text["verbosity"]
    return chat


def _renamed(param: str | None) -> str | None:
    if param is None:
        return None
    for pattern, name in _RENAMES:
        if pattern.match(param):
            return pattern.sub(name, param, count=1)
    return param


def _as_chat(body: dict[str, Any], check: Callable[[dict[str, Any]], Any]) -> dict[str, Any]:
    """``body`` translated to chat and ``check``-ed as chat; a :class:`BadRequest` names the
    Responses field."""
    chat = _translated(body)
    try:
        check(chat)
    except BadRequest as exc:
        param = _renamed(exc.param)
        message = str(exc)
        if exc.param and param != exc.param:
            message = message.replace(exc.param, param or "")
        raise BadRequest(message, param=param, code=exc.code) from None
    return chat


def check_as_chat(body: dict[str, Any]) -> None:
    """Check a Responses body, as it came (its own input, no earlier turn), as the chat request
    it becomes: every tool's and format's JSON Schema among the rest. Costly (about 1 s for a
    tool of 60,000 properties), so it is part of the body's own check, which runs off the event
    loop for a large body (:mod:`proxy.serving.body_check`)."""
    _as_chat(body, chat_request)


def _messages_only(chat: dict[str, Any]) -> None:
    _check_messages(chat["messages"], chat)


def chat_of(body: dict[str, Any]) -> dict[str, Any]:
    """A Responses body that :func:`check_as_chat` passed, its input maybe grown by earlier
    turns, as a chat request. Only its messages (the conversation) are checked here: the rest
    was checked with the body, and checking a schema again would be on the event loop."""
    return _as_chat(body, _messages_only)


def _typed(value: Any, names: frozenset[str]) -> bool:
    """Whether ``value`` (an unchecked item, part or tool) has a ``type`` among ``names``."""
    kind = value.get("type") if isinstance(value, dict) else None
    return isinstance(kind, str) and kind in names


def _taken_parts(content: Any) -> tuple[Any, list[str]]:
    if not isinstance(content, list):
        return content, []
    kept = [p for p in content if not _typed(p, LATER_PARTS)]
    taken = [f"a '{p['type']}' part" for p in content if p not in kept]
    return kept, taken


def stand_in(body: dict[str, Any], api_only: tuple[str, ...]) -> tuple[dict[str, Any], list[str]]:
    """``body`` without what only OpenAI's own ``/v1/responses`` can do (the parameters
    ``api_only``, built-in tools and a tool_choice naming one, image, file and audio parts,
    built-in tool and reasoning items), and what was taken out, said for an error or a log."""
    taken = [f"'{name}'" for name in api_only if asks(body.get(name))]
    out = {k: v for k, v in body.items() if k not in api_only}
    tools = body.get("tools")
    if isinstance(tools, list):
        later = [t for t in tools if _typed(t, LATER_TOOLS)]
        taken += [f"the built-in tool '{t['type']}'" for t in later]
        out["tools"] = [t for t in tools if t not in later] or None
    choice = body.get("tool_choice")
    if _typed(choice, LATER_TOOLS):
        out["tool_choice"] = None
    given = body.get("input")
    if isinstance(given, list):
        items: list[Any] = []
        for item in given:
            if not isinstance(item, dict):
                items.append(item)
            elif _typed(item, LATER_ITEMS):
                taken.append(f"a '{item['type']}' item")
            elif "content" in item:
                content, parts = _taken_parts(item["content"])
                taken += parts
                items.append({**item, "content": content})
            else:
                items.append(item)
        out["input"] = items or ""
    return out, taken


def completion_of(response: dict[str, Any]) -> dict[str, Any]:
    """A ``response`` object (the API's own) as the chat completion it stands for."""
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for item in response.get("output") or []:
        if not isinstance(item, dict):
            continue
        if item.get("type") == "message":
            texts.append(_text_of([p for p in item.get("content") or [] if isinstance(p, dict)]))
        elif item.get("type") == "function_call":
            function = {"name": item.get("name"), "arguments": item.get("arguments")}
            calls.append({"id": item.get("call_id"), "type": "function", "function": function})
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts) or None}
    if calls:
        message["tool_calls"] = calls
    finish = "tool_calls" if calls else "stop"
    if response.get("status") == "incomplete":
        finish = "length"
    return {
        "id": response.get("id"),
        "object": "chat.completion",
        "created": response.get("created_at"),
        "model": response.get("model"),
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
    }
