"""Confidence: how sure the model was of the tokens it chose, from their logprobs.

Applies only when the completion carries logprobs (local answers do; API answers usually don't).
Features:
- ``conf_mean``: mean token logprob.
- ``conf_worst_window``: the lowest mean over a sliding window of ``WINDOW`` tokens: one
  confused stretch (a made-up name, a wrong digit) inside an otherwise fluent answer.
- ``conf_low_share``: share of tokens chosen with probability below ``LOW_PROB``.
- ``conf_head``: mean logprob of the first ``HEAD`` tokens, where short answers commit.
- ``conf_head_min``: the lowest logprob among the first ``HEAD_MIN`` tokens.
- ``conf_novel_min``: the lowest logprob among the first ``HEAD`` tokens that carry a content
  word not found in the prompt: the answer-bearing tokens ("Canberra", "42"), not the filler
  that restates the question.
"""

from __future__ import annotations

import math
import re

from quality._types import Signal
from quality._view import View

WINDOW = 8
HEAD = 16
HEAD_MIN = 32
LOW_PROB = 0.3
FLOOR = -12.0
"""Logprobs are clipped here: -inf (a forced token) must not swamp the mean."""

_LOW_LOGPROB = math.log(LOW_PROB)
_WORD = re.compile(r"\w+", re.UNICODE)
_STOPWORDS = frozenset(
    "the a an of to in is are was were and or for on at by with as it its this that be what "
    "which who how do does did i you your my so".split()
)
_NAME = "confidence"


def confidence(view: View) -> Signal:
    if not view.logprobs or view.tokens is None:
        return Signal(_NAME, applied=False)
    values = [max(FLOOR, v) if math.isfinite(v) else FLOOR for v in view.logprobs]
    n = len(values)
    mean = sum(values) / n
    width = min(WINDOW, n)
    window_sum = sum(values[:width])
    worst = window_sum
    for i in range(width, n):
        window_sum += values[i] - values[i - width]
        worst = min(worst, window_sum)
    worst /= width
    low_share = sum(1 for v in values if v < _LOW_LOGPROB) / n
    head = values[: min(HEAD, n)]
    prompt_words = set(_WORD.findall(view.prompt.lower()))
    novel = [
        v
        for tok, v in zip(view.tokens[:HEAD], values[:HEAD], strict=False)
        if (word := tok.strip().lower())
        and _WORD.fullmatch(word)
        and word not in prompt_words
        and word not in _STOPWORDS
    ]
    features = {
        "conf_mean": mean,
        "conf_worst_window": worst,
        "conf_low_share": low_share,
        "conf_head": sum(head) / len(head),
        "conf_head_min": min(values[:HEAD_MIN]),
        "conf_novel_min": min(novel) if novel else 0.0,
    }
    soft: dict[str, str] = {}
    if mean < -1.0 or low_share > 0.4 or worst < -3.0:
        soft["low_confidence"] = "conf_mean"
    return Signal(_NAME, applied=True, features=features, soft=soft)
