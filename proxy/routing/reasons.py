"""Why a request went where it went: the one list of the values of ``x-frugal-reason``.

:class:`Reason` is what the router, the handlers and the ledger assign, what ``/metrics``
counts by (``frugal_requests_total{reason}``), what ``/openapi.json`` lists as the header's
``enum``, and what the README's table of reasons explains; ``tests/routing/test_reasons.py``
holds the last three, and the engine's failures (``proxy.errors.EngineError`` and its
subclasses carry a bare ``reason`` string, being below this room), to it. A value is stored in
the ledger, so it never changes once released; a new reason is a new member here, a row of the
README's table, and the line that assigns it.

Imports nothing.
"""

from __future__ import annotations

from enum import StrEnum, unique


@unique
class Reason(StrEnum):
    # The local model answered.
    ACCEPTED = "accepted"  # the gate passed the local answer
    LIVE = "live"  # streamed as it came ([router] stream_mode = "live"): no gate
    FORCED = "forced"  # the client chose the route (x-frugal-route, or the model "local")
    NO_FALLBACK = "no_fallback"  # kept or failed locally because there is no API to fall back on
    # The local model answered, or tried, and the API answered instead.
    LOW_QUALITY = "low_quality"  # the gate rejected the local answer
    LOCAL_TIMEOUT = "local_timeout"  # the local deadline ([local] timeout_s) passed
    LOCAL_ERROR = "local_error"  # the engine or its backend failed
    LOCAL_BUSY = "local_busy"  # every local backend's queue was full
    # Sent to the API before any local attempt.
    PREDICTED_SLOW = "predicted_slow"  # the predicted local finish was past the deadline
    PREDICTED_REJECT = "predicted_reject"  # the pre-router predicted a rejection
    CONTEXT_OVERFLOW = "context_overflow"  # the prompt cannot fit the local context
    UNSUPPORTED = "unsupported"  # a feature the local model lacks
    # Neither model.
    CACHE = "cache"  # the response cache's answer
    BUDGET_EXHAUSTED = "budget_exhausted"  # the key's monthly budget is spent
    BUDGET_UNAVAILABLE = "budget_unavailable"  # the budget's database could not be read
    BAD_REQUEST = "bad_request"  # refused with a 400
    CLIENT_GONE = "client_gone"  # the client left before its answer
    ERROR = "error"  # any other failure before a route was chosen
