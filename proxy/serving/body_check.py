"""A request body parsed and checked off the event loop when it is large.

Parsing and checking a body is linear in its size, but at 8 MB (``[server] max_body_bytes``) a
body full of tool schemas takes most of a second of CPU. On the event loop that second would be
every other tenant's too: their ``/healthz``, their streams, the upstream connections' pings.

So a body of up to :data:`INLINE_BYTES` is checked where it arrives (the common case, with no
thread hop on the lean path), and a larger one in a thread of :class:`BodyChecker`'s own small
pool. The pool has :data:`WORKERS` threads: with Python's GIL more threads would not check faster,
and each one more would take a turn from the loop. What a check can cost is bounded by the body
limit and by each schema's limits (:data:`quality.schema.MAX_SCHEMA_BYTES`, ``MAX_SCHEMA_DEPTH``);
the worst measured, 10.8 MB of ``functions`` with 160,000 properties, took 0.86 s.

And by time: a body not checked within :data:`CHECK_TIMEOUT_S` (a machine so loaded that the
check, or its wait for a thread, takes that long) gets a 400 naming the schema the check was on
(the checks say each one they reach: :mod:`proxy.protocol.check_progress`), rather than holding its
slot on. The thread finishes its check anyway, within the bounds above; its result is dropped.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

from proxy.errors import BadRequest
from proxy.protocol import check_progress as progress
from proxy.protocol.validate import parse_json

__all__ = ["CHECK_TIMEOUT_S", "INLINE_BYTES", "WORKERS", "BodyChecker"]

INLINE_BYTES = 64 * 1024
"""Largest body checked on the event loop: about 0.3 ms of parsing and checking at most."""
WORKERS = 2
CHECK_TIMEOUT_S = 10.0
"""Longest a body waits for its check in a thread, the wait for a free thread included."""

Check = Callable[[dict[str, Any]], dict[str, Any]]


class Body(Protocol):
    """Where a body is read from: a request whose ``body()`` gives its bytes (Starlette's)."""

    async def body(self) -> bytes: ...


def _parse_and_check(
    raw: bytes, check: Check, holder: dict[str, str] | None = None
) -> dict[str, Any]:
    with progress.reporting_to(holder):
        return check(parse_json(raw))


class BodyChecker:
    """Reads a request's body and returns it parsed and checked (``check``: a BadRequest)."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="frugal-body")

    async def read(self, request: Body, check: Check) -> dict[str, Any]:
        raw = await request.body()
        if len(raw) <= INLINE_BYTES:
            return _parse_and_check(raw, check)
        loop = asyncio.get_running_loop()
        holder: dict[str, str] = {}
        checked = loop.run_in_executor(self._pool, _parse_and_check, raw, check, holder)
        try:
            return await asyncio.wait_for(checked, CHECK_TIMEOUT_S)
        except TimeoutError:
            field = holder.get("field")
            raise BadRequest(
                f"The request body could not be checked within {CHECK_TIMEOUT_S:g} s"
                + (f"; its check was on '{field}': make that schema smaller" if field else "")
                + " (the server may be busy checking other large bodies; try again).",
                param=field,
            ) from None

    def close(self) -> None:
        """Stops taking bodies; a check under way finishes in its thread (bounded, see above)."""
        self._pool.shutdown(wait=False, cancel_futures=True)
