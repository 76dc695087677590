"""Task: what kind of request this is, read from the request alone.

A small local model is good at some kinds of request (short facts, code idioms, summaries) and
bad at others (arithmetic, translation, multi-step reasoning). How often *this* model gets a kind
of request right is evidence about its answer, so these one-hot features enter the combiner's
``full`` model, the one used for local answers (which carry logprobs). They say nothing about an
answer from another model: the ``no_logprobs`` model, used for API answers, leaves them out, so
the score stays an estimate of the answer being right on every route.

Kinds (first match wins): ``json``, ``translate``, ``math``, ``code``, ``choice``, ``summarise``,
``extract``, ``write``; otherwise ``other`` (all features 0).
"""

from __future__ import annotations

import re

from quality._types import Signal
from quality._view import View
from quality.language import LANGUAGE_NAMES

KINDS = ("json", "translate", "math", "code", "choice", "summarise", "extract", "write")

_LANGS = "|".join(LANGUAGE_NAMES)
_PATTERNS: dict[str, re.Pattern[str]] = {
    "json": re.compile(r"\bjson\b", re.I),
    "translate": re.compile(
        rf"\btranslat\w*\b|\bhow\s+do\s+you\s+say\b|\b(?:{_LANGS})\s+(?:word|phrase)\s+for\b"
        rf"|\bin\s+(?:{_LANGS})\s*\?",
        re.I,
    ),
    "code": re.compile(
        r"```|\b(?:python|javascript|typescript|java|sql|html|css|bash|shell|rust|golang|regex|"
        r"function|code|def|print\(|compile|variable|git)\b",
        re.I,
    ),
    "choice": re.compile(
        r"\b(?:classify|categori[sz]e|label|one\s+of|true\s+or\s+false|yes\s+or\s+no|"
        r"spam|sentiment|category)\b|\b\w+\s+or\s+(?:a\s+|an\s+)?\w+\s*\?\s*$",
        re.I,
    ),
    "summarise": re.compile(r"\bsummar\w*\b|\bmain\s+point\b|\btl;?dr\b", re.I),
    "extract": re.compile(
        r"\bextract\b|\b(?:in|from)\s+(?:this|the)\s+(?:text|sentence|message|"
        r"note|story|address)\b|:\s*['\"]",
        re.I,
    ),
    "write": re.compile(
        r"\b(?:write|compose|draft|describe|suggest|give\s+(?:me\s+)?(?:three|some|a\s+few)|"
        r"explain|poem|story|haiku|limerick|email|message|review|tips)\b",
        re.I,
    ),
}

_MATH_OPERATION = re.compile(
    r"\d\s*(?:[-+*/×÷^%]|\bplus\b|\bminus\b|\btimes\b|\bmultiplied\s+by\b|"
    r"\bdivided\s+by\b)\s*\d"
    r"|\bcomes?\s+next\b|\bdivisible\b|\bprime\b",
    re.I,
)
_MATH_WORD = re.compile(
    r"\b(?:squared|square\s+root|square\s+of|power\s+of|factorial|percent|sum\s+of|"
    r"how\s+many|how\s+much|how\s+far|how\s+old|area|average|round)\b",
    re.I,
)
_MATH_QUESTION = re.compile(r"\b(?:how\s+many|how\s+much|how\s+far|total)\b", re.I)
_DIGIT = re.compile(r"\d")


def _is_math(text: str) -> bool:
    """An operation between numbers, a maths word with a number after it, or a number with a
    quantity question after it. Each part is one linear search: as a single pattern with
    ``.*`` between them, a digit-dense prompt took seconds."""
    if _MATH_OPERATION.search(text):
        return True
    word = _MATH_WORD.search(text)
    if word is not None and _DIGIT.search(text, word.end()):
        return True
    digit = _DIGIT.search(text)
    return digit is not None and _MATH_QUESTION.search(text, digit.end()) is not None


_NAME = "task"


def kind_of(view: View) -> str:
    if view.response_format is not None and view.response_format.get("type") != "text":
        return "json"
    for kind in KINDS:
        if _is_math(view.prompt) if kind == "math" else _PATTERNS[kind].search(view.prompt):
            return kind
    return "other"


def task(view: View) -> Signal:
    kind = kind_of(view)
    features = {f"task_{k}": 1.0 if k == kind else 0.0 for k in KINDS}
    return Signal(_NAME, applied=True, features=features)
