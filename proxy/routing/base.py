"""What every local backend is to the router (see ``proxy.routing.pool``).

    Backend        admits(), predict(), chat(), health(): one place local answers come from
    Choice         a backend picked for a request, with its predicted finish there
    BackendDown    the backend stopped answering: the request may move to another one

The bundled engine and the remote servers implement it in ``proxy.routing.pool`` and
``proxy.routing.remote``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from proxy.engine.local_engine import Answering
from proxy.errors import EngineCrashed
from proxy.routing.estimator import Prediction


class BackendDown(EngineCrashed):
    """The backend stopped answering; the request may move to another backend."""


@dataclass(frozen=True, kw_only=True)
class Choice:
    """A backend picked for a request, with its predicted finish there."""

    backend: Backend
    prediction: Prediction
    timeout_s: float


class Backend(Answering):
    """The interface of one local backend: the bundled engine, or a remote server; each
    answers in :meth:`answer` what is asked of it by ``chat``."""

    name: str = ""
    kind: str = ""
    timeout_s: float = 30.0
    slots: int = 1

    def ready(self) -> bool:
        raise NotImplementedError

    def admits(self, request: dict[str, Any], kind: str) -> bool:
        """Up, not full, and able to serve this kind of request."""
        raise NotImplementedError

    def thinks(self) -> bool:
        """Whether the model here thinks before it answers (``proxy.engine.reasoning``): then
        a ``reasoning_effort`` above ``minimal`` is served here, within a thinking budget."""
        return False

    def cannot_fit(self, request: dict[str, Any]) -> str | None:
        """Why the request certainly cannot fit this backend's context, or None when it may.

        A definite fact, checked before any prediction: a prompt that cannot fit is a
        ``context_overflow``, never a ``predicted_slow``.
        """
        return None

    def predict(self, request: dict[str, Any], completion_tokens: float) -> Prediction:
        raise NotImplementedError

    def predict_for(
        self, request: dict[str, Any], completion_tokens: float, share: str | None
    ) -> Prediction:
        """:meth:`predict` for a request of the client key ``share`` (its label), on a backend
        whose queue serves keys in turn; by default the key changes nothing."""
        return self.predict(request, completion_tokens)

    def health(self) -> dict[str, Any]:
        raise NotImplementedError

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None


def left(deadline: float) -> float:
    """Seconds until ``deadline`` (a ``time.monotonic()`` value), never negative."""
    return max(0.0, deadline - time.monotonic())


def rounded(value: float | None, digits: int = 1) -> float | None:
    return None if value is None else round(value, digits)
