"""Evasion: an answer that does not answer.

- ``refusal``: "I cannot…", "As an AI…", "I'm sorry, but…" near the start of the answer.
- ``restates_question``: the answer mostly repeats the question's own phrases back
  (``restate_ratio``: share of the answer's word trigrams found in the prompt).
- ``copies_input``: the answer reproduces most of a long prompt (a passage to summarise, a
  sentence to extract from, code to fix) instead of working on it (``copy_share``: share of
  the prompt's word 4-grams found in the answer; 0 for prompts under ``COPY_MIN_WORDS``).
- ``echoes_quote``: the answer repeats a passage the prompt quotes (``'…'``, ``"…"``, or the
  text after a colon and a line break) rather than picking the asked part out of it or judging
  it (``quote_copy``: the largest share of one quoted passage's word trigrams found in the
  answer; 0 when nothing of at least ``QUOTE_MIN_WORDS`` words is quoted).
"""

from __future__ import annotations

import re

from quality._types import Signal
from quality._view import View

_REFUSAL = re.compile(
    r"""
    \b(?:
        i\s*(?:cannot|can't|can\s+not|won't|will\s+not|am\s+unable|'m\s+unable|am\s+not\s+able
            |'m\s+not\s+able|do\s+not\s+have\s+(?:access|the\s+ability|enough\s+information)
            |don't\s+have\s+(?:access|the\s+ability|enough\s+information)
            |apologi[sz]e|must\s+decline|refuse|'m\s+not\s+sure|am\s+not\s+sure)
      | as\s+an?\s+(?:ai|artificial\s+intelligence|language\s+model|large\s+language\s+model)
      | i'?m\s+(?:just\s+)?an?\s+(?:ai|language\s+model)
      | (?:i'm|i\s+am)\s+sorry,?\s+but
      | sorry,?\s+(?:but\s+)?i\s+(?:can't|cannot)
      | it\s+is\s+not\s+(?:possible|appropriate)\s+for\s+me
      | unfortunately,?\s+i
    )\b
    """,
    re.I | re.X,
)
REFUSAL_SPAN = 160
"""Refusals come first; a late "I cannot" inside a real answer is usually content."""

_WORD = re.compile(r"\w+", re.UNICODE)
RESTATE_N = 3
RESTATE_MIN_GRAMS = 3
RESTATE_FLAG = 0.6
COPY_N = 4
COPY_MIN_WORDS = 12
COPY_FLAG = 0.6
QUOTE_N = 3
QUOTE_MIN_WORDS = 5
QUOTE_FLAG = 0.8
_QUOTED = re.compile(
    r"'([^'\n]{12,})'|\"([^\"\n]{12,})\"|“([^”]{12,})”|‘([^’]{12,})’|:[ \t]*\n+(.{40,})\Z", re.S
)
_NAME = "evasion"


def _grams(words: list[str], n: int) -> set[tuple[str, ...]]:
    return {tuple(words[i : i + n]) for i in range(len(words) - n + 1)}


def refusal(text: str) -> bool:
    return _REFUSAL.search(text[:REFUSAL_SPAN]) is not None


def restate_ratio(answer: str, question: str) -> float:
    """Share of the answer's word trigrams that also occur in the question."""
    a = _WORD.findall(answer.lower())
    q = _WORD.findall(question.lower())
    if len(a) < RESTATE_N + RESTATE_MIN_GRAMS - 1 or len(q) < RESTATE_N:
        return 0.0
    q_grams = _grams(q, RESTATE_N)
    a_grams = [tuple(a[i : i + RESTATE_N]) for i in range(len(a) - RESTATE_N + 1)]
    return sum(1 for g in a_grams if g in q_grams) / len(a_grams)


def copy_share(answer: str, prompt: str) -> float:
    """Share of the prompt's word 4-grams that the answer repeats."""
    q = _WORD.findall(prompt.lower())
    if len(q) < COPY_MIN_WORDS:
        return 0.0
    q_grams = _grams(q, COPY_N)
    return len(q_grams & _grams(_WORD.findall(answer.lower()), COPY_N)) / len(q_grams)


def quote_copy(answer: str, prompt: str) -> float:
    """Largest share of one quoted passage's word trigrams that the answer repeats."""
    a_grams = _grams(_WORD.findall(answer.lower()), QUOTE_N)
    best = 0.0
    for m in _QUOTED.finditer(prompt):
        q = _WORD.findall(next(g for g in m.groups() if g).lower())
        if len(q) < QUOTE_MIN_WORDS:
            continue
        q_grams = _grams(q, QUOTE_N)
        best = max(best, len(q_grams & a_grams) / len(q_grams))
    return best


def evasion(view: View) -> Signal:
    text = view.content.strip()
    if not text:
        return Signal(_NAME, applied=False)
    soft: dict[str, str] = {}
    refused = 1.0 if refusal(text) else 0.0
    if refused:
        soft["refusal"] = "refusal"
    restate = restate_ratio(text, view.prompt)
    if restate >= RESTATE_FLAG:
        soft["restates_question"] = "restate_ratio"
    copied = copy_share(text, view.prompt)
    if copied >= COPY_FLAG:
        soft["copies_input"] = "copy_share"
    quoted = quote_copy(text, view.prompt)
    if quoted >= QUOTE_FLAG:
        soft["echoes_quote"] = "quote_copy"
    features = {
        "refusal": refused,
        "restate_ratio": restate,
        "copy_share": copied,
        "quote_copy": quoted,
    }
    return Signal(_NAME, applied=True, features=features, soft=soft)
