"""The two value types of the package: what a signal reports and what the gate returns."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Score:
    """The gate's verdict on one completion.

    ``value`` is in [0, 1]: higher means the client is less likely to be worse off with this
    answer than with the API's. ``reasons`` are short machine-friendly strings, most important
    first. ``signals`` names the signals that applied (e.g. no ``confidence`` without logprobs).
    """

    value: float
    reasons: list[str] = field(default_factory=list)
    signals: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Signal:
    """What one signal saw.

    ``features`` are the numbers the combiner weighs. ``hard`` are failures that make the answer
    unusable whatever else is true (the combiner caps the score). ``soft`` maps a reason to the
    feature that carries it, so the combiner can order reasons by how much they cost.
    """

    name: str
    applied: bool
    features: dict[str, float] = field(default_factory=dict)
    hard: tuple[str, ...] = ()
    soft: dict[str, str] = field(default_factory=dict)
