"""The upstream's own Batch API (OpenAI's ``/files`` and ``/batches``), on either route.

:class:`BatchAPI` sends the lines of one upstream as one batch and reads their answers back,
through a :class:`Wire`: :class:`DirectWire`, ``[fallback] api_base`` over the direct route's
pool, or the same wire at a litellm provider's own base and key where its Batch API is OpenAI's
(:mod:`proxy.upstream.litellm_batches`, whose lines are sent under the provider's own model
name):

1. :meth:`~BatchAPI.submit`: one JSONL file uploaded (``POST /files``, purpose ``batch``), one
   batch made of it (``POST /batches``, window ``24h``); the batch's id.
2. :meth:`~BatchAPI.wait`: ``GET /batches/{id}`` until the batch ends (``completed``,
   ``failed``, ``expired`` or ``cancelled``), the waits growing from ``[batch]
   poll_interval_s`` to ``max_poll_interval_s``. A poll that fails for a reason worth trying
   again (a connection, a 429, a 5xx, a timeout: an :class:`~proxy.errors.UpstreamError`) is
   tried again at the next interval, up to :data:`POLL_FAILURES` in a row; a refusal (a 404)
   is raised at once.
3. :meth:`~BatchAPI.collect`: the output file and the error file read (``GET
   /files/{id}/content``), line by line as they arrive: a line with a ``response`` is that
   line's answer (its status code, its body with its usage: a 200, or the API's refusal of that
   line); a line whose ``response`` is null (``batch_expired``, ``batch_cancelled``: it was
   never run, so never billed) leaves its line *unanswered*, for the caller to send again.

Every call runs under the client's :class:`~proxy.upstream.retry.RetryPolicy` (the same rule:
only what the API cannot have done already is retried), and every body read is bounded: a JSON
answer by ``[fallback] max_answer_bytes``; the output file and the error file each by
``[batch] max_output_bytes``, counted as the bytes arrive and never held whole (each line is
parsed, in a thread when it is long, and let go; only the answers to the lines sent are
kept). Past it the read stops, the connection is dropped, and :meth:`~BatchAPI.collect`
raises a 502 naming that key. One line is held up to ``[fallback] max_answer_bytes`` (the
bound of one interactive answer); a longer one is dropped as it arrives and counted as
ignored, and its line, if it was one of ours, stays unanswered. A line whose
``custom_id`` the proxy did not send, a second line for one it did, and a line that is not a
JSON object are ignored and counted (:attr:`Collected.ignored`): a hostile upstream can neither
answer a line twice nor add one. Each line is cleared of the proxy's secrets before it is
parsed, as every relayed answer is.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Sequence
from dataclasses import KW_ONLY, dataclass, field
from typing import Any, Protocol

import structlog

from proxy.config.batch_settings import BatchSettings
from proxy.config.secrets import Secrets
from proxy.errors import ProxyError, UpstreamError, UpstreamStatus, UpstreamTimeout
from proxy.upstream.direct_route import PARSE_IN_THREAD_BYTES, DirectRoute
from proxy.upstream.failures import translate
from proxy.upstream.route import Opened

__all__ = [
    "FINAL",
    "POLL_FAILURES",
    "WAIT_LIMIT_S",
    "BatchAPI",
    "Collected",
    "DirectWire",
    "LineResult",
    "Wire",
]

log = structlog.get_logger("frugal.upstream")

FINAL = frozenset({"completed", "failed", "expired", "cancelled"})
"""The statuses a batch ends in."""
POLL_FAILURES = 10
"""Polls in a row that may fail (each after its own retries) before :meth:`BatchAPI.wait`
gives up and raises the last failure."""
WAIT_LIMIT_S = 25 * 3600.0
"""The longest :meth:`BatchAPI.wait`: OpenAI's window is 24 hours, after which a batch must
have ended (``expired``); an upstream that keeps one ``in_progress`` past this is not waited on."""
INPUT_NAME = "frugal-batch.jsonl"

_encode = json.JSONEncoder(check_circular=False, separators=(",", ":")).encode

Retry = Callable[..., Awaitable[tuple[Any, int]]]


@dataclass(frozen=True, kw_only=True, slots=True)
class LineResult:
    """What the upstream answered to one line: its status and body (the answer, with its
    ``usage``; or OpenAI's ``{"error": ...}`` when it refused the line)."""

    status_code: int
    body: dict[str, Any]
    request_id: str | None = None
    tier: str | None = "batch"
    """The tier the provider bills the call at: ``batch`` for a line of an upstream batch,
    ``flex`` or None (the standard rate) for one sent as its own call."""

    @property
    def ok(self) -> bool:
        return self.status_code == 200

    @property
    def usage(self) -> dict[str, Any] | None:
        usage = self.body.get("usage")
        return usage if isinstance(usage, dict) else None


@dataclass(frozen=True, kw_only=True)
class Collected:
    """A finished batch read back: an answer per ``custom_id`` that has one, and how many
    output lines were ignored (not sent by the proxy, a second answer, not a JSON object)."""

    results: dict[str, LineResult]
    ignored: int


class Wire(Protocol):
    """One way to an upstream's Files and Batch APIs: each method is one attempt (the
    :class:`BatchAPI` retries it), and answers OpenAI's object as a dict."""

    def ready(self) -> None:
        """Raise what no attempt could get past (nothing configured to call)."""

    async def upload(self, content: bytes, request_id: str) -> dict[str, Any]:
        """Upload a JSONL file of purpose ``batch``; its file object."""
        ...

    async def create(self, file_id: str, endpoint: str, request_id: str) -> dict[str, Any]:
        """Make a batch of the file for ``endpoint``, window ``24h``; its batch object."""
        ...

    async def retrieve(self, batch_id: str, request_id: str) -> dict[str, Any]: ...

    async def cancel(self, batch_id: str, request_id: str) -> dict[str, Any]: ...

    async def delete_file(self, file_id: str, request_id: str) -> dict[str, Any]: ...

    async def open_content(self, file_id: str, request_id: str) -> Opened:
        """A file's content, to be read chunk by chunk; returns once the API has answered."""
        ...


class DirectWire:
    """The :class:`Wire` of ``[fallback] api_base``: its ``/files`` and ``/batches`` through
    the direct route's pool."""

    def __init__(self, direct: DirectRoute) -> None:
        self._direct = direct

    def ready(self) -> None:
        self._direct.ready()

    async def upload(self, content: bytes, request_id: str) -> dict[str, Any]:
        form: dict[str, str | tuple[str, bytes]] = {
            "purpose": "batch",
            "file": (INPUT_NAME, content),
        }
        return (await self._direct.send("POST", "/files", request_id, None, form))[1]

    async def create(self, file_id: str, endpoint: str, request_id: str) -> dict[str, Any]:
        body = {"input_file_id": file_id, "endpoint": endpoint, "completion_window": "24h"}
        return (await self._direct.send("POST", "/batches", request_id, body))[1]

    async def retrieve(self, batch_id: str, request_id: str) -> dict[str, Any]:
        return (await self._direct.send("GET", f"/batches/{batch_id}", request_id))[1]

    async def cancel(self, batch_id: str, request_id: str) -> dict[str, Any]:
        path = f"/batches/{batch_id}/cancel"
        return (await self._direct.send("POST", path, request_id, {}))[1]

    async def delete_file(self, file_id: str, request_id: str) -> dict[str, Any]:
        return (await self._direct.send("DELETE", f"/files/{file_id}", request_id))[1]

    async def open_content(self, file_id: str, request_id: str) -> Opened:
        return await self._direct.open_get(f"/files/{file_id}/content", request_id)


@dataclass(eq=False)  # told apart by identity
class BatchAPI:
    """An upstream's Files and Batch APIs, through ``wire``.

    ``retry`` is the client's :meth:`RetryPolicy.run`; ``secrets`` what an answer must not hold;
    ``max_line_bytes`` the longest output line read (``[fallback] max_answer_bytes``); ``model``
    the name every line is sent as, where the wire's upstream knows the model by another name
    than the body says (a litellm provider's, its prefix dropped). Made by
    :meth:`proxy.upstream.client.Upstream.batch_api`.
    """

    wire: Wire
    retry: Retry
    secrets: Secrets = field(repr=False)  # never shown, not even in a repr
    settings: BatchSettings
    _: KW_ONLY
    max_line_bytes: int
    model: str | None = None
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep

    async def _call(
        self, what: str, attempt: Callable[..., Awaitable[dict[str, Any]]], *args: Any
    ) -> dict[str, Any]:
        """One step under the retry policy; its object, which must have an id."""
        self.wire.ready()
        data: Any
        data, _ = await self.retry(attempt, *args)
        if not isinstance(data, dict) or not isinstance(data.get("id"), str):
            raise UpstreamError(f"the upstream API's answer to the batch's {what} had no id")
        return data

    # -- the steps -----------------------------------------------------------------------------

    async def submit(
        self, endpoint: str, lines: Sequence[tuple[str, dict[str, Any]]], *, request_id: str
    ) -> str:
        """Upload ``lines`` (``custom_id``, the body to send) for ``endpoint`` (``/v1/...``) as
        one file and make one batch of it; the batch's id. A batch the upstream refuses to make
        has its file deleted (if it can be) before the refusal is raised."""
        if self.model is not None:
            lines = [(cid, {**body, "model": self.model}) for cid, body in lines]
        content = b"".join(
            _encode({"custom_id": cid, "method": "POST", "url": endpoint, "body": body}).encode()
            + b"\n"
            for cid, body in lines
        )
        uploaded = await self._call("upload", self.wire.upload, content, request_id)
        wire = self.wire
        try:
            made = await self._call("create", wire.create, uploaded["id"], endpoint, request_id)
        except UpstreamStatus:  # refused (a 4xx): the file would be left there for nothing
            with contextlib.suppress(ProxyError):
                await self.delete_file(uploaded["id"], request_id=request_id)
            raise
        log.info("upstream_batch_made", batch=made["id"], lines=len(lines))
        return str(made["id"])

    async def retrieve(self, batch_id: str, *, request_id: str) -> dict[str, Any]:
        """The batch object as the upstream has it now."""
        return await self._call("poll", self.wire.retrieve, batch_id, request_id)

    async def cancel(self, batch_id: str, *, request_id: str) -> dict[str, Any]:
        """Ask the upstream to cancel the batch (it goes ``cancelling``, then ``cancelled``);
        the lines it had answered keep their answers."""
        return await self._call("cancel", self.wire.cancel, batch_id, request_id)

    async def delete_file(self, file_id: str, *, request_id: str) -> None:
        """Delete a file of the upstream's (an input file, or an output once it is kept)."""
        await self._call("file deletion", self.wire.delete_file, file_id, request_id)

    async def wait(
        self, batch_id: str, *, request_id: str, limit_s: float = WAIT_LIMIT_S
    ) -> dict[str, Any]:
        """Poll the batch until it ends; the final batch object. Past ``limit_s`` a 504."""
        s = self.settings
        delay, failures = s.poll_interval_s, 0
        started = time.monotonic()
        while True:
            try:
                batch = await self.retrieve(batch_id, request_id=request_id)
            except UpstreamError:
                failures += 1
                if failures >= POLL_FAILURES:
                    raise
                log.warning("upstream_batch_poll_failed", batch=batch_id, failures=failures)
            else:
                failures = 0
                if batch.get("status") in FINAL:
                    return batch
            if time.monotonic() - started + delay > limit_s:
                raise UpstreamTimeout(
                    f"the upstream batch {batch_id} did not end within {limit_s:g} s"
                )
            await self.sleep(delay)
            delay = min(delay * 2, s.max_poll_interval_s)

    async def collect(
        self, batch: dict[str, Any], sent: Collection[str], *, request_id: str
    ) -> Collected:
        """The answers in a finished ``batch``'s output and error files, for the ``sent``
        custom ids only (each once)."""
        results: dict[str, LineResult] = {}
        ignored = 0
        for key in ("output_file_id", "error_file_id"):
            file_id = batch.get(key)
            if not isinstance(file_id, str) or not file_id:
                continue
            async for raw in self._lines(file_id, request_id):
                if len(raw) > PARSE_IN_THREAD_BYTES:  # the loop is not held by a long line
                    cid, result = await asyncio.to_thread(self._parsed, raw)
                else:
                    cid, result = self._parsed(raw)
                if cid is None or cid not in sent or cid in results:
                    ignored += 1
                    continue
                if result is not None:
                    results[cid] = result
        if ignored:
            log.warning("upstream_batch_lines_ignored", batch=batch.get("id"), ignored=ignored)
        return Collected(results=results, ignored=ignored)

    # -- reading files -------------------------------------------------------------------------

    async def _lines(self, file_id: str, request_id: str) -> AsyncIterator[bytes]:
        """The lines of a file's content, read as they arrive, at most ``max_output_bytes`` in
        all; past it the connection is dropped and a 502 names the key."""
        self.wire.ready()
        opened: Opened
        opened, _ = await self.retry(self.wire.open_content, file_id, request_id)
        limit, line_limit = self.settings.max_output_bytes, self.max_line_bytes
        size = 0
        pending = bytearray()
        skipping = False  # within a line past line_limit: dropped, then given as b"" (ignored)
        try:
            try:
                async for chunk in opened.chunks:
                    size += len(chunk)
                    if size > limit:
                        raise UpstreamError(
                            f"the upstream batch's file {file_id} was too large: more than "
                            f"{limit} bytes ([batch] max_output_bytes)"
                        )
                    seen = len(pending)
                    pending += chunk
                    start, end = 0, pending.find(b"\n", seen)
                    while end >= 0:
                        if skipping or end - start > line_limit:
                            skipping = False
                            yield b""
                        elif pending[start:end].strip():
                            yield bytes(pending[start:end])
                        start, end = end + 1, pending.find(b"\n", end + 1)
                    del pending[:start]
                    if len(pending) > line_limit:
                        pending.clear()
                        skipping = True
            except UpstreamError:
                raise
            except Exception as exc:
                raise translate(exc, 1, streaming=True, secrets=self.secrets) from exc
            if skipping:
                yield b""
            elif pending.strip():
                yield bytes(pending)
        finally:
            await opened.close()

    def _parsed(self, raw: bytes) -> tuple[str | None, LineResult | None]:
        """(custom_id, its result) of one output line; (id, None) for a line never run (its
        ``response`` null: expired, cancelled); (None, None) for a line that makes no sense."""
        try:
            line = json.loads(self.secrets.scrub(raw))
        except ValueError:
            return None, None
        if not isinstance(line, dict) or not isinstance(line.get("custom_id"), str):
            return None, None
        cid: str = line["custom_id"]
        response = line.get("response")
        if response is None:
            return cid, None
        if not isinstance(response, dict):
            return None, None
        status, body = response.get("status_code"), response.get("body")
        if not isinstance(status, int) or isinstance(status, bool) or not isinstance(body, dict):
            return None, None
        rid = response.get("request_id")
        return cid, LineResult(
            status_code=status, body=body, request_id=rid if isinstance(rid, str) else None
        )
