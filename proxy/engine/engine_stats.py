"""What the local engine has done, as the proxy sees it: counts, rates and the batch's state.

:class:`EngineStats` is kept by :class:`~proxy.engine.local_engine.LocalEngine` from the worker's
messages: each answer (``observe``: the decode and prefill rates as moving averages, speculation's
drafted and accepted tokens, the prefix cache's counts, the batch's per-sequence rate), the
start-up calibration, the batch's periodic progress report, and the worker's crashes and
restarts. ``/healthz`` and ``/metrics`` read it through ``LocalEngine.health()``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from proxy.engine.rates import ewma

__all__ = ["EngineStats"]


@dataclass
class EngineStats:
    """What the engine has done so far; decode and prefill rates are moving averages."""

    completed: int = 0
    timeouts: int = 0
    crashes: int = 0
    restarts: int = 0
    prefill_tok_s: float | None = None
    decode_tok_s: float | None = None
    rates_source: str = "none"
    speculated: int = 0  # requests that went through the speculative loop
    drafted: int = 0
    accepted: int = 0
    prefix_cache: dict[str, Any] | None = None
    batch: dict[str, Any] | None = None  # the worker's batch loop, as of the last answer
    sequence_tok_s: float | None = None  # decode rate of one sequence in the batch (EWMA)
    alpha: float = field(default=0.2, repr=False)

    def calibrated(self, calibration: dict[str, Any] | None) -> None:
        """Start from the worker's start-up measurements until real requests say otherwise."""
        if not calibration or self.rates_source == "requests":
            return
        self.prefill_tok_s = float(calibration["prefill_tok_s"])
        self.decode_tok_s = float(calibration["decode_tok_s"])
        self.rates_source = "calibration"

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    def observe(self, completion: dict[str, Any]) -> None:
        info = completion.get("frugal") or {}
        spec = info.get("speculative")
        if spec:
            self.speculated += 1
            self.drafted += int(spec.get("drafted", 0))
            self.accepted += int(spec.get("accepted", 0))
        if info.get("prefix_cache") is not None:
            self.prefix_cache = info["prefix_cache"]
        batch = info.get("batch")
        if batch:
            self.batch = batch.get("engine")
            if batch.get("tok_s"):
                self.sequence_tok_s = ewma(self.sequence_tok_s, float(batch["tok_s"]), self.alpha)
        prefill_s, decode_s = info.get("prefill_s", 0.0), info.get("decode_s", 0.0)
        prefilled = info.get("prefilled_tokens", 0)
        decoded = (completion.get("usage") or {}).get("completion_tokens", 0)
        if decoded == 0 and info.get("stop_cause") in ("deadline", "cancelled"):
            # Stopped during the prompt (or before it, a job whose deadline had passed in the
            # queue): only part of it was evaluated, so its time says nothing of the rate.
            prefilled = 0
        if prefilled >= 16 and prefill_s > 0:
            self.prefill_tok_s = ewma(self.prefill_tok_s, prefilled / prefill_s, self.alpha)
        if decoded >= 4 and decode_s > 0:
            self.decode_tok_s = ewma(self.decode_tok_s, (decoded - 1) / decode_s, self.alpha)
        if (prefilled >= 16 and prefill_s > 0) or (decoded >= 4 and decode_s > 0):
            self.rates_source = "requests"
