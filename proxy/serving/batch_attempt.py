"""A batch line's local attempt: the interactive cascade's local half, with the batch's window
as its deadline and the engine's ``deferred`` class as its priority.

:class:`BatchAttempt` is the :class:`~proxy.serving.batch_lines.LocalAttempt` the batch runner
is given. For one line (its ``url`` and ``body``) it does what the endpoint does before its API
call, and nothing after:

1. **Checks the body** as the endpoint checks it (:mod:`proxy.protocol.validate`; a
   ``/v1/responses`` body as :func:`proxy.serving.responses_checks.checked` does, then
   translated to chat with :mod:`proxy.protocol.responses_translate`). A bad body is that line's
   answer: a 400 in OpenAI's error shape naming the parameter, as the endpoint would send it.
2. **Plans it** with the router, the seconds left in the batch's window as its deadline
   (``Router.plan(..., window_s=)``, the way flex's ``[batch] flex_timeout_s`` reaches it): a
   line is never ``predicted_slow`` for ``[local] timeout_s``, and its attempt waits in the
   engine's ``deferred`` class, behind every interactive request.
3. **Runs and gates it** (``Router.try_local``), against ``[quality]``, its per-model
   thresholds and the threshold a target precision picked, as an interactive request is, in
   the share of the local queue of the key that made the batch (``Asker``), and offers the
   attempt to the shadow audits (:func:`proxy.serving.shadow.offer_line`).

What comes back: :class:`~proxy.serving.batch_lines.Accepted` with the body the endpoint would
send (chat and legacy completions through :func:`proxy.protocol.answers.public_answer`, a
Responses line as a ``response`` object), its usage and, when the ledger's counter can tell,
the requested model's token count for the counterfactual; :class:`Rejected` when the gate
refused the answer or the engine failed (the router's reason); :class:`CannotServe` for what the
local model cannot serve at all: embeddings, images and what else ``local_blocker`` names,
built-in tools and the Responses parameters only the API honours, a prompt past its context.
Without an API fallback, a local answer the gate refused is still the line's answer (reason
``no_fallback``), as the interactive path sends it.

Imports :mod:`proxy.routing` (the plan, the attempt, the reasons), :mod:`proxy.protocol` (the
checks, the translation, the answers), :mod:`proxy.engine.legacy` (a legacy completion in chat
form, for the count), :mod:`proxy.ledger.writing.tokens` (the count's job), :mod:`proxy.audit`
(the audits' runner) and this room's batch_lines, responses_checks and shadow.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import KW_ONLY, dataclass
from typing import Any

import structlog

from proxy.audit.runner import AuditRunner
from proxy.engine import legacy
from proxy.errors import BadRequest, LocalUnavailable, ProxyError
from proxy.ledger.writing.tokens import CountJob
from proxy.protocol.answers import public_answer
from proxy.protocol.responses_answer import local_used, response_of, timed_out
from proxy.protocol.responses_translate import chat_of, effort_only, stand_in
from proxy.protocol.validate import chat_request, completions_request
from proxy.routing.reasons import Reason
from proxy.routing.router import Router
from proxy.serving.batch_lines import Accepted, Asker, Attempted, CannotServe, Rejected
from proxy.serving.responses_checks import checked
from proxy.serving.responses_state import references
from proxy.serving.shadow import offer_line
from proxy.upstream.responses_api import API_ONLY

log = structlog.get_logger("frugal.batches")

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
RESPONSES = "/v1/responses"
COUNT_WAIT_S = 30.0
"""How long a line waits for the ledger's count of its tokens before its local usage stands in."""
CANNOT = frozenset({Reason.UNSUPPORTED, Reason.CONTEXT_OVERFLOW})
"""The router's reasons that mean the local model cannot serve a line at all."""

Count = Callable[[CountJob], "Future[tuple[int, int]]"]


@dataclass(frozen=True, slots=True)
class _Asked:
    """A line, checked: the chat request the engine is asked, the body as the client sent it,
    and the engine's kind (``chat`` or ``complete``)."""

    url: str
    chat: dict[str, Any]
    asked: dict[str, Any]
    kind: str


@dataclass(eq=False)  # told apart by identity
class BatchAttempt:
    """A batch line's local attempt (see the module's docstring). ``count``: the ledger's
    token counter (``TokenCounter.submit``), None to leave the counterfactual to the local
    usage; ``default_max_tokens``: ``[local] default_max_tokens``, what a Responses answer says
    it used where the line named no limit; ``audit``: the shadow audits a chat or Responses
    line's local answer is offered to (None: none)."""

    router: Router
    _: KW_ONLY
    count: Count | None = None
    default_max_tokens: int = 512
    audit: AuditRunner | None = None

    async def __call__(
        self,
        url: str,
        body: dict[str, Any],
        *,
        deadline: float,
        priority: str,
        asker: Asker | None = None,
    ) -> Attempted:
        asker = asker or Asker()
        try:
            line = _read(url, body)
        except ProxyError as exc:  # the endpoint's own answer to that body: a 4xx naming it
            return _refused(exc)
        if isinstance(line, CannotServe):
            return line
        window_s = deadline - time.time()
        if window_s <= 0:
            return Rejected(reason=Reason.LOCAL_TIMEOUT.value)
        try:
            plan = self.router.plan(line.chat, None, client=asker.client, window_s=window_s)
            threshold = self.router.threshold(None, line.chat["model"])
        except ProxyError as exc:
            return _refused(exc)
        if plan.route != "local":
            reason = plan.reason or Reason.UNSUPPORTED
            if reason in CANNOT:
                return CannotServe(reason=reason.value)
            return Rejected(reason=reason.value)
        attempt = await self.router.try_local(
            line.chat, threshold=threshold, kind=line.kind, plan=plan
        )
        completion = attempt.completion
        kept = completion is not None and (
            attempt.accepted or plan.local_only or not self.router.fallback_enabled
        )
        if line.kind == "chat":
            offer_line(self.audit, line.chat, attempt, plan, threshold, asker, router=self.router)
        if completion is None or not kept:
            if attempt.reason in CANNOT:
                return CannotServe(reason=attempt.reason.value)
            if plan.local_only or not self.router.fallback_enabled:
                failed = LocalUnavailable(
                    f"the local model could not answer ({attempt.reason}) and this line "
                    "cannot go to the API"
                )
                return Accepted(
                    status_code=failed.status, body=failed.body(), reason=attempt.reason.value
                )
            return Rejected(reason=attempt.reason.value, local_ms=attempt.elapsed_ms)
        ran = completion.get("model")
        return Accepted(
            status_code=200,
            body=self._answer(line, completion),
            usage=completion.get("usage"),
            local_ms=attempt.elapsed_ms,
            local_model=ran if isinstance(ran, str) and ran else None,
            counted=await self._counted(line, completion),
            reason=_kept_because(attempt.accepted, local_only=plan.local_only).value,
        )

    def _answer(self, line: _Asked, completion: dict[str, Any]) -> dict[str, Any]:
        """The body the line's endpoint would send for ``completion``."""
        if line.url == COMPLETIONS:
            return public_answer(completion, line.asked, text=True)
        answer = public_answer(completion, line.chat)
        if line.url != RESPONSES:
            return answer
        response = response_of(answer, line.asked, local_used(self.default_max_tokens))
        if (completion.get("frugal") or {}).get("stop_cause") == "deadline":
            return timed_out(response)
        return response

    async def _counted(self, line: _Asked, completion: dict[str, Any]) -> tuple[int, int] | None:
        """The requested model's count of the prompt and the answer (the counterfactual's
        tokens); None when there is no counter, or it failed or took too long."""
        if self.count is None:
            return None
        body, answer = line.chat, completion
        if line.kind == "complete":
            body, answer = legacy.chat_view(line.asked, completion)
        job = CountJob(model=line.asked["model"], body=body, completion=answer)
        try:
            return await asyncio.wait_for(asyncio.wrap_future(self.count(job)), COUNT_WAIT_S)
        except Exception as exc:  # noqa: BLE001 - the local usage stands in, as the writer's
            log.info("batch_line_count_failed", error=type(exc).__name__)
            return None


def _kept_because(accepted: bool, *, local_only: bool) -> Reason:
    """Why a local answer is the line's, as the interactive path says it."""
    if local_only:
        return Reason.FORCED  # model "local": never sent to the API
    return Reason.ACCEPTED if accepted else Reason.NO_FALLBACK


def _refused(exc: ProxyError) -> Accepted:
    """The line's answer when its endpoint would refuse it: the error in OpenAI's shape."""
    reason = Reason.BAD_REQUEST if exc.status == 400 else Reason.ERROR
    return Accepted(status_code=exc.status, body=exc.body(), reason=reason.value)


def _read(url: str, body: dict[str, Any]) -> _Asked | CannotServe:
    """The line checked as its endpoint checks it; raises the endpoint's ``BadRequest``."""
    if url == CHAT:
        checked_body = chat_request(body)
        return _Asked(url, checked_body, checked_body, "chat")
    if url == COMPLETIONS:
        checked_body = completions_request(body)
        return _Asked(url, checked_body, checked_body, "complete")
    if url == RESPONSES:
        return _responses(body)
    return CannotServe(reason=Reason.UNSUPPORTED.value)  # embeddings: the API's alone


def _responses(body: dict[str, Any]) -> _Asked | CannotServe:
    """A Responses line as the chat request the cascade answers. The upstream's own Batch API
    takes ``/v1/responses`` lines, so what only it honours (built-in tools, ``reasoning`` past an
    effort, ...) is let through the checks and the line is one the local model cannot serve;
    so is one that names stored responses, which a batch line cannot read."""
    if references(body) or body.get("previous_response_id") is not None:
        return CannotServe(reason=Reason.UNSUPPORTED.value)
    asked = checked(body, api_own=lambda model: True)
    stand, taken = stand_in(asked, API_ONLY)
    effort = effort_only(asked)
    if effort is not None:
        taken = [t for t in taken if t != "'reasoning'"]
    if taken:
        return CannotServe(reason=Reason.UNSUPPORTED.value)
    chat = chat_of(stand)
    if effort is not None:
        chat["reasoning_effort"] = effort
    if not isinstance(chat.get("model"), str):
        raise BadRequest("'model' is required", param="model")
    return _Asked(RESPONSES, chat, asked, "chat")
