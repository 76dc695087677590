"""Scoring a completion against its request: would the client be worse off with this answer?

Pure Python, no HTTP. Each signal is a small function from a :class:`~quality._view.View` of the
request and completion to a :class:`Signal`; the combiner turns them into one :class:`Score`.

>>> from quality import score
>>> s = score(request, completion)     # doctest: +SKIP
>>> s.value, s.reasons, s.signals      # doctest: +SKIP
(0.83, [], ['confidence', 'degeneration', 'evasion'])
"""

from __future__ import annotations

from typing import Any

from quality._types import Score, Signal
from quality._view import View, view_of
from quality.code_check import code_check
from quality.combiner import Combiner, default_combiner
from quality.confidence import confidence
from quality.degeneration import degeneration
from quality.evasion import evasion
from quality.format import format_compliance
from quality.instructions import instruction_compliance
from quality.relevance import Embedder, relevance
from quality.schema import check_schema
from quality.task import task
from quality.tool_use import tool_use
from quality.verify import verify

__all__ = ["Embedder", "Score", "Signal", "check_schema", "score", "signals"]

SIGNALS = (
    confidence,
    degeneration,
    evasion,
    format_compliance,
    instruction_compliance,
    verify,
    code_check,
    task,
    tool_use,
)


def signals(
    request: dict[str, Any], completion: dict[str, Any], *, embedder: Embedder | None = None
) -> list[Signal]:
    """Every signal's view of one answer (applied or not), in a fixed order. Relevance applies
    only with an ``embedder`` (see ``quality.relevance``)."""
    view: View = view_of(request, completion)
    return [*(signal(view) for signal in SIGNALS), relevance(view, embedder)]


def score(
    request: dict[str, Any],
    completion: dict[str, Any],
    *,
    combiner: Combiner | None = None,
    embedder: Embedder | None = None,
) -> Score:
    """Score ``completion`` (an OpenAI chat.completion dict) as an answer to ``request``."""
    return (combiner or default_combiner()).combine(signals(request, completion, embedder=embedder))
