"""A Responses request as a chat request, and a chat completion as a Responses object.

    chat_of(body)                  a checked ``/v1/responses`` body as the chat request the
                                   cascade answers (checked again as chat: a tool's or a
                                   format's JSON Schema, named by its Responses path)
    response_of(completion, body)  the chat completion (local or the API's) as OpenAI's
                                   ``response`` object, usage in the Responses' shape
    events(response)               that response as the typed events of a Responses stream,
                                   each with its ``sequence_number``
    stand_in(body)                 the body without what only OpenAI's own /v1/responses can
                                   do (built-in tools, ``reasoning``, image and file parts),
                                   and what was taken out: the chat the cascade plans, budgets
                                   and (when nothing was) answers
    completion_of(response)        a Responses answer (the API's own) as a chat completion, for
                                   an audit's reference

The stream is made from the finished answer (as a ``verify`` chat stream is): the cascade judges
the whole answer first, and with ``[fallback] responses = "translate"`` the API is asked for
JSON, so a fallback can still happen before the first event (the API's own ``/v1/responses``
streams its own events, relayed by :mod:`proxy.http.responses`). Storing it is
:mod:`proxy.http.responses`'s.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Iterator
from typing import Any

from proxy.errors import BadRequest
from proxy.http.responses_shapes import LATER_ITEMS, LATER_PARTS, LATER_TOOLS, TEXT_PARTS
from proxy.http.validate import chat_request
from proxy.upstream.responses_api import usage_figures

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
_PIECE = re.compile(r"\s*\S+|\s+")  # a streamed text's deltas: a word and the space before it


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


def chat_of(body: dict[str, Any]) -> dict[str, Any]:
    """A checked Responses body as a chat request, itself checked as chat (raises a
    :class:`BadRequest` naming the Responses field)."""
    chat = _translated(body)
    try:
        return chat_request(chat)
    except BadRequest as exc:
        param = _renamed(exc.param)
        message = str(exc)
        if exc.param and param != exc.param:
            message = message.replace(exc.param, param or "")
        raise BadRequest(message, param=param, code=exc.code) from None


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
    taken = [f"'{name}'" for name in api_only if body.get(name) is not None]
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


# -- the answer --------------------------------------------------------------------------------


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def _usage(usage: dict[str, Any]) -> dict[str, Any]:
    prompt, completion, cached, reasoning, total = usage_figures(usage, "prompt", "completion")
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": cached},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": reasoning},
        "total_tokens": total,
    }


def _output(message: dict[str, Any], status: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    content = message.get("content")
    refusal = message.get("refusal")
    calls = message.get("tool_calls") or []
    if content or refusal or not calls:
        part: dict[str, Any] = (
            {"type": "refusal", "refusal": refusal}
            if refusal and not content
            else {"type": "output_text", "text": content or "", "annotations": [], "logprobs": []}
        )
        items.append(
            {
                "id": _id("msg"),
                "type": "message",
                "status": status,
                "role": "assistant",
                "content": [part],
            }
        )
    for i, call in enumerate(calls):
        function = call.get("function") or {}
        items.append(
            {
                "id": _id("fc"),
                "type": "function_call",
                # max_output_tokens cuts the last call only: its arguments are as far as they came
                "status": status if i == len(calls) - 1 else "completed",
                "call_id": call.get("id") or _id("call"),
                "name": function.get("name") or "",
                "arguments": function.get("arguments") or "",
            }
        )
    return items


def response_of(completion: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
    """The chat ``completion`` (to the Responses ``body``) as OpenAI's ``response`` object."""
    choice = (completion.get("choices") or [{}])[0]
    finish = choice.get("finish_reason")
    incomplete = {"length": "max_output_tokens", "content_filter": "content_filter"}.get(
        finish or ""
    )
    status = "incomplete" if incomplete else "completed"
    text = body.get("text") or {}
    return {
        "id": _id("resp"),
        "object": "response",
        "created_at": int(completion.get("created") or time.time()),
        "status": status,
        "background": False,
        "error": None,
        "incomplete_details": {"reason": incomplete} if incomplete else None,
        "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"),
        "metadata": body.get("metadata") or {},
        "model": completion.get("model") or body["model"],
        "output": _output(choice.get("message") or {}, status),
        "parallel_tool_calls": body.get("parallel_tool_calls") is not False,
        "previous_response_id": None,
        "reasoning": {"effort": None, "summary": None},
        "store": False,  # True once proxy.http.responses has stored it
        "temperature": body.get("temperature"),
        "text": {
            "format": text.get("format") or {"type": "text"},
            "verbosity": text.get("verbosity") or "medium",
        },
        "tool_choice": body.get("tool_choice") or "auto",
        "tools": [{"strict": None, **tool} for tool in body.get("tools") or []],
        "top_p": body.get("top_p"),
        "truncation": body.get("truncation") or "disabled",
        "usage": _usage(completion.get("usage") or {}),
        "user": body.get("user"),
    }


# -- the stream --------------------------------------------------------------------------------


def _sse(name: str, payload: dict[str, Any]) -> bytes:
    data = json.dumps({"type": name, **payload}, separators=(",", ":"))
    return f"event: {name}\ndata: {data}\n\n".encode()


def _item_events(item: dict[str, Any], index: int) -> Iterator[tuple[str, dict[str, Any]]]:
    at = {"output_index": index, "item_id": item["id"]}
    if item["type"] not in ("message", "function_call"):  # a cached API answer's own items
        yield "response.output_item.added", {"output_index": index, "item": item}
        yield "response.output_item.done", {"output_index": index, "item": item}
        return
    if item["type"] == "function_call":
        yield (
            "response.output_item.added",
            {
                "output_index": index,
                "item": {**item, "arguments": "", "status": "in_progress"},
            },
        )
        if item["arguments"]:
            yield "response.function_call_arguments.delta", {**at, "delta": item["arguments"]}
        yield (
            "response.function_call_arguments.done",
            {
                **at,
                "name": item["name"],
                "arguments": item["arguments"],
            },
        )
        yield "response.output_item.done", {"output_index": index, "item": item}
        return
    yield (
        "response.output_item.added",
        {
            "output_index": index,
            "item": {**item, "status": "in_progress", "content": []},
        },
    )
    for k, part in enumerate(item["content"]):
        at_part = {**at, "content_index": k}
        if part["type"] == "refusal":
            empty: dict[str, Any] = {"type": "refusal", "refusal": ""}
            yield "response.content_part.added", {**at_part, "part": empty}
            yield "response.refusal.delta", {**at_part, "delta": part["refusal"]}
            yield "response.refusal.done", {**at_part, "refusal": part["refusal"]}
        else:
            empty = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            yield "response.content_part.added", {**at_part, "part": empty}
            for piece in _PIECE.findall(part["text"]):
                yield "response.output_text.delta", {**at_part, "delta": piece, "logprobs": []}
            yield "response.output_text.done", {**at_part, "text": part["text"], "logprobs": []}
        yield "response.content_part.done", {**at_part, "part": part}
    yield "response.output_item.done", {"output_index": index, "item": item}


def events(response: dict[str, Any]) -> Iterator[bytes]:
    """The finished ``response`` as OpenAI streams one: created, in_progress, each item's
    events, then completed (or incomplete)."""
    started = {**response, "status": "in_progress", "output": [], "usage": None}
    started["incomplete_details"] = None
    sequence = 0

    def sent(name: str, payload: dict[str, Any]) -> bytes:
        nonlocal sequence
        event = _sse(name, {"sequence_number": sequence, **payload})
        sequence += 1
        return event

    yield sent("response.created", {"response": started})
    yield sent("response.in_progress", {"response": started})
    for index, item in enumerate(response["output"]):
        for name, payload in _item_events(item, index):
            yield sent(name, payload)
    last = "response.incomplete" if response["status"] == "incomplete" else "response.completed"
    yield sent(last, {"response": response})
