"""The quality gate's scorer: one for every local answer, wherever it was written.

The bundled engine's worker scores its answers in its own process (``worker.py``, through
``tasks.py``); a remote backend's answers are scored in the proxy's process, in a thread
(``proxy.routing.remote``). Both go through :meth:`Gate.score`: the same quality code
(``quality.score``), the same relevance model (``[quality] relevance``) and the same combiner
(the shipped weights, or ``[quality] weights_path``, picked up again when the file changes), so
the same answer to the same request gets the same score from either path. The router then
decides on that score the same way (``Router.try_local``).

A legacy text completion is scored as a chat answer (:func:`proxy.engine.legacy.chat_view`),
one choice at a time; with several choices the request's score is the worst one's
(:func:`proxy.engine.tasks.merge`).
"""

from __future__ import annotations

import time
from typing import Any

from proxy.engine import legacy
from proxy.engine.weights import GateWeights

Verdict = dict[str, Any]  # {"value": float | None, "reasons": [...], "signals": {...}}


class Gate:
    """The relevance model and weights one process scores with; see the module docstring."""

    def __init__(self, *, embedder: Any = None, weights: GateWeights | None = None) -> None:
        self.embedder = embedder  # quality.relevance.Embedder, or None: no relevance signal
        self.weights = weights
        self.relevance: dict[str, Any] = {"enabled": embedder is not None}

    @classmethod
    def load(
        cls,
        *,
        relevance: bool,
        weights_path: str,
        model_path: str,
        weights_optional: bool,
        embed_threads: int | None = None,
    ) -> Gate:
        """The gate of ``[quality]``: raises :class:`quality.combiner.WeightsError` (a
        ``ValueError``) for a weights file that is missing (unless optional), corrupt, or fitted
        for another model than ``model_path``. ``embed_threads``: the relevance model's threads
        (None: its own default, up to four)."""
        weights = GateWeights(weights_path, model_path, optional=weights_optional)
        weights.start()
        gate = cls(weights=weights)
        gate.relevance = gate._load_embedder(relevance, embed_threads)
        return gate

    def _load_embedder(self, wanted: bool, threads: int | None = None) -> dict[str, Any]:
        """Load the relevance signal's model in this process; what happened, for ``/healthz``."""
        if not wanted:
            return {"enabled": False, "reason": "[quality] relevance = false"}
        from quality.relevance import Embedder, RelevanceUnavailable

        started = time.perf_counter()
        try:
            self.embedder = Embedder.load(n_threads=threads)
        except RelevanceUnavailable as exc:
            return {"enabled": False, "reason": str(exc)}
        except Exception as exc:  # noqa: BLE001 - an optional signal must never stop the gate
            return {"enabled": False, "reason": f"{type(exc).__name__}: {exc}"}
        return {
            "enabled": True,
            "model_path": self.embedder.path,
            "n_threads": self.embedder.n_threads,
            "load_s": round(time.perf_counter() - started, 3),
        }

    def weights_info(self) -> dict[str, object]:
        return self.weights.info() if self.weights is not None else {"calibrated": False}

    def score(self, request: dict[str, Any], completion: dict[str, Any]) -> Verdict:
        """The gate's verdict on one chat answer (``completion["frugal"]`` holds its
        ``stop_cause``). CPU-bound: never call it on the event loop."""
        import quality

        frugal = completion.get("frugal") or {}
        if frugal.get("stop_cause") == "cancelled":
            # Its client is gone: answer at once, nobody will read a score.
            return {"value": None, "reasons": ["cancelled"], "signals": {}}
        if (frugal.get("thinking") or {}).get("finished") is False:
            # Cut while thinking (proxy.engine.reasoning): there is no answer to score, and
            # whatever the threshold, no score means it is never accepted.
            return {"value": None, "reasons": ["thinking_unfinished"], "signals": {}}
        combiner = self.weights.current() if self.weights is not None else None
        verdict = quality.score(request, completion, embedder=self.embedder, combiner=combiner)
        return {"value": verdict.value, "reasons": verdict.reasons, "signals": verdict.signals}

    def score_answer(
        self, request: dict[str, Any], completion: dict[str, Any], *, text: bool = False
    ) -> Verdict:
        """The verdict on a whole answer from elsewhere (a remote backend): each choice scored
        as one answer, the request's verdict the worst one's, as the worker's
        :func:`~proxy.engine.tasks.merge` does. ``text``: a legacy ``text_completion``, scored
        as a chat answer (:func:`~proxy.engine.legacy.chat_view`)."""
        verdicts = []
        for choice in completion.get("choices") or [{}]:
            one = {**completion, "choices": [choice]}
            if text:
                verdicts.append(self.score(*legacy.chat_view(request, one)))
            else:
                verdicts.append(self.score(request, one))
        return min(verdicts, key=_value)


def _value(verdict: Verdict) -> float:
    value = verdict.get("value")
    return float(value) if value is not None else -1.0
