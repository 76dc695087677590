"""What an API call costs when its answer never reached the client: the provider bills it all the
same, so its ledger row and its key's budget must say so.

    settle_stream(stream, ex, services, body)
                    an API stream the client left (or that broke off): read on, sending
                    nothing, for ``[fallback] usage_wait_s`` so that the usage chunk can come;
                    without it, count what came (:func:`estimate_stream`)
    estimate_stream(generated, ex, services, body)
                    the tokens of what was generated and of the upstream body's prompt side,
                    in the tokenizer of the model the API was asked for (``usage_estimated``);
                    the prompt never below the prompt side of the call's reservation (the
                    exact body posted, images and files at their stated bounds), since the
                    provider billed the prompt whole
    await_abandoned(task, ex, services)
                    a JSON call whose client left while the API worked on it: let it finish
                    within its own timeouts, and charge its usage; when nothing can be known
                    (it broke after the request was sent, or outlived its bound), charge the
                    worst case reserved for it (``worst_case``)
    open_abandoned(opening, ex, services, body)
                    the same for a stream whose client left before upstream's headers came

Each fills the exchange's tokens and ``token_source``; the one ledger row (and the budget's
settle, :func:`proxy.serving.record.finish`) is written from them as for any answer. How each case
is counted is in ``docs/report.md``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import structlog

from proxy.errors import ProxyError
from proxy.ledger.writing.tokens import CountJob
from proxy.serving.exchange import Exchange
from proxy.serving.quotas import worst_case_tokens
from proxy.serving.services import Services
from proxy.upstream.client import UpstreamResponse
from proxy.upstream.failures import maybe_billed
from proxy.upstream.stream import Generated, UpstreamStream

log = structlog.get_logger("frugal.charges")
Answer = TypeVar("Answer", UpstreamResponse, UpstreamStream)

COUNT_WAIT_S = 2.0
"""Longest wait for the tokenizer's count of an abandoned stream; past it, the bytes count."""
BYTES_PER_TOKEN = 4
"""The crude count, when no tokenizer can answer in time: about 4 UTF-8 bytes a token."""
ESTIMATED = "usage_estimated"
WORST_CASE = "worst_case"


async def settle_stream(
    stream: UpstreamStream, ex: Exchange, services: Services, body: dict[str, Any]
) -> None:
    """An API stream's usage on ``ex``, and the stream closed. One that did not run to its end
    (its client left, or it broke off) is read on first, and estimated when no usage came."""
    try:
        if not stream.ended:
            await stream.drain(services.settings.fallback.usage_wait_s)
    finally:
        try:
            await stream.aclose()
        finally:
            ex.take_usage(stream.usage)
            ex.take_billing({"service_tier": stream.service_tier})
    if stream.usage is None and not stream.ended:
        await estimate_stream(stream.generated(), ex, services, body)


def stream_closer(
    stream: UpstreamStream, ex: Exchange, services: Services, body: dict[str, Any], started: float
) -> Callable[[], Awaitable[None]]:
    """``close()`` for an API stream opened at ``started`` (``time.perf_counter()``), run once
    however often it is called: the stream settled (:func:`settle_stream`: closed, its usage,
    or what it was read on for, or an estimate, noted) and ``ex.api_ms`` its time."""
    closed = False

    async def close() -> None:
        nonlocal closed
        if closed:
            return
        closed = True
        try:
            await settle_stream(stream, ex, services, body)
        finally:
            ex.api_timed(started)

    return close


async def estimate_stream(
    generated: Generated, ex: Exchange, services: Services, body: dict[str, Any]
) -> None:
    """Count what the API generated and the prompt it was sent, as its usage would have."""
    model = services.upstream.target(ex.model or "")
    job = CountJob(model=model, body=body, completion=generated.completion())
    try:
        future = services.ledger.counter.submit_estimate(job)
        prompt, completion = await asyncio.wait_for(asyncio.wrap_future(future), COUNT_WAIT_S)
    except Exception as exc:  # noqa: BLE001 - the tokenizer is not there: count bytes instead
        log.warning(
            "usage_estimate_by_bytes",
            request_id=ex.request_id,
            error=type(exc).__name__,
            detail=f"no tokenizer count within {COUNT_WAIT_S} s; about "
            f"{BYTES_PER_TOKEN} bytes a token stand in",
        )
        raw = json.dumps(
            {k: body.get(k) for k in ("messages", "tools", "functions", "response_format")},
            ensure_ascii=False,
        )
        prompt = math.ceil(len(raw.encode()) / BYTES_PER_TOKEN)
        completion = math.ceil(generated.text_bytes() / BYTES_PER_TOKEN)
    # The provider billed the prompt whole, images and files included, which the chat
    # stand-in counted above may leave out: never less than the reservation's prompt side.
    completion = math.ceil(completion * generated.scale)
    ex.charged(max(prompt, _worst_case(ex)[0]), completion, source=ESTIMATED)


def _worst_case(ex: Exchange) -> tuple[int, int]:
    """The (prompt, completion) worst case reserved (or that would be) for ``ex``'s API call,
    from the exact body it posted; (0, 0) when none was made."""
    if ex.worst_body is None:
        return 0, 0
    return worst_case_tokens(
        ex.worst_body, ex.worst_max_output, ex.worst_window, path=ex.worst_path
    )


def charge_worst_case(ex: Exchange) -> None:
    """Nothing is known of what the API did: the worst case reserved for it is charged."""
    if ex.worst_body is None:
        return
    ex.charged(*_worst_case(ex), source=WORST_CASE)


def _bound_s(services: Services) -> float:
    """How long an abandoned call may still take: every attempt's timeout, and a margin."""
    fallback = services.settings.fallback
    return fallback.timeout_s * (fallback.max_retries + 1) + 5.0


async def _outlast(
    call: asyncio.Future[Answer],
    ex: Exchange,
    services: Services,
    given_up: Callable[[asyncio.Future[Answer]], None] | None = None,
) -> Answer | None:
    """``call`` (upstream's answer, or its stream opening) once it ends, within the abandoned
    call's bound. None when it failed (charged at worst case if it may have been billed) or the
    bound passed or the server stops (cancelled, charged at worst case, and ``given_up`` called
    when it ends)."""
    try:
        answer = await asyncio.wait_for(asyncio.shield(call), _bound_s(services))
    except ProxyError as exc:
        ex.api_attempts(exc.attempts)
        if maybe_billed(exc):
            charge_worst_case(ex)
        return None
    except (TimeoutError, asyncio.CancelledError):
        call.cancel()
        if given_up is not None:
            call.add_done_callback(given_up)
        charge_worst_case(ex)
        return None
    ex.api_attempts(answer.attempts)
    return answer


async def await_abandoned(
    task: asyncio.Future[UpstreamResponse], ex: Exchange, services: Services
) -> None:
    """The client left while ``task`` (a JSON call) ran: its usage on ``ex`` once it ends."""
    reply = await _outlast(task, ex, services)
    if reply is None:
        return
    usage = reply.body.get("usage")
    if (
        isinstance(usage, dict)
        and usage.get("prompt_tokens", usage.get("input_tokens")) is not None
    ):
        ex.take_usage(usage)
        ex.take_billing(reply.body)
    else:
        charge_worst_case(ex)


def _close_late(opening: asyncio.Future[UpstreamStream]) -> None:
    """A stream that opened after its wait was given up: closed, not left holding a socket."""
    if not opening.cancelled() and opening.exception() is None:
        asyncio.ensure_future(opening.result().aclose())


async def open_stream(
    opening: asyncio.Future[UpstreamStream],
    ex: Exchange,
    services: Services,
    body: dict[str, Any],
    started: float,
) -> UpstreamStream:
    """The upstream stream that ``opening`` opens (shielded, so that a client who leaves first
    does not cancel a call the API may already bill), with its attempts on ``ex``. A client
    that leaves before it opens gets :func:`open_abandoned`; ``api_ms`` counts from ``started``
    (a ``time.perf_counter()``) when the stream does not open."""
    try:
        stream = await asyncio.shield(opening)
    except ProxyError as exc:
        ex.api_timed(started)
        ex.api_attempts(exc.attempts)
        raise
    except asyncio.CancelledError:
        await open_abandoned(opening, ex, services, body)
        ex.api_timed(started)
        raise
    ex.api_attempts(stream.attempts)
    return stream


async def open_abandoned(
    opening: asyncio.Future[UpstreamStream],
    ex: Exchange,
    services: Services,
    body: dict[str, Any],
) -> None:
    """The client left before upstream's stream answered: the stream, once open, is read on
    for its usage (:func:`settle_stream`), and closed."""
    stream = await _outlast(opening, ex, services, given_up=_close_late)
    if stream is None:
        return
    with contextlib.suppress(Exception):
        await settle_stream(stream, ex, services, body)
