"""A chat completion as a Responses answer: the ``response`` object OpenAI publishes, an
upstream's ``response`` completed where it left out what the schema requires, and a response as
the typed events of a Responses stream. The request's side (a Responses request as the chat
request the cascade answers) is :mod:`proxy.protocol.responses_translate`.

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

The stream is made from the finished answer (as a ``verify`` chat stream is): the cascade judges
the whole answer first, and with ``[fallback] responses = "translate"`` the API is asked for
JSON, so a fallback can still happen before the first event (the API's own ``/v1/responses``
streams its own events, relayed by :mod:`proxy.serving.responses`).
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from proxy.protocol.responses_translate import effort_only
from proxy.protocol.responses_usage import usage_figures

_PIECE = re.compile(r"\s*\S+|\s+")  # a streamed text's deltas: a word and the space before it


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
        "store": False,  # True once proxy.serving.responses has stored it
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
