"""A Responses request as a chat request, and a chat completion as a Responses object.

    check_as_chat(body)            a ``/v1/responses`` body checked as the chat request it
                                   becomes (a tool's or a format's JSON Schema, named by its
                                   Responses path): part of the body's check, off the loop
    chat_of(body)                  a checked body, earlier turns and all, as the chat request
                                   the cascade answers (its messages checked as chat)
    response_of(completion, body, used)
                                   the chat completion (local or the API's) as OpenAI's
                                   ``response`` object, usage in the Responses' shape, every
                                   field the published schema requires, with the sampling
                                   values ``used`` (:func:`local_used`, :data:`API_USED`)
    timed_out(response)            a local response the deadline cut, as ``failed``
    completed(response, body)      an upstream's ``response`` with what the schema requires and
                                   it left out filled in (:data:`FILLED`), from the request;
                                   ``completed_item`` and ``completed_part`` do the same for
                                   the items and parts of its stream's events
    events(response)               that response as the typed events of a Responses stream,
                                   each with its ``sequence_number``
    stand_in(body)                 the body without what only OpenAI's own /v1/responses can
                                   do (built-in tools, ``reasoning``, image and file parts),
                                   and what was taken out: the chat the cascade plans, budgets
                                   and (when nothing was) answers
    completion_of(response)        a Responses answer (the API's own) as a chat completion, for
                                   an audit's reference
    effort_only(body)              the ``reasoning.effort`` of a body that asks nothing else of
                                   ``reasoning``: chat's ``reasoning_effort``

The stream is made from the finished answer (as a ``verify`` chat stream is): the cascade judges
the whole answer first, and with ``[fallback] responses = "translate"`` the API is asked for
JSON, so a fallback can still happen before the first event (the API's own ``/v1/responses``
streams its own events, relayed by :mod:`proxy.server.responses`). Storing it is
:mod:`proxy.server.responses`'s.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from proxy.errors import BadRequest
from proxy.protocol.responses_shapes import (
    LATER_ITEMS,
    LATER_PARTS,
    LATER_TOOLS,
    TEXT_PARTS,
    asks,
)
from proxy.protocol.responses_usage import usage_figures
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


# -- the answer --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Used:
    """The sampling values a route uses when the request names none, echoed as the published
    schema asks (numbers, never null): the local engine samples greedily (temperature 0, top_p
    1, :class:`proxy.engine.sampling.SamplingParams`) up to ``[local] default_max_tokens``; the
    API's documented defaults are 1 and 1, its limit its own (null)."""

    temperature: float
    top_p: float
    max_output_tokens: int | None = None


API_USED = Used(temperature=1.0, top_p=1.0)


def local_used(default_max_tokens: int) -> Used:
    """What the local engine uses: greedy sampling, ``[local] default_max_tokens``."""
    return Used(temperature=0.0, top_p=1.0, max_output_tokens=default_max_tokens)


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def _usage(usage: dict[str, Any]) -> dict[str, Any]:
    prompt, completion, cached, reasoning, total = usage_figures(usage, "prompt", "completion")
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": reasoning},
        "total_tokens": total,
    }


def _output(message: dict[str, Any], status: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    thinking = message.get("reasoning_content")
    if thinking is not None:  # a local model that thinks (proxy.engine.reasoning)
        items.append(
            {
                "id": _id("rs"),
                "type": "reasoning",
                "status": status,
                "summary": [],
                "content": [{"type": "reasoning_text", "text": thinking}],
                "encrypted_content": None,
            }
        )
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


def response_of(
    completion: dict[str, Any], body: dict[str, Any], used: Used = API_USED
) -> dict[str, Any]:
    """The chat ``completion`` (to the Responses ``body``) as OpenAI's ``response`` object, with
    the values ``used`` where the request named none."""
    choice = (completion.get("choices") or [{}])[0]
    finish = choice.get("finish_reason")
    incomplete = {"length": "max_output_tokens", "content_filter": "content_filter"}.get(
        finish or ""
    )
    status = "incomplete" if incomplete else "completed"
    text = body.get("text") or {}
    created = int(completion.get("created") or time.time())
    asked_limit = body.get("max_output_tokens")
    return {
        "id": _id("resp"),
        "object": "response",
        "created_at": created,
        "completed_at": max(created, int(time.time())) if status == "completed" else None,
        "status": status,
        "background": False,
        "error": None,
        "incomplete_details": {"reason": incomplete} if incomplete else None,
        "instructions": body.get("instructions"),
        "max_output_tokens": used.max_output_tokens if asked_limit is None else asked_limit,
        "max_tool_calls": body.get("max_tool_calls"),
        "metadata": body.get("metadata") or {},
        "model": completion.get("model") or body["model"],
        "output": _output(choice.get("message") or {}, status),
        "parallel_tool_calls": body.get("parallel_tool_calls") is not False,
        "previous_response_id": None,
        "reasoning": {"effort": effort_only(body), "summary": None},
        "store": False,  # True once proxy.server.responses has stored it
        "temperature": _number(body.get("temperature"), used.temperature),
        "text": {
            "format": text.get("format") or {"type": "text"},
            "verbosity": text.get("verbosity") or "medium",
        },
        "tool_choice": body.get("tool_choice") or "auto",
        "tools": [{"strict": None, "parameters": None, **tool} for tool in body.get("tools") or []],
        "top_p": _number(body.get("top_p"), used.top_p),
        "presence_penalty": 0.0,  # not a Responses parameter: never applied
        "frequency_penalty": 0.0,
        "top_logprobs": body.get("top_logprobs") or 0,
        "truncation": body.get("truncation") or "disabled",
        "usage": _usage(completion.get("usage") or {}),
        "user": body.get("user"),
        "service_tier": completion.get("service_tier") or "default",
        "safety_identifier": body.get("safety_identifier"),
        "prompt_cache_key": body.get("prompt_cache_key"),
    }


def timed_out(response: dict[str, Any]) -> dict[str, Any]:
    """A local ``response`` that the deadline (``[local] timeout_s``) cut, as the error it is:
    ``failed``, ``error.code`` ``server_error``, what was said kept (its items ``incomplete``),
    never ``incomplete`` with ``max_output_tokens``, a limit it did not reach."""
    said = (response.get("usage") or {}).get("output_tokens", 0)
    message = f"the local model's deadline ([local] timeout_s) passed after {said} output tokens"
    return {
        **response,
        "status": "failed",
        "completed_at": None,
        "incomplete_details": None,
        "error": {"code": "server_error", "message": message},
        "output": [{**item, "status": "incomplete"} for item in response.get("output") or []],
    }


def _number(value: Any, default: float) -> float:
    return default if value is None else float(value)


# What an upstream's response may leave out (llama-server and vLLM leave out many), and what
# takes its place: the request's own value, else what OpenAI documents as the default. A field
# of a type that excludes null is filled when null, too (the first group).
_Fill = Callable[[dict[str, Any], dict[str, Any]], Any]
FILLED: dict[str, _Fill] = {
    "temperature": lambda _r, body: _number(body.get("temperature"), API_USED.temperature),
    "top_p": lambda _r, body: _number(body.get("top_p"), API_USED.top_p),
    "presence_penalty": lambda _r, _b: 0.0,
    "frequency_penalty": lambda _r, _b: 0.0,
    "top_logprobs": lambda _r, body: body.get("top_logprobs") or 0,
    "service_tier": lambda _r, body: "default",
    "parallel_tool_calls": lambda _r, body: body.get("parallel_tool_calls") is not False,
    "tools": lambda _r, body: body.get("tools") or [],
    "output": lambda _r, _b: [],
    "metadata": lambda _r, body: body.get("metadata") or {},
    "background": lambda _r, _b: False,
    "store": lambda _r, _b: False,
    "created_at": lambda _r, _b: int(time.time()),
    "tool_choice": lambda _r, body: body.get("tool_choice") or "auto",
    "truncation": lambda _r, body: body.get("truncation") or "disabled",
    "text": lambda _r, body: {"format": {"type": "text"}, **(body.get("text") or {})},
    # These may be null: filled only when left out.
    "completed_at": lambda r, _b: int(time.time()) if r.get("status") == "completed" else None,
    "error": lambda _r, _b: None,
    "incomplete_details": lambda _r, _b: None,
    "instructions": lambda _r, body: body.get("instructions"),
    "previous_response_id": lambda _r, _b: None,
    "reasoning": lambda _r, body: body.get("reasoning"),
    "usage": lambda _r, _b: None,
    "user": lambda _r, body: body.get("user"),
    "max_output_tokens": lambda _r, body: body.get("max_output_tokens"),
    "max_tool_calls": lambda _r, body: body.get("max_tool_calls"),
    "safety_identifier": lambda _r, body: body.get("safety_identifier"),
    "prompt_cache_key": lambda _r, body: body.get("prompt_cache_key"),
}
_NOT_NULL = frozenset(list(FILLED)[: list(FILLED).index("completed_at")])


def completed(response: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
    """An upstream's ``response`` to the Responses ``body`` with each field of :data:`FILLED`
    it left out (or, where the schema excludes null, sent as null) filled in; a ``message``
    item's text parts get the ``annotations`` and ``logprobs`` the schema requires, a function
    tool its ``strict`` and ``parameters`` (null), the usage
    its token details (0 where not said). Nothing it sent is changed."""
    out = dict(response)
    out.setdefault("object", "response")
    out.setdefault("status", "completed")
    for name, fill in FILLED.items():
        if name not in out or (out[name] is None and name in _NOT_NULL):
            out[name] = fill(out, body)
    if isinstance(out.get("output"), list):
        out["output"] = [completed_item(item) for item in out["output"]]
    if isinstance(out.get("tools"), list):
        out["tools"] = [
            {"strict": None, "parameters": None, **t}
            if isinstance(t, dict) and t.get("type") == "function"
            else t
            for t in out["tools"]
        ]
    usage = out.get("usage")
    if isinstance(usage, dict):
        usage = out["usage"] = {**usage}
        for name, detail in (("input", "cached_tokens"), ("output", "reasoning_tokens")):
            details = usage.get(f"{name}_tokens_details")
            usage[f"{name}_tokens_details"] = {detail: 0, **(details or {})}
        usage["input_tokens_details"].setdefault("cache_write_tokens", 0)
    return out


def completed_item(item: Any, status: str = "completed") -> Any:
    """An upstream's output ``item`` with what the schema requires of a ``message`` (its
    ``status``, and each text part's ``annotations`` and ``logprobs``) filled in."""
    if not isinstance(item, dict) or item.get("type") != "message":
        return item
    content = item.get("content")
    if not isinstance(content, list):
        return item
    return {"status": status, **item, "content": [completed_part(p) for p in content]}


def completed_part(part: Any) -> Any:
    """An upstream's ``output_text`` part with the ``annotations`` and ``logprobs`` the schema
    requires (empty when it sent none)."""
    if isinstance(part, dict) and part.get("type") == "output_text":
        return {"annotations": [], "logprobs": [], **part}
    return part


# -- the stream --------------------------------------------------------------------------------


def _sse(name: str, payload: dict[str, Any]) -> bytes:
    data = json.dumps({"type": name, **payload}, separators=(",", ":"))
    return f"event: {name}\ndata: {data}\n\n".encode()


def _item_events(item: dict[str, Any], index: int) -> Iterator[tuple[str, dict[str, Any]]]:
    at = {"output_index": index, "item_id": item["id"]}
    if item["type"] == "reasoning" and item.get("content"):
        yield from _reasoning_events(item, index)
        return
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


def _reasoning_events(item: dict[str, Any], index: int) -> Iterator[tuple[str, dict[str, Any]]]:
    """A local model's thinking as OpenAI streams a reasoning item's text: the item, then each
    ``reasoning_text`` part's deltas and its end."""
    at = {"output_index": index, "item_id": item["id"]}
    yield (
        "response.output_item.added",
        {"output_index": index, "item": {**item, "status": "in_progress", "content": []}},
    )
    for k, part in enumerate(item["content"]):
        at_part = {**at, "content_index": k}
        yield "response.content_part.added", {**at_part, "part": {**part, "text": ""}}
        for piece in _PIECE.findall(part["text"]):
            yield "response.reasoning_text.delta", {**at_part, "delta": piece}
        yield "response.reasoning_text.done", {**at_part, "text": part["text"]}
        yield "response.content_part.done", {**at_part, "part": part}
    yield "response.output_item.done", {"output_index": index, "item": item}


def events(response: dict[str, Any]) -> Iterator[bytes]:
    """The finished ``response`` as OpenAI streams one: created, in_progress, each item's
    events, then completed (or incomplete)."""
    started = {**response, "status": "in_progress", "output": [], "usage": None}
    started["incomplete_details"] = started["completed_at"] = None
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
    last = {"incomplete": "response.incomplete", "failed": "response.failed"}.get(
        response["status"], "response.completed"
    )
    yield sent(last, {"response": response})
