"""``[router] stream_mode = "live"`` on ``/v1/responses``: local tokens sent as they come.

    live_events(task, queue, ex, asked, keep, used)
                    the Responses stream of a live local generation: ``response.created``,
                    ``response.in_progress``, the message item and its text part opened, one
                    ``response.output_text.delta`` a token as the model makes it, then the item
                    closed and ``response.completed`` (``response.incomplete`` when cut by
                    ``max_output_tokens``), or ``response.failed`` when the local model fails
                    mid-answer: what was said cannot be taken back, so no fallback then.
                    A thinking model's thinking (``ReasoningText`` pieces) comes first, as a
                    reasoning item (:class:`Thought`) and its ``response.reasoning_text.delta``
                    events; the message item opens at the answer's first token

As on chat, only a local plan with one text answer (no tools) streams live, ungated (reason
``live``); the handler (:mod:`proxy.serving.responses`) falls back to the API, or sends a kept
answer as the ``verify`` stream does, when the model fails or finishes before its first token.
The finished response is stored (``keep``) before its last event is sent, as every other stream.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any

from proxy.engine.reasoning import ReasoningText
from proxy.protocol.responses_answer import Used, response_of, timed_out
from proxy.routing.reasons import Reason
from proxy.routing.router import LocalAttempt
from proxy.serving.exchange import Exchange
from proxy.serving.live import cancel, live_tokens

Keep = Callable[[dict[str, Any]], Awaitable[None]]


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


Event = tuple[str, dict[str, Any]]


class Thought:
    """A thinking model's reasoning item (``proxy.engine.reasoning``), streamed as it comes,
    before the message item: its text in ``response.reasoning_text.delta`` events."""

    def __init__(self) -> None:
        self.id = f"rs_{uuid.uuid4().hex}"
        self.pieces: list[str] = []
        self.at = {"output_index": 0, "item_id": self.id, "content_index": 0}

    def item(self, status: str) -> dict[str, Any]:
        text = "".join(self.pieces)
        return {
            "id": self.id,
            "type": "reasoning",
            "status": status,
            "summary": [],
            "content": [{"type": "reasoning_text", "text": text}]
            if status != "in_progress"
            else [],
            "encrypted_content": None,
        }

    def added(self) -> list[Event]:
        empty = {"type": "reasoning_text", "text": ""}
        return [
            ("response.output_item.added", {"output_index": 0, "item": self.item("in_progress")}),
            ("response.content_part.added", {**self.at, "part": empty}),
        ]

    def delta(self, piece: str) -> Event:
        self.pieces.append(str(piece))
        return "response.reasoning_text.delta", {**self.at, "delta": str(piece)}

    def done(self) -> list[Event]:
        text = "".join(self.pieces)
        part = {"type": "reasoning_text", "text": text}
        return [
            ("response.reasoning_text.done", {**self.at, "text": text}),
            ("response.content_part.done", {**self.at, "part": part}),
            ("response.output_item.done", {"output_index": 0, "item": self.item("completed")}),
        ]


def _open_message(
    thought: Thought | None, message: dict[str, Any], at: dict[str, Any]
) -> list[Event]:
    """The events that close the reasoning item (if any) and open the message after it."""
    events = thought.done() if thought is not None else []
    at["output_index"] = 1 if thought is not None else 0
    return [
        *events,
        ("response.output_item.added", {"output_index": at["output_index"], "item": message}),
        ("response.content_part.added", {**at, "part": _text_part("")}),
    ]


async def live_events(
    task: asyncio.Task[LocalAttempt],
    queue: asyncio.Queue[str],
    ex: Exchange,
    asked: dict[str, Any],
    keep: Keep,
    used: Used,
) -> AsyncGenerator[bytes, None]:
    """The typed events of the live generation ``task`` (its tokens in ``queue``) for the
    checked request ``asked``, each with its ``sequence_number``; ``used``: the engine's
    sampling values where the request named none."""
    sequence = 0

    def sent(name: str, payload: dict[str, Any]) -> bytes:
        nonlocal sequence
        data = json.dumps({"type": name, "sequence_number": sequence, **payload})
        sequence += 1
        return f"event: {name}\ndata: {data}\n\n".encode()

    started = {
        **response_of({}, asked, used),
        "status": "in_progress",
        "completed_at": None,
        "output": [],
        "usage": None,
    }
    message = {
        "id": f"msg_{uuid.uuid4().hex}",
        "type": "message",
        "status": "in_progress",
        "role": "assistant",
        "content": [],
    }
    at = {"output_index": 0, "item_id": message["id"], "content_index": 0}
    thought: Thought | None = None  # a thinking model's reasoning item, before the message
    opened = False
    try:
        yield sent("response.created", {"response": started})
        yield sent("response.in_progress", {"response": started})
        pieces: list[str] = []
        async for token in live_tokens(task, queue):
            if isinstance(token, ReasoningText) and not opened:
                if thought is None:
                    thought = Thought()
                    for added in thought.added():
                        yield sent(*added)
                yield sent(*thought.delta(token))
                continue
            if not opened:
                opened = True
                for event in _open_message(thought, message, at):
                    yield sent(*event)
            pieces.append(token)
            yield sent("response.output_text.delta", {**at, "delta": token, "logprobs": []})
        if not opened:
            for event in _open_message(thought, message, at):
                yield sent(*event)
        text = "".join(pieces)
        attempt = task.result()
        ex.take_local(attempt)
        completion = attempt.completion
        if completion is None:
            ex.local_failed(attempt.reason)
            said = {**message, "status": "incomplete", "content": [_text_part(text)]}
            failed = {
                **started,
                "status": "failed",
                "output": [*([thought.item("incomplete")] if thought else []), said],
                "error": {
                    "code": "server_error",
                    "message": f"the local model failed mid-answer ({attempt.reason})",
                },
            }
            await keep(failed)
            yield sent("response.failed", {"response": failed})
            return
        ex.take_usage(completion.get("usage"))
        ex.keep(completion)
        if attempt.reason == Reason.LOCAL_TIMEOUT:
            ex.local_timed_out()
        final = {**response_of(completion, asked, used), "id": started["id"]}
        said_item = next(i for i in final["output"] if i["type"] == "message")
        item = {**said_item, "id": message["id"], "content": [_text_part(text)]}
        final["output"] = [*([thought.item(item["status"])] if thought else []), item]
        yield sent("response.output_text.done", {**at, "text": text, "logprobs": []})
        yield sent("response.content_part.done", {**at, "part": _text_part(text)})
        if attempt.reason == Reason.LOCAL_TIMEOUT:  # an error, not a limit it reached
            ex.cut_by_deadline()
            final = timed_out(final)
            item = final["output"][-1]
        yield sent("response.output_item.done", {"output_index": at["output_index"], "item": item})
        await keep(final)
        last = {"incomplete": "response.incomplete", "failed": "response.failed"}.get(
            final["status"], "response.completed"
        )
        yield sent(last, {"response": final})
    finally:
        await cancel(task)
