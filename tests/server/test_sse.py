"""EventStream's end, driven through ASGI messages: ``on_end`` says whether the client had the
whole answer, which decides a stream's ledger status (200, or 499 ``client_gone``)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

from starlette.types import Message

from proxy.server.sse import DONE, EventStream

SCOPE = {"type": "http", "method": "POST", "path": "/", "headers": []}


async def _run(chunks: AsyncGenerator[bytes, None], leave_after: bytes | None) -> list[bool]:
    """Serve ``chunks``; the client leaves once it has received ``leave_after`` (never: None).
    Returns what ``on_end`` was called with."""
    ends: list[bool] = []
    left = asyncio.Event()

    async def receive() -> Message:
        await left.wait()
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        if leave_after is not None and message.get("body", b"").endswith(leave_after):
            left.set()

    stream = EventStream(chunks, headers={}, on_end=ends.append)
    await asyncio.wait_for(stream(SCOPE, receive, send), 10)
    return ends


async def test_a_client_that_closes_right_after_done_had_the_whole_answer() -> None:
    async def chunks() -> AsyncGenerator[bytes, None]:
        try:
            yield b"data: {}\n\n"
            yield DONE
        finally:
            await asyncio.sleep(0.2)  # the body's clean-up (an upstream close) takes a moment

    assert await _run(chunks(), leave_after=DONE) == [True]


async def test_a_client_that_leaves_before_done_left_early() -> None:
    async def chunks() -> AsyncGenerator[bytes, None]:
        yield b"data: {}\n\n"
        await asyncio.sleep(5)  # still generating when the client goes
        yield DONE

    assert await _run(chunks(), leave_after=b"data: {}\n\n") == [False]


async def test_a_stream_that_ends_with_its_client_still_there_finished() -> None:
    async def chunks() -> AsyncGenerator[bytes, None]:
        yield b"data: {}\n\n"
        yield DONE

    assert await _run(chunks(), leave_after=None) == [True]
