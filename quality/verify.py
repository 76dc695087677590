"""Verification: facts the gate can compute itself, cheaper than any model.

- ``arith_wrong``: the answer states an equation (``7 + 8 + 9 = 27``) that is false.
- ``arith_mismatch``: the question is plain arithmetic ("What is 144 divided by 12?") and the
  answer does not state the result (as its final number, or as the one number of its first
  line).

Both are 0 when there is nothing to check. Numbers, operators and operator words are read with a
small tokenizer and evaluated without ``eval``.
"""

from __future__ import annotations

import math
import re

from quality._types import Signal
from quality._view import View

_OPS = {
    "+": "+",
    "plus": "+",
    "add": "+",
    "-": "-",
    "−": "-",
    "minus": "-",
    "*": "*",
    "x": "*",
    "×": "*",
    "·": "*",
    "times": "*",
    "multiplied by": "*",
    "/": "/",
    "÷": "/",
    "divided by": "/",
    "over": "/",
    "^": "^",
    "**": "^",
    "to the power of": "^",
}
_OP_WORDS = sorted(_OPS, key=len, reverse=True)
_NUM = r"\d+(?:,\d{3})*(?:\.\d+)?"
_TOKEN = re.compile(
    rf"({_NUM})|(" + "|".join(re.escape(w) for w in _OP_WORDS) + r")(?=\s|\d|$)", re.I
)
MAX_TERMS = 16
"""Longest chain of operations checked. Unbounded, and from any digit rather than a number's
first, a long run like ``1+1+1+…`` or ``1111…`` with no ``=`` made the search quadratic (half a
second for 4,000 characters)."""
_EQUATION = re.compile(
    rf"(?<![\d.,])((?:{_NUM})(?:\s*(?:[-+*/×÷x−^]|\*\*)\s*(?:{_NUM})){{1,{MAX_TERMS}}})\s*=\s*"
    rf"(-?{_NUM})"
    r"(?!\s*[-+*/×÷^]\s*\d)"
)
_CHAINED = re.compile(r"[-+*/×÷−^]\s*$")
"""Text ending in an operator: an equation found right after it is the tail of a chain longer
than ``MAX_TERMS``, not an equation of its own."""
_QUESTION = re.compile(
    rf"\b(?:what\s+is|what's|calculate|compute|how\s+much\s+is|evaluate)\s+"
    rf"((?:{_NUM})(?:\s*(?:[-+*/×÷x−^]|\*\*|plus|minus|times|multiplied\s+by|divided\s+by|"
    rf"to\s+the\s+power\s+of)\s*(?:{_NUM})){{1,{MAX_TERMS}}})\s*(?:\?|\.|$)",
    re.I,
)
_SPECIAL = (
    (
        re.compile(rf"\b(?:what\s+is\s+)?({_NUM})\s*%\s+of\s+({_NUM})", re.I),
        lambda a, b: a * b / 100,
    ),
    (re.compile(rf"\bsquare\s+of\s+({_NUM})\b", re.I), lambda a: a * a),
    (re.compile(rf"\b({_NUM})\s+squared\b", re.I), lambda a: a * a),
    (re.compile(rf"\bhalf\s+of\s+({_NUM})\b", re.I), lambda a: a / 2),
)
_ANSWER_NUM = re.compile(rf"(?<![\w.])-?{_NUM}(?![\d])")


def _number(text: str) -> float:
    return float(text.replace(",", ""))


def evaluate(expression: str) -> float | None:
    """Value of a flat arithmetic expression (numbers and + - * / ^ and their words)."""
    items: list[float | str] = []
    for m in _TOKEN.finditer(expression):
        if m.group(1):
            items.append(_number(m.group(1)))
        else:
            items.append(_OPS[re.sub(r"\s+", " ", m.group(2).lower())])
    if not items or len(items) % 2 == 0:
        return None
    nums = items[0::2]
    ops = items[1::2]
    if not all(isinstance(n, float) for n in nums) or not all(isinstance(o, str) for o in ops):
        return None
    values = [float(n) for n in nums if isinstance(n, float)]
    operators = [str(o) for o in ops]
    try:
        for level in (("^",), ("*", "/"), ("+", "-")):
            i = 0
            while i < len(operators):
                if operators[i] in level:
                    a, b = values[i], values[i + 1]
                    op = operators[i]
                    if op == "^":
                        if abs(b) > 64:
                            return None
                        r = a**b
                    elif op == "*":
                        r = a * b
                    elif op == "/":
                        r = a / b
                    elif op == "+":
                        r = a + b
                    else:
                        r = a - b
                    values[i : i + 2] = [r]
                    del operators[i]
                else:
                    i += 1
    except (ZeroDivisionError, OverflowError):
        return None
    return values[0] if len(values) == 1 and math.isfinite(values[0]) else None


def close(a: float, b: float) -> bool:
    """Equal for an answer's purposes: to a relative 1e-6, or when both round to the same cent."""
    return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-6) or round(a, 2) == round(b, 2)


def numbers_in(text: str) -> list[float]:
    """Every number written in ``text``, in order (thousands commas allowed)."""
    return [_number(n) for n in _ANSWER_NUM.findall(text)]


def false_equations(text: str) -> int:
    """How many ``a op b = c`` statements in ``text`` are false."""
    wrong = 0
    for m in _EQUATION.finditer(text):
        if _CHAINED.search(text[max(0, m.start() - 8) : m.start()]):
            continue
        value = evaluate(m.group(1))
        if value is not None and not close(value, _number(m.group(2))):
            wrong += 1
    return wrong


def expected_result(question: str) -> float | None:
    """The result of a question that is plain arithmetic, else None."""
    m = _QUESTION.search(question)
    if m:
        return evaluate(m.group(1))
    for pattern, fn in _SPECIAL:
        s = pattern.search(question)
        if s:
            return float(fn(*(_number(g) for g in s.groups())))
    return None


def states_result(answer: str, expected: float) -> bool:
    """The answer's final number is ``expected``, or its first line states it and no other."""
    found = _ANSWER_NUM.findall(answer)
    if not found:
        return False
    if close(_number(found[-1]), expected):
        return True
    first = {_number(n) for n in _ANSWER_NUM.findall(answer.strip().split("\n", 1)[0])}
    return len(first) == 1 and close(first.pop(), expected)


_NAME = "verify"


def verify(view: View) -> Signal:
    text = view.content
    if not text.strip():
        return Signal(_NAME, applied=False)
    wrong = false_equations(text)
    expected = expected_result(view.prompt)
    mismatch = 0.0
    if expected is not None:
        mismatch = 0.0 if states_result(text, expected) else 1.0
    if expected is None and wrong == 0 and "=" not in text:
        return Signal(_NAME, applied=False)
    soft: dict[str, str] = {}
    if wrong:
        soft["arithmetic_error"] = "arith_wrong"
    if mismatch:
        soft["wrong_result"] = "arith_mismatch"
    features = {"arith_wrong": float(min(wrong, 2)), "arith_mismatch": mismatch}
    return Signal(_NAME, applied=True, features=features, soft=soft)
