"""What one request did: :class:`Exchange`, gathered as the request goes, for its headers, its log
line and its ledger row.

    Exchange       ids, endpoint, model, route, reason, status, quality, tokens, timings,
                   upstream attempts, the key, the budget reservation and cache entry, a drawn
                   shadow audit; and the content, kept only when ``[server] log_content`` is on
      headers()    the ``x-request-id`` and ``x-frugal-*`` headers of the answer
      take_*()     what the router planned, what the local attempt did, what usage said
      keep*()      the answer's text, for the content log or the audit's reference

The handler life cycle that fills it is :mod:`proxy.server.handler`; the row, metrics and log line
made from it are :mod:`proxy.serving.record`'s.

Imports the types it holds from :mod:`proxy.routing` and :mod:`proxy.audit`, and nothing else of
``proxy``.
"""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import dataclass, field
from typing import Any

from proxy.audit.runner import Case
from proxy.audit.sampler import Ticket
from proxy.protocol.responses_usage import chat_usage
from proxy.routing.estimator import Prediction
from proxy.routing.reasons import Reason
from proxy.routing.router import LocalAttempt, Plan


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
    reason: Reason = Reason.ERROR
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
    error: str | None = None
    body: dict[str, Any] | None = None  # the request in chat form, for the ledger's token count
    local_completion: dict[str, Any] | None = None
    key_name: str | None = None  # the client key's name, never the key
    content_in: Any = None  # messages and answer text: kept only when [server] log_content
    content_out: list[str] | None = None
    predicted_local_ms: float | None = None  # the router's prediction (proxy.routing)
    actual_local_ms: float | None = None
    backend: str | None = None
    # The model the local attempt ran (the GGUF's name, or a remote backend's model): named in
    # the x-frugal-local-model header and the ledger, since the answer's ``model`` is the asked one.
    local_model: str | None = None
    predicted_completion_tokens: int | None = None
    upstream_attempts: int | None = None  # HTTP attempts made upstream, retries included
    # Where the API call's tokens come from when not the provider's usage (proxy.serving.charges):
    # "usage_estimated" (counted by a tokenizer) or "worst_case" (the reservation's worst case).
    token_source: str | None = None
    worst_body: dict[str, Any] | None = None  # what the worst case was (or would be) reserved for
    worst_path: str = "/chat/completions"  # ... the upstream path that body is posted to
    worst_max_output: int | None = None  # the API model's output limit, for that worst case
    worst_window: int | None = None  # and its input window
    # What the API call is billed for besides text at the standard rate (the ledger's
    # 0013_billed columns, priced by proxy.ledger.pricing): audio tokens from its usage, web
    # searches from its answer; the tier and search context size from what it was sent.
    audio_prompt_tokens: int = 0
    audio_completion_tokens: int = 0
    web_searches: int = 0
    served_tier: str | None = None  # the answer's own service_tier: what the provider billed
    deferred_tier: str | None = None  # flex: deferred work (proxy.routing.router.deferred_tier)
    recorded: bool = False  # its ledger row is written (once, whatever happens after)
    # The key's budget reservation, settled by finish; the response cache's entry (quotas).
    reservation: Any = None
    cache_key: str | None = None
    cache_read: bool = False  # a hit may be served (no Cache-Control: no-cache)
    # A drawn shadow audit (proxy.audit): run when the exchange ends, off the request path.
    audit: tuple[Ticket, Case] | None = None
    audit_reference: dict[str, Any] | None = None  # the API's answer to a rejected attempt
    audit_text: list[str] | None = None  # ... or its streamed text

    def headers(self) -> dict[str, str]:
        return {
            "x-request-id": self.request_id,
            "x-frugal-route": self.route,
            "x-frugal-reason": self.reason,
            "x-frugal-quality": "none" if self.quality is None else f"{self.quality:.3f}",
        } | ({} if self.local_model is None else {"x-frugal-local-model": self.local_model})

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
        ran = (attempt.completion or {}).get("model")
        if isinstance(ran, str) and ran:
            self.local_model = ran
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
        if usage and "prompt_tokens" not in usage and "input_tokens" in usage:
            usage = chat_usage(usage)  # the Responses' shape (the API's own /v1/responses)
        if usage:
            self.prompt_tokens = usage.get("prompt_tokens")
            self.completion_tokens = usage.get("completion_tokens")
            details = usage.get("prompt_tokens_details") or {}
            self.cached_tokens = int(details.get("cached_tokens") or 0)
            self.audio_prompt_tokens = _count(details.get("audio_tokens"))
            said = usage.get("completion_tokens_details") or {}
            self.audio_completion_tokens = _count(said.get("audio_tokens"))

    def take_billing(self, answer: dict[str, Any]) -> None:
        """What an API answer says it was billed for: the ``service_tier`` it was served at,
        and the web searches a Responses answer made (its ``web_search_call`` items)."""
        if isinstance(answer.get("service_tier"), str):
            self.served_tier = answer["service_tier"]
        output = answer.get("output")
        if isinstance(output, list):
            self.web_searches = sum(
                1
                for item in output
                if isinstance(item, dict) and item.get("type") == "web_search_call"
            )

    def keep(self, completion: dict[str, Any]) -> None:
        """Keep the answer's text for the content log (only when it is on)."""
        if self.content_out is not None:
            for choice in completion.get("choices") or []:
                self.content_out.append(str((choice.get("message") or {}).get("content") or ""))

    def keep_sse(self, chunk: bytes) -> None:
        keepers = [k for k in (self.content_out, self.audit_text) if k is not None]
        if not keepers:
            return
        for line in chunk.split(b"\n"):
            if line.startswith(b"data: {"):
                with contextlib.suppress(ValueError, AttributeError, IndexError, TypeError):
                    delta = json.loads(line[6:])["choices"][0]["delta"]
                    for keeper in keepers:
                        keeper.append(str(delta.get("content") or ""))


def _count(value: Any) -> int:
    """A usage detail as a token count: a non-negative int, else 0."""
    ok = isinstance(value, int) and not isinstance(value, bool) and value > 0
    return value if ok else 0
