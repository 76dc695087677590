"""``[router] stream_mode = "live"`` on ``/v1/responses``: local tokens sent as they come.

    live_events(task, queue, ex, asked, keep, used)
                    the Responses stream of a live local generation: ``response.created``,
                    ``response.in_progress``, the message item and its text part opened, one
                    ``response.output_text.delta`` a token as the model makes it, then the item
                    closed and ``response.completed`` (``response.incomplete`` when cut by
                    ``max_output_tokens``), or ``response.failed`` when the local model fails
                    mid-answer: what was said cannot be taken back, so no fallback then

As on chat, only a local plan with one text answer (no tools) streams live, ungated (reason
``live``); the handler (:mod:`proxy.http.responses`) falls back to the API, or sends a kept
answer as the ``verify`` stream does, when the model fails or finishes before its first token.
The finished response is stored (``keep``) before its last event is sent, as every other stream.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any

from proxy.http.chat import cancel, live_tokens
from proxy.http.exchange import Exchange
from proxy.http.responses_translate import Used, response_of, timed_out
from proxy.routing.reasons import Reason
from proxy.routing.router import LocalAttempt

Keep = Callable[[dict[str, Any]], Awaitable[None]]


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


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
    try:
        yield sent("response.created", {"response": started})
        yield sent("response.in_progress", {"response": started})
        yield sent("response.output_item.added", {"output_index": 0, "item": message})
        yield sent("response.content_part.added", {**at, "part": _text_part("")})
        pieces: list[str] = []
        async for token in live_tokens(task, queue):
            pieces.append(token)
            yield sent("response.output_text.delta", {**at, "delta": token, "logprobs": []})
        text = "".join(pieces)
        attempt = task.result()
        ex.take_local(attempt)
        completion = attempt.completion
        if completion is None:
            ex.error = attempt.reason
            said = {**message, "status": "incomplete", "content": [_text_part(text)]}
            failed = {
                **started,
                "status": "failed",
                "output": [said],
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
            ex.reason = Reason.LOCAL_TIMEOUT
        final = {**response_of(completion, asked, used), "id": started["id"]}
        item = {**final["output"][0], "id": message["id"], "content": [_text_part(text)]}
        final["output"] = [item]
        yield sent("response.output_text.done", {**at, "text": text, "logprobs": []})
        yield sent("response.content_part.done", {**at, "part": _text_part(text)})
        if attempt.reason == Reason.LOCAL_TIMEOUT:  # an error, not a limit it reached
            ex.error = attempt.reason
            final = timed_out(final)
            item = final["output"][0]
        yield sent("response.output_item.done", {"output_index": 0, "item": item})
        await keep(final)
        last = {"incomplete": "response.incomplete", "failed": "response.failed"}.get(
            final["status"], "response.completed"
        )
        yield sent(last, {"response": final})
    finally:
        await cancel(task)
