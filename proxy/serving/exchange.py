"""What one request did: :class:`Exchange`, gathered as the request goes, for its headers, its log
line and its ledger row.

Every field is set here, by a named step, and nowhere else (``tests/server/test_exchange_steps.py``
walks ``proxy/`` and fails on a direct assignment outside this module), so that who sets
``reason``, ``route`` or the tokens is read in one file:

    Exchange          who asked and when; what was asked; what happened (route, reason,
                      status, error); the answer's tokens and what it was billed for
                      (:class:`Billed`); the local attempt (its score, time and model are read
                      from it); the API call's time, attempts and worst case; the key's
                      reservation and the cache entry; a drawn audit (:class:`DrawnAudit`)
                      and the content, kept only when ``[server] log_content`` is on
                      (:class:`Content`)
      asked, asking, counted_as_chat          what the request is
      take_plan, take_local                   what the router planned, what the local model did
      served_locally, served_live, served_from_cache, fell_back, refused,
      unsupported_locally, calling_api        the route and its reason
      api_timed, api_attempts, api_heard, take_usage, take_billing, charged, answered_nothing
                                              what the API call took, said and cost
      failed, client_left, crashed, broke, local_failed, local_timed_out, cut_by_deadline
                                              how it ended when it did not end well
      reserving, reserved, may_cache, drew_audit, audit_started, recording
                                              the key's budget, the cache, the audits, the row
      headers()                               the ``x-request-id`` and ``x-frugal-*`` headers
      keep(), keep_sse()                      the answer's text, for the content log or the
                                              audit's reference

The cascade that takes these steps is :mod:`proxy.serving.cascade`; the row, metrics and log line
made from the exchange are :mod:`proxy.serving.record`'s.

Imports the types it holds from :mod:`proxy.routing`, :mod:`proxy.audit` and
:mod:`proxy.upstream` (the Responses usage in chat's terms), and nothing else of ``proxy``.
"""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import dataclass, field
from typing import Any

from proxy.audit.runner import Case
from proxy.audit.sampler import Ticket
from proxy.routing.estimator import Prediction
from proxy.routing.reasons import Reason
from proxy.routing.router import LocalAttempt, Plan
from proxy.upstream.responses_api import chat_usage


@dataclass(slots=True)
class Billed:
    """What an API call is billed for besides text at the standard rate (the ledger's
    0013_billed columns, priced by proxy.ledger.pricing): audio tokens from its usage, web
    searches from its answer, and the tier the answer says it was served at. Set by the
    exchange's ``take_usage`` and ``take_billing``."""

    audio_prompt_tokens: int = 0
    audio_completion_tokens: int = 0
    web_searches: int = 0
    served_tier: str | None = None


@dataclass(slots=True)
class DrawnAudit:
    """A shadow audit drawn for this request (proxy.audit), run when the exchange ends: its
    ticket and case, and the API's answer to a rejected attempt (its reference) or that
    answer's streamed text."""

    ticket: Ticket
    case: Case
    reference: dict[str, Any] | None = None
    text: list[str] | None = None


@dataclass(slots=True)
class Content:
    """The request's messages and the answer's text, kept only when ``[server] log_content``."""

    messages: Any
    out: list[str] = field(default_factory=list)


@dataclass
class Exchange:
    """What one request did, gathered as it goes, for the headers, the log and the ledger."""

    request_id: str
    endpoint: str = "chat.completions"  # the ledger's name: chat.completions | completions | ...
    key_name: str | None = None  # the client key's name, never the key
    started: float = field(default_factory=time.perf_counter)
    arrived: float = field(default_factory=time.time)
    # What was asked: the model, whether streamed, the request in chat form (the token count's).
    model: str | None = None
    stream: bool = False
    deferred_tier: str | None = None  # flex: deferred work (proxy.routing.router.deferred_tier)
    body: dict[str, Any] | None = None
    # What happened.
    route: str = "none"
    reason: Reason = Reason.ERROR
    status: int = 200
    error: str | None = None
    # The answer's tokens (the provider's usage, or the local model's), and where they come
    # from when not the provider's usage (proxy.serving.charges): "usage_estimated" (counted by a
    # tokenizer) or "worst_case" (the reservation's worst case).
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int = 0
    token_source: str | None = None
    billed: Billed = field(default_factory=Billed)
    # The local attempt, and its answer in chat form when the endpoint's is not (legacy
    # completions): the score, the time, the model and the local tokens are read from them.
    local: LocalAttempt | None = None
    chat_answer: dict[str, Any] | None = None
    # Where the router predicted the local answer would come from, and how fast.
    backend: str | None = None
    predicted_local_ms: float | None = None
    predicted_completion_tokens: int | None = None
    # The API call: its time and HTTP attempts (retries included), and what its worst case was
    # (or would be) reserved for: the body, its upstream path, the API model's limits.
    api_ms: float = 0.0
    upstream_attempts: int | None = None
    worst_body: dict[str, Any] | None = None
    worst_path: str = "/chat/completions"
    worst_max_output: int | None = None
    worst_window: int | None = None
    # The key's budget reservation, settled by finish; the response cache's entry (quotas).
    reservation: Any = None
    cache_key: str | None = None
    cache_read: bool = False  # a hit may be served (no Cache-Control: no-cache)
    audit: DrawnAudit | None = None
    content: Content | None = None
    recorded: bool = False  # its ledger row is written (once, whatever happens after)

    # -- read from the local attempt ----------------------------------------------------------

    @property
    def quality(self) -> float | None:
        return None if self.local is None else self.local.quality

    @property
    def quality_reasons(self) -> list[str]:
        return [] if self.local is None else self.local.quality_reasons

    @property
    def local_ms(self) -> float:
        return 0.0 if self.local is None else self.local.elapsed_ms

    @property
    def actual_local_ms(self) -> float | None:
        if self.local is None or self.local.actual_s is None:
            return None
        return round(self.local.actual_s * 1000, 2)

    @property
    def local_completion(self) -> dict[str, Any] | None:
        """The local answer, in chat form (what the ledger recounts)."""
        if self.chat_answer is not None:
            return self.chat_answer
        return None if self.local is None else self.local.completion

    @property
    def local_model(self) -> str | None:
        """The model the local attempt ran (the GGUF's name, or a remote backend's model):
        named in the x-frugal-local-model header and the ledger, since the answer's ``model``
        is the one asked for."""
        ran = ((self.local.completion if self.local else None) or {}).get("model")
        return ran if isinstance(ran, str) and ran else None

    @property
    def local_prompt_tokens(self) -> int | None:
        return self._local_usage().get("prompt_tokens")

    @property
    def local_completion_tokens(self) -> int | None:
        return self._local_usage().get("completion_tokens")

    def _local_usage(self) -> dict[str, Any]:
        return ((self.local.completion if self.local else None) or {}).get("usage") or {}

    def headers(self) -> dict[str, str]:
        return {
            "x-request-id": self.request_id,
            "x-frugal-route": self.route,
            "x-frugal-reason": self.reason,
            "x-frugal-quality": "none" if self.quality is None else f"{self.quality:.3f}",
        } | ({} if self.local_model is None else {"x-frugal-local-model": self.local_model})

    # -- what the request is --------------------------------------------------------------------

    def asked(self, model: str, *, stream: bool = False, deferred_tier: str | None = None) -> None:
        """The model asked for, whether the answer is streamed, and the tier of deferred work
        (``flex``) the request asked for, marked in its row."""
        self.model, self.stream, self.deferred_tier = model, stream, deferred_tier

    def asking(self, body: dict[str, Any], *, log_content: bool) -> None:
        """The request in chat form (the ledger's token count); its messages kept for the
        content log when ``[server] log_content`` is on."""
        self.body = body
        if log_content:
            self.content = Content(messages=body.get("messages"))

    def counted_as_chat(self, body: dict[str, Any], completion: dict[str, Any]) -> None:
        """A legacy completion's request and local answer in chat form, for the ledger's
        count with the requested model's tokenizer."""
        self.body, self.chat_answer = body, completion

    # -- what the router planned, what the local model did ---------------------------------

    def take_plan(self, plan: Plan) -> None:
        if plan.choice is not None:
            self._take_prediction(plan.choice.prediction)

    def take_local(self, attempt: LocalAttempt) -> None:
        self.local = attempt
        if attempt.prediction is not None:
            self._take_prediction(attempt.prediction)
        if attempt.choice is not None:
            self.backend = attempt.choice.backend.name  # where it ran, if it was moved

    def _take_prediction(self, prediction: Prediction) -> None:
        self.backend = prediction.backend
        self.predicted_completion_tokens = round(prediction.completion_tokens)
        if prediction.seconds is not None:
            self.predicted_local_ms = round(prediction.seconds * 1000, 2)

    # -- the route and its reason -------------------------------------------------------------

    def served_locally(self, reason: Reason) -> None:
        """The local answer is sent, for ``reason`` (accepted, forced, no fallback, ...)."""
        self.route, self.reason = "local", reason

    def served_live(self, *, forced: bool) -> None:
        """Local tokens are streamed as they come, ungated (reason ``live``)."""
        self.served_locally(Reason.FORCED if forced else Reason.LIVE)

    def served_from_cache(self, answer: dict[str, Any]) -> None:
        """A cached answer is sent: route and reason ``cache``, nothing to store again."""
        self.route, self.reason = "cache", Reason.CACHE
        self.take_usage(answer.get("usage"))
        self.cache_key = None

    def fell_back(self, reason: Reason) -> None:
        """The API is to answer, for ``reason`` (a rejected local answer, or a pre-route)."""
        self.reason = reason

    def refused(self, reason: Reason) -> None:
        """Neither route may answer, for ``reason`` (an error follows)."""
        self.reason = reason

    def unsupported_locally(self) -> None:
        """Only the API can serve this request: route ``api``, reason ``unsupported``, before
        anything is tried."""
        self.route, self.reason = "api", Reason.UNSUPPORTED

    def calling_api(self) -> None:
        self.route = "api"

    # -- what the API call took, said and cost -----------------------------------------------

    def api_timed(self, started: float) -> None:
        """The API call's time, from ``started`` (a ``time.perf_counter()``) until now."""
        self.api_ms = (time.perf_counter() - started) * 1000

    def api_attempts(self, attempts: int | None) -> None:
        self.upstream_attempts = attempts

    def api_heard(self, answer: dict[str, Any]) -> None:
        """The API's answer, in chat form, as the reference of a drawn audit."""
        if self.audit is not None:
            self.audit.reference = answer

    def take_usage(self, usage: dict[str, Any] | None) -> None:
        if usage and "prompt_tokens" not in usage and "input_tokens" in usage:
            usage = chat_usage(usage)  # the Responses' shape (the API's own /v1/responses)
        if usage:
            self.prompt_tokens = usage.get("prompt_tokens")
            self.completion_tokens = usage.get("completion_tokens")
            details = usage.get("prompt_tokens_details") or {}
            self.cached_tokens = int(details.get("cached_tokens") or 0)
            said = usage.get("completion_tokens_details") or {}
            self.billed.audio_prompt_tokens = _count(details.get("audio_tokens"))
            self.billed.audio_completion_tokens = _count(said.get("audio_tokens"))

    def take_billing(self, answer: dict[str, Any]) -> None:
        """What an API answer says it was billed for: the ``service_tier`` it was served at,
        and the web searches a Responses answer made (its ``web_search_call`` items)."""
        if isinstance(answer.get("service_tier"), str):
            self.billed.served_tier = answer["service_tier"]
        output = answer.get("output")
        if isinstance(output, list):
            self.billed.web_searches = sum(
                1
                for item in output
                if isinstance(item, dict) and item.get("type") == "web_search_call"
            )

    def charged(self, prompt: int, completion: int, *, source: str) -> None:
        """Tokens the API's usage did not say, charged from ``source`` (proxy.serving.charges)."""
        self.prompt_tokens, self.completion_tokens = prompt, completion
        self.cached_tokens = 0
        self.token_source = source

    def answered_nothing(self) -> None:
        """An answer with no output tokens (embeddings)."""
        self.completion_tokens = 0

    # -- how it ended when it did not end well ------------------------------------------------

    def failed(self, status: int, error: str | None, *, bad_request: bool = False) -> None:
        """An error was the answer (reason ``bad_request`` for the client's own mistake)."""
        self.status, self.error = status, error
        if bad_request:
            self.reason = Reason.BAD_REQUEST

    def client_left(self, *, mid_body: bool = False) -> None:
        """The client left before its answer (status 499); in the middle of its body, nothing
        else happened (reason ``client_gone``)."""
        self.status, self.error = 499, "client_gone"
        if mid_body:
            self.reason = Reason.CLIENT_GONE

    def crashed(self) -> None:
        self.status, self.error = 500, "internal_error"

    def broke(self, error: str) -> None:
        """A stream that broke off after its first byte, or an answer that says it failed."""
        self.error = error

    def local_failed(self, reason: str) -> None:
        """The local model failed in the middle of a live answer."""
        self.error = reason

    def local_timed_out(self) -> None:
        """A live answer the deadline cut (reason ``local_timeout``)."""
        self.reason = Reason.LOCAL_TIMEOUT

    def cut_by_deadline(self) -> None:
        """A local answer the deadline cut, sent as a failed Responses answer."""
        self.error = Reason.LOCAL_TIMEOUT.value

    # -- the key's budget, the cache, the audits, the row ---------------------------------------

    def reserving(
        self, body: dict[str, Any], path: str, max_output: int | None, window: int | None
    ) -> None:
        """The exact body the API call posts, and the API model's limits: its worst case."""
        self.worst_body, self.worst_path = body, path
        self.worst_max_output, self.worst_window = max_output, window

    def reserved(self, reservation: Any) -> None:
        self.reservation = reservation

    def may_cache(self, key: str | None, read: bool) -> None:
        """The response cache's entry for this request, and whether a hit may be served."""
        self.cache_key, self.cache_read = key, read

    def drew_audit(self, ticket: Ticket, case: Case) -> None:
        """A shadow audit drawn; a rejected answer's audit keeps the API's streamed text."""
        self.audit = DrawnAudit(ticket, case, text=None if case.accepted else [])

    def audit_started(self) -> DrawnAudit:
        """The drawn audit, taken off the exchange to be started (once)."""
        drawn, self.audit = self.audit, None
        assert drawn is not None
        return drawn

    def recording(self) -> bool:
        """True the first time: the row is to be written now; False after."""
        first, self.recorded = not self.recorded, True
        return first

    def handed_on(self) -> None:
        """No row for this exchange: another writes the request's one row (a background
        response's run writes it, not the request that queued it)."""
        self.recorded = True

    # -- the answer's text, for the content log or the audit's reference ----------------------

    def keep(self, completion: dict[str, Any]) -> None:
        """Keep the answer's text for the content log (only when it is on)."""
        if self.content is not None:
            for choice in completion.get("choices") or []:
                message = choice.get("message") or {}
                self.content.out.append(str(message.get("content") or ""))

    def keep_sse(self, chunk: bytes) -> None:
        keepers = [
            k
            for k in (
                None if self.content is None else self.content.out,
                None if self.audit is None else self.audit.text,
            )
            if k is not None
        ]
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
