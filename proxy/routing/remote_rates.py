"""A remote backend's prefill and decode rates, measured by timing its answers.

llama-server's ``timings`` object (``prompt_per_second``, ``predicted_per_second``) is used when
an answer has one; otherwise the answer's wall time and ``usage``, with the prefill/decode ratio
taken from the configured rates or the bundled engine's. Until the backend has answered, the
configured rates stand in (``prefill_tok_s``/``decode_tok_s``), else the bundled engine's (the
``prior``). The time an answer took beyond its prefill and decode is its overhead.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from proxy.engine.rates import Rates, ewma
from proxy.routing.estimator import Ewma

__all__ = ["DEFAULT_RATIO", "RemoteRates"]

DEFAULT_RATIO = 10.0  # prefill tok/s per decode tok/s, when nothing better is known


class RemoteRates:
    """The rates of one remote backend: configured, then learned from each answer (EWMA)."""

    def __init__(
        self,
        *,
        prefill_tok_s: float | None,
        decode_tok_s: float | None,
        prior: Callable[[], Rates],
        alpha: float = 0.3,
    ) -> None:
        self._prior = prior
        self._prefill = prefill_tok_s or None
        self._decode = decode_tok_s or None
        self._source = "config" if self._prefill and self._decode else "none"
        self.overhead = Ewma()
        self._alpha = alpha

    @property
    def rates(self) -> Rates:
        if self._prefill and self._decode:
            return Rates(
                prefill_tok_s=self._prefill, decode_tok_s=self._decode, source=self._source
            )
        prior = self._prior()
        return Rates(
            prefill_tok_s=self._prefill or prior.prefill_tok_s,
            decode_tok_s=self._decode or prior.decode_tok_s,
            source="assumed",
        )

    def observe(self, completion: dict[str, Any], elapsed: float) -> dict[str, Any]:
        """Update the rates from one answer; returns the engine-style timing details."""
        usage = completion.get("usage") or {}
        timings = completion.get("timings")
        prompt = int(usage.get("prompt_tokens") or 0)
        decoded = int(usage.get("completion_tokens") or 0)
        details = usage.get("prompt_tokens_details") or {}
        cached = int(details.get("cached_tokens") or 0)
        if isinstance(timings, dict) and timings.get("cache_n") is not None:
            cached = int(timings["cache_n"])
        prefilled = max(prompt - cached, 0)
        info: dict[str, Any] = {"cached_tokens": cached, "prefilled_tokens": prefilled}
        if isinstance(timings, dict) and timings.get("predicted_per_second"):
            prompt_n = int(timings.get("prompt_n") or 0)
            predicted_n = int(timings.get("predicted_n") or 0)
            prompt_rate = float(timings.get("prompt_per_second") or 0.0)
            decode_rate = float(timings.get("predicted_per_second") or 0.0)
            if prompt_n >= 16 and prompt_rate > 0:
                self._prefill = ewma(self._prefill, prompt_rate, self._alpha)
            if predicted_n >= 4 and decode_rate > 0:
                self._decode = ewma(self._decode, decode_rate, self._alpha)
            prefill_s = float(timings.get("prompt_ms") or 0.0) / 1000
            decode_s = float(timings.get("predicted_ms") or 0.0) / 1000
            self.overhead.add(max(0.0, elapsed - prefill_s - decode_s))
            self._source = "timings"
            info.update(prefill_s=prefill_s, decode_s=decode_s)
            return info
        # No timings: split the wall time by the prefill/decode ratio known so far.
        rates = self.rates
        ratio = DEFAULT_RATIO
        if rates.prefill_tok_s and rates.decode_tok_s:
            ratio = rates.prefill_tok_s / rates.decode_tok_s
        work = prefilled / ratio + decoded  # in decode-token equivalents
        if work >= 4 and elapsed > 0:
            self._decode = ewma(self._decode, work / elapsed, self._alpha)
            self._prefill = self._decode * ratio
            self._source = "requests"
        prefill_s = elapsed * (prefilled / ratio) / work if work > 0 else 0.0
        info.update(prefill_s=prefill_s, decode_s=elapsed - prefill_s)
        return info
