"""``POST /v1/chat/completions``: the cascade as HTTP.

Every path through here ends in exactly one ledger row, written from a ``finally`` so that
failures are counted too. A stream's row is written by its response
(:class:`proxy.http.sse.EventStream`) when the last byte has gone out, or when the client left,
even before the stream's first byte: then its status is 499 and its error ``client_gone``. A
client that leaves stops the work done for it in every mode: a local generation is cancelled
(``live`` streams included), an upstream stream is closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncGenerator, AsyncIterator, Iterable
from dataclasses import dataclass, field
from typing import Any

import structlog
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from proxy.errors import (
    BadRequest,
    LocalUnavailable,
    ProxyError,
    map_upstream_exception,
)
from proxy.http import sse
from proxy.http.validate import chat_request, parse_json
from proxy.ledger.pricing import CountJob, estimate_costs
from proxy.routing.estimator import Prediction
from proxy.routing.router import LOCAL_ALIAS, LocalAttempt, Plan, Router
from proxy.routing.servable import live_streamable

log = structlog.get_logger("frugal.request")

PUSD_PER_USD = 10**12

SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}


@dataclass
class Exchange:
    """What one request did, gathered as it goes, for the headers, the log and the ledger."""

    request_id: str
    endpoint: str = "chat.completions"  # the ledger's name: chat.completions | completions | ...
    started: float = field(default_factory=time.perf_counter)
    arrived: float = field(default_factory=time.time)
    model: str | None = None
    stream: bool = False
    route: str = "none"
    reason: str = "error"
    status: int = 200
    quality: float | None = None
    quality_reasons: list[str] = field(default_factory=list)
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int = 0
    local_prompt_tokens: int | None = None
    local_completion_tokens: int | None = None
    local_ms: float = 0.0
    api_ms: float = 0.0
    api_usage_model: str | None = None
    error: str | None = None
    body: dict[str, Any] | None = None  # the validated request, for the ledger's token count
    local_completion: dict[str, Any] | None = None
    key_name: str | None = None  # the client key's name, never the key
    content_in: Any = None  # messages and answer text: kept only when [server] log_content
    content_out: list[str] | None = None
    predicted_local_ms: float | None = None  # the router's prediction (proxy.routing)
    actual_local_ms: float | None = None
    backend: str | None = None
    predicted_completion_tokens: int | None = None
    upstream_attempts: int | None = None  # HTTP attempts made upstream, retries included
    recorded: bool = False  # its ledger row is written (once, whatever happens after)

    def headers(self) -> dict[str, str]:
        return {
            "x-request-id": self.request_id,
            "x-frugal-route": self.route,
            "x-frugal-reason": self.reason,
            "x-frugal-quality": "none" if self.quality is None else f"{self.quality:.3f}",
        }

    def take_plan(self, plan: Plan) -> None:
        if plan.choice is not None:
            self.take_prediction(plan.choice.prediction)

    def take_prediction(self, prediction: Prediction) -> None:
        self.backend = prediction.backend
        self.predicted_completion_tokens = round(prediction.completion_tokens)
        if prediction.seconds is not None:
            self.predicted_local_ms = round(prediction.seconds * 1000, 2)

    def take_local(self, attempt: LocalAttempt) -> None:
        self.local_ms = attempt.elapsed_ms
        if attempt.prediction is not None:
            self.take_prediction(attempt.prediction)
        if attempt.choice is not None:
            self.backend = attempt.choice.backend.name  # where it ran, if it was moved
        if attempt.actual_s is not None:
            self.actual_local_ms = round(attempt.actual_s * 1000, 2)
        self.local_completion = attempt.completion
        self.quality = attempt.quality
        self.quality_reasons = attempt.quality_reasons
        if attempt.completion is not None:
            usage = attempt.completion.get("usage") or {}
            self.local_prompt_tokens = usage.get("prompt_tokens")
            self.local_completion_tokens = usage.get("completion_tokens")

    def take_usage(self, usage: dict[str, Any] | None) -> None:
        if usage:
            self.prompt_tokens = usage.get("prompt_tokens")
            self.completion_tokens = usage.get("completion_tokens")
            details = usage.get("prompt_tokens_details") or {}
            self.cached_tokens = int(details.get("cached_tokens") or 0)

    def keep(self, completion: dict[str, Any]) -> None:
        """Keep the answer's text for the content log (only when it is on)."""
        if self.content_out is not None:
            for choice in completion.get("choices") or []:
                self.content_out.append(str((choice.get("message") or {}).get("content") or ""))

    def keep_sse(self, chunk: bytes) -> None:
        if self.content_out is None:
            return
        for line in chunk.split(b"\n"):
            if line.startswith(b"data: {"):
                with contextlib.suppress(ValueError, AttributeError, IndexError, TypeError):
                    delta = json.loads(line[6:])["choices"][0]["delta"]
                    self.content_out.append(str(delta.get("content") or ""))


class ChatHandler:
    def __init__(self, state: Any) -> None:
        self.state = state
        self.router: Router = state.router

    # -- entry ------------------------------------------------------------------------------

    async def __call__(self, request: Request) -> Response:
        ex = Exchange(
            request_id=request.state.request_id,
            key_name=getattr(request.state, "key_name", None),
        )
        log_content = self.state.settings.server.log_content
        if log_content:
            ex.content_out = []
        streaming = False
        try:
            body = chat_request(parse_json(await request.body()))
            if log_content:
                ex.content_in = body.get("messages")
            ex.model = body["model"]
            ex.body = body
            ex.stream = bool(body.get("stream"))
            plan = self.router.plan(body, request.headers.get("x-frugal-route"))
            ex.take_plan(plan)
            threshold = self.router.threshold(
                request.headers.get("x-frugal-min-quality"), body["model"]
            )
            if ex.stream:
                response = await self._stream(body, plan, threshold, ex)
                streaming = isinstance(response, sse.EventStream)
                return response
            return await self._json(body, plan, threshold, ex)
        except ProxyError as exc:
            ex.status = exc.status
            ex.error = exc.code or exc.type
            if isinstance(exc, BadRequest):
                ex.reason = "bad_request"
            raise
        except asyncio.CancelledError:
            # The client disconnected before its answer was ready (see proxy/http/disconnect.py).
            ex.status = 499
            ex.error = "client_gone"
            raise
        except BaseException:
            ex.status = 500
            ex.error = "internal_error"
            raise
        finally:
            if not streaming:
                self._finish(ex)

    # -- JSON -------------------------------------------------------------------------------

    async def _json(
        self, body: dict[str, Any], plan: Plan, threshold: float, ex: Exchange
    ) -> Response:
        if plan.route == "local":
            attempt = await self.router.try_local(body, threshold=threshold, plan=plan)
            ex.take_local(attempt)
            answer = self._local_answer(body, attempt, plan, ex)
            if answer is not None:
                ex.keep(answer)
                return JSONResponse(answer, headers=ex.headers())
        else:
            ex.reason = plan.reason
        ex.route = "api"
        upstream = self.state.upstream
        try:
            reply = await upstream.chat(body, request_id=ex.request_id)
        except Exception as exc:
            ex.upstream_attempts = getattr(exc, "attempts", None)
            raise map_upstream_exception(exc) from exc
        finally:
            ex.api_ms = (time.perf_counter() - ex.started) * 1000 - ex.local_ms
        ex.upstream_attempts = reply.attempts
        ex.take_usage(reply.body.get("usage"))
        ex.keep(reply.body)
        # Upstream's bytes go back as they came: parsed once for the usage, not encoded again.
        return Response(reply.raw, media_type="application/json", headers=ex.headers())

    def _local_answer(
        self, body: dict[str, Any], attempt: LocalAttempt, plan: Plan, ex: Exchange
    ) -> dict[str, Any] | None:
        """The local answer to send, None to go to the API; raises when neither is possible."""
        completion = attempt.completion
        if attempt.accepted or (completion is not None and plan.local_only):
            ex.route, ex.reason = "local", "forced" if plan.forced else attempt.reason
        elif completion is not None and not self.router.fallback_enabled:
            ex.route, ex.reason = "local", "no_fallback"
        elif completion is None and (plan.local_only or not self.router.fallback_enabled):
            ex.reason = attempt.reason if plan.local_only else "no_fallback"
            if attempt.reason == "context_overflow":
                raise BadRequest(
                    f"the conversation does not fit the local model's context: {attempt.error}",
                    param="messages",
                    code="context_length_exceeded",
                )
            raise LocalUnavailable(
                f"the local model could not answer ({attempt.reason}) and no API fallback "
                "is " + ("allowed for model 'local'" if plan.local_only else "configured")
            )
        else:
            ex.reason = attempt.reason
            return None
        assert completion is not None
        ex.take_usage(completion.get("usage"))
        return public_completion(completion, body)

    # -- streaming --------------------------------------------------------------------------

    async def _stream(
        self, body: dict[str, Any], plan: Plan, threshold: float, ex: Exchange
    ) -> Response:
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        with_logprobs = bool(body.get("logprobs"))
        if plan.route == "local":
            mode = self.state.settings.router.stream_mode
            if mode == "live" and live_streamable(body):
                live = await self._live(body, plan, threshold, ex, include_usage)
                if live is not None:
                    return live
            else:
                attempt = await self.router.try_local(body, threshold=threshold, plan=plan)
                ex.take_local(attempt)
                answer = self._local_answer(body, attempt, plan, ex)
                if answer is not None:
                    ex.keep(answer)
                    chunks = sse.replay(
                        answer, include_usage=include_usage, with_logprobs=with_logprobs
                    )
                    return self._sse(_aiter(chunks), ex)
        else:
            ex.reason = plan.reason
        ex.route = "api"
        started = time.perf_counter()
        try:
            upstream_stream = await self.state.upstream.chat_stream(body, request_id=ex.request_id)
        except Exception as exc:
            ex.api_ms = (time.perf_counter() - started) * 1000
            ex.upstream_attempts = getattr(exc, "attempts", None)
            raise map_upstream_exception(exc) from exc
        ex.upstream_attempts = getattr(upstream_stream, "attempts", None)
        closed = False

        async def close() -> None:
            """Once: the upstream connection closed, its time and usage noted."""
            nonlocal closed
            if closed:
                return
            closed = True
            ex.api_ms = (time.perf_counter() - started) * 1000
            try:
                await upstream_stream.aclose()
            finally:
                ex.take_usage(getattr(upstream_stream, "usage", None))

        return self._sse(self._relay(upstream_stream, ex, close), ex, cleanups=(close,))

    async def _relay(
        self, stream: AsyncIterator[bytes], ex: Exchange, close: sse.Cleanup
    ) -> AsyncGenerator[bytes, None]:
        try:
            async for chunk in stream:
                ex.keep_sse(chunk)
                yield chunk
        except Exception as exc:
            err = map_upstream_exception(exc)
            ex.error = err.code or "stream_cut"
            yield sse.error_event(err.message, code=err.code)
            yield sse.DONE
        finally:
            await close()

    async def _live(
        self,
        body: dict[str, Any],
        plan: Plan,
        threshold: float,
        ex: Exchange,
        include_usage: bool,
    ) -> Response | None:
        """Stream local tokens as they come; only a failure before the first one falls back."""
        queue: asyncio.Queue[str] = asyncio.Queue()
        task = asyncio.create_task(
            self.router.try_local(body, threshold=threshold, on_token=queue.put_nowait, plan=plan)
        )
        first = asyncio.ensure_future(queue.get())
        try:
            await asyncio.wait({task, first}, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            # The client left before the first token: stop the generation made for it.
            first.cancel()
            await _cancel(task)
            raise
        if not first.done():
            first.cancel()
            attempt = task.result()
            ex.take_local(attempt)
            if attempt.completion is None or not (
                attempt.completion["choices"][0]["message"].get("content")
            ):
                # Nothing was said yet: the cascade may still fall back.
                answer = self._local_answer(body, attempt, plan, ex)
                if answer is None:
                    return None
                ex.keep(answer)
                chunks = sse.replay(answer, include_usage=include_usage, with_logprobs=False)
                return self._sse(_aiter(chunks), ex)
            queue.put_nowait(attempt.completion["choices"][0]["message"]["content"])
        else:
            queue.put_nowait(first.result())
        ex.route, ex.reason = "local", "forced" if plan.forced else "live"

        async def stop() -> None:
            await _cancel(task)

        return self._sse(self._live_chunks(task, queue, ex, include_usage), ex, cleanups=(stop,))

    async def _live_chunks(
        self,
        task: asyncio.Task[LocalAttempt],
        queue: asyncio.Queue[str],
        ex: Exchange,
        include_usage: bool,
    ) -> AsyncGenerator[bytes, None]:
        writer = sse.ChunkWriter("chatcmpl-live-" + ex.request_id[:16], "local")
        yield writer.role()
        try:
            while True:
                if not queue.empty():
                    yield writer.text(queue.get_nowait())
                    continue
                if task.done():
                    break
                getter = asyncio.ensure_future(queue.get())
                try:
                    await asyncio.wait({task, getter}, return_when=asyncio.FIRST_COMPLETED)
                except BaseException:
                    getter.cancel()
                    raise
                if getter.done():
                    yield writer.text(getter.result())
                else:
                    getter.cancel()
            attempt = task.result()
            ex.take_local(attempt)
            completion = attempt.completion
            if completion is None:
                ex.error = attempt.reason
                yield sse.error_event(
                    f"the local model failed mid-answer ({attempt.reason})",
                    type_="server_error",
                    code=attempt.reason,
                )
                yield sse.DONE
                return
            ex.take_usage(completion.get("usage"))
            ex.keep(completion)
            if attempt.reason == "local_timeout":
                ex.reason = "local_timeout"
            yield writer.finish(completion["choices"][0].get("finish_reason") or "stop")
            if include_usage:
                yield writer.usage(sse.public_usage(completion.get("usage") or {}))
            yield sse.DONE
        finally:
            await _cancel(task)

    def _sse(
        self,
        chunks: AsyncGenerator[bytes, None],
        ex: Exchange,
        *,
        cleanups: Iterable[sse.Cleanup] = (),
    ) -> sse.EventStream:
        """The SSE response of ``chunks``; it writes the row when it ends, however it ends."""

        async def body() -> AsyncGenerator[bytes, None]:
            try:
                async for chunk in chunks:
                    yield chunk
            except Exception as exc:  # noqa: BLE001 - the status line is already out
                ex.error = "stream_failed"
                log.error("stream_failed", request_id=ex.request_id, error=type(exc).__name__)
                yield sse.error_event("the stream failed", type_="server_error")
                yield sse.DONE
            finally:
                await chunks.aclose()

        def on_end(finished: bool) -> None:
            if not finished:  # the client left before the end (or before the first byte)
                ex.status, ex.error = 499, "client_gone"
            self._finish(ex)

        return sse.EventStream(
            body(),
            headers={**SSE_HEADERS, **ex.headers()},
            on_end=on_end,
            cleanups=tuple(cleanups),
        )

    # -- ledger and log ---------------------------------------------------------------------

    def _finish(self, ex: Exchange) -> None:
        """Write the exchange's ledger row, log line and metrics; once, later calls do nothing."""
        if ex.recorded:
            return
        ex.recorded = True
        latency_ms = (time.perf_counter() - ex.started) * 1000
        model = ex.model or ""
        row = {
            "request_id": ex.request_id,
            "ts": ex.arrived,
            "endpoint": ex.endpoint,
            "requested_model": ex.model,
            "route": ex.route,
            "reason": ex.reason,
            "status": ex.status,
            "stream": int(ex.stream),
            "quality": ex.quality,
            "quality_reasons": ",".join(ex.quality_reasons[:3]) or None,
            "prompt_tokens": ex.prompt_tokens,
            "completion_tokens": ex.completion_tokens,
            "local_prompt_tokens": ex.local_prompt_tokens,
            "local_completion_tokens": ex.local_completion_tokens,
            "latency_ms": round(latency_ms, 2),
            "local_ms": round(ex.local_ms, 2),
            "api_ms": round(ex.api_ms, 2),
            "error": ex.error,
            "key_name": ex.key_name,
            "api_model": self.state.upstream.target(model) if model != LOCAL_ALIAS else None,
            "cached_tokens": ex.cached_tokens,
            "predicted_local_ms": ex.predicted_local_ms,
            "actual_local_ms": ex.actual_local_ms,
            "backend": ex.backend,
            "predicted_completion_tokens": ex.predicted_completion_tokens,
            "upstream_attempts": ex.upstream_attempts,
        }
        # Costs for the log and the metrics now; the ledger prices the row itself, recounting
        # a local answer with the requested model's tokenizer off the request path.
        api_cost, counterfactual = estimate_costs(row, self.state.prices)
        count = None
        if ex.route == "local" and ex.status < 400 and ex.body and ex.local_completion:
            count = CountJob(model=model, body=ex.body, completion=ex.local_completion)
        self.state.ledger.record(row, count=count)
        self.router.observe(row)
        # A client that left mid-stream still cost what upstream reported for it.
        paid = api_cost if ex.status < 400 or ex.status == 499 else None
        self.state.metrics.observe(
            endpoint=ex.endpoint,
            route=ex.route,
            reason=ex.reason,
            status=ex.status,
            latency_s=latency_ms / 1000,
            prompt_tokens=ex.prompt_tokens,
            completion_tokens=ex.completion_tokens,
            local_prompt_tokens=ex.local_prompt_tokens,
            local_completion_tokens=ex.local_completion_tokens,
            quality=ex.quality,
            api_cost_pusd=paid,
            counterfactual_pusd=counterfactual,
        )
        log.info(
            "request",
            request_id=ex.request_id,
            model=ex.model,
            route=ex.route,
            reason=ex.reason,
            status=ex.status,
            stream=ex.stream,
            quality=None if ex.quality is None else round(ex.quality, 3),
            latency_ms=round(latency_ms, 1),
            local_ms=round(ex.local_ms, 1),
            prompt_tokens=ex.prompt_tokens,
            completion_tokens=ex.completion_tokens,
            cost_usd=None if paid is None else paid / PUSD_PER_USD,
            counterfactual_usd=None if counterfactual is None else counterfactual / PUSD_PER_USD,
            key=ex.key_name,
            error=ex.error,
        )
        if ex.content_out is not None:  # [server] log_content: the operator asked for it
            log.debug(
                "request_content",
                request_id=ex.request_id,
                messages=ex.content_in,
                completion="".join(ex.content_out),
            )


def public_completion(completion: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
    """The engine's completion as OpenAI would send it: private fields removed, logprobs only
    when asked for."""
    out = {k: v for k, v in completion.items() if k != "frugal"}
    out["usage"] = sse.public_usage(completion.get("usage") or {})
    if not body.get("logprobs"):
        out["choices"] = [{**c, "logprobs": None} for c in completion["choices"]]
    elif not body.get("top_logprobs"):
        for choice in out["choices"]:
            for entry in (choice.get("logprobs") or {}).get("content") or []:
                entry["top_logprobs"] = []
    return out


async def _aiter(chunks: Any) -> AsyncGenerator[bytes, None]:
    for chunk in chunks:
        yield chunk


async def _cancel(task: asyncio.Task[Any]) -> None:
    """Cancel ``task`` (once) and wait until it has ended: a local generation stopped."""
    if task.done():
        if not task.cancelled():
            task.exception()  # retrieved; whoever needed its result has read it
        return
    task.cancel()
    with contextlib.suppress(BaseException):
        await task
