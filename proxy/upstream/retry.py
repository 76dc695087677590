"""The retry policy of upstream calls (tenacity): when to try again, how long to wait, when to stop.

Retries live here and nowhere else, and only where the API cannot have done (and billed) the
work already; which failures those are is :func:`proxy.upstream.failures.retryable`'s rule.
:class:`RetryPolicy` makes up to ``max_retries`` more attempts, with exponential backoff and
jitter; ``Retry-After`` (seconds or an HTTP date) is honoured on 429 and 503. A retry whose wait
would end after ``timeout_s`` from the start of the call, or whose ``Retry-After`` is over
:data:`RETRY_AFTER_CAP_S`, is not made: the call fails at once.

Every failure leaves :meth:`RetryPolicy.run` as a :class:`~proxy.errors.ProxyError` (through
:func:`~proxy.upstream.failures.translate`, once) that says how many attempts were made.
"""

from __future__ import annotations

import random
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import structlog
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception

from proxy.config.secrets import NO_SECRETS, Secrets
from proxy.errors import ProxyError
from proxy.upstream.failures import describe, retry_after_of, retryable, translate

__all__ = ["BACKOFF_INITIAL_S", "BACKOFF_MAX_S", "RETRY_AFTER_CAP_S", "RetryPolicy"]

log = structlog.get_logger(__name__)
_T = TypeVar("_T")

BACKOFF_INITIAL_S = 0.2
BACKOFF_MAX_S = 5.0
RETRY_AFTER_CAP_S = 20.0


class RetryPolicy:
    """Run one upstream call's attempts: ``max_retries`` more at most, within ``timeout_s``.

    ``backoff_s`` is the first retry's backoff (tests make it small); ``secrets`` are cleared
    from a refusal's body (:func:`~proxy.upstream.failures.translate`).
    """

    def __init__(
        self,
        *,
        max_retries: int,
        timeout_s: float,
        backoff_s: float = BACKOFF_INITIAL_S,
        secrets: Secrets = NO_SECRETS,
    ) -> None:
        self._secrets = secrets
        self._max_retries = max_retries
        self._timeout_s = timeout_s
        self._backoff_s = backoff_s
        self._retrying = AsyncRetrying(
            stop=self._stop,
            wait=self._wait,
            retry=retry_if_exception(retryable),
            before_sleep=_log_retry,
            reraise=True,
        )

    async def run(self, attempt: Callable[..., Awaitable[_T]], *args: Any) -> tuple[_T, int]:
        """Run ``attempt(*args)`` under the retry policy: its result and the attempts made.

        The first attempt is a plain call: tenacity's bookkeeping costs about 25 µs, a few per
        cent of a proxied request's CPU, and almost every call succeeds at once. After a failure
        worth retrying, tenacity takes over; it is handed that failure first (replayed, not
        re-run), so its stop, wait and log rules see every attempt, timed from the first.
        """
        started = time.monotonic()
        try:
            return await attempt(*args), 1
        except ProxyError as exc:
            exc.attempts = 1
            raise
        except Exception as exc:
            if not retryable(exc):
                raise translate(exc, 1, secrets=self._secrets) from exc
            attempts = _Attempts(attempt, args, started, exc)
        try:
            return await self._retrying(attempts), attempts.tries
        except ProxyError as exc:
            exc.attempts = attempts.tries
            raise
        except Exception as exc:
            raise translate(exc, attempts.tries, secrets=self._secrets) from exc

    def _backoff(self, attempt: int) -> float:
        """Exponential from ``backoff_s``, doubled per attempt, capped at 5 s."""
        return min(self._backoff_s * 2.0 ** (attempt - 1), BACKOFF_MAX_S)

    def _wait(self, state: RetryCallState) -> float:
        delay = self._backoff(state.attempt_number) + random.uniform(0, self._backoff_s)
        retry_after = retry_after_of(_exception_of(state))
        return delay if retry_after is None else max(delay, retry_after)

    def _stop(self, state: RetryCallState) -> bool:
        if state.attempt_number > self._max_retries:
            return True
        delay = self._backoff(state.attempt_number)
        retry_after = retry_after_of(_exception_of(state))
        if retry_after is not None:
            if retry_after > RETRY_AFTER_CAP_S:
                return True
            delay = max(delay, retry_after)
        started = state.fn.started if isinstance(state.fn, _Attempts) else state.start_time
        return time.monotonic() - started + delay > self._timeout_s


class _Attempts:
    """The attempts of one call as tenacity makes them, after the first one failed.

    Tenacity's first "attempt" re-raises that failure instead of calling again; ``started`` is
    when the first attempt began, for the stop rule's time budget.
    """

    __slots__ = ("attempt", "args", "started", "tries", "_first_failure")

    def __init__(
        self,
        attempt: Callable[..., Awaitable[Any]],
        args: tuple[Any, ...],
        started: float,
        failure: Exception,
    ) -> None:
        self.attempt = attempt
        self.args = args
        self.started = started
        self.tries = 1
        self._first_failure: Exception | None = failure

    async def __call__(self) -> Any:
        failure, self._first_failure = self._first_failure, None
        if failure is not None:
            raise failure
        self.tries += 1
        return await self.attempt(*self.args)


def _exception_of(state: RetryCallState) -> BaseException | None:
    outcome = state.outcome
    return outcome.exception() if outcome is not None and outcome.failed else None


def _log_retry(state: RetryCallState) -> None:
    exc = _exception_of(state)
    wait = state.next_action.sleep if state.next_action is not None else None
    error = describe(exc) if exc is not None else None
    log.warning("upstream_retry", attempt=state.attempt_number, wait_s=wait, error=error)
