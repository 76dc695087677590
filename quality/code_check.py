"""Code: checks on Python in the question or the answer that the gate can settle itself.

- ``code_never_returns`` (hard): a function in the answer calls itself on every path (no ``if``,
  loop, ``try``, ``and``/``or`` or conditional expression anywhere in its body), so calling it
  can only end in ``RecursionError``. Small models write ``return n * factorial(n - 1)`` with no
  base case.
- ``code_syntax`` (feature ``code_broken``): a closed block the answer labels as Python, or an
  unlabelled one holding a ``def`` when the question is about Python, does not parse. (A block
  cut off by the token limit is the truncation check's business.)
- ``code_unchanged`` (feature ``code_unchanged``): the question asks to fix a function it quotes,
  and the answer gives back the same function (same syntax tree).
- ``code_wrong_output`` (feature ``code_mismatch``): the question asks what a Python expression
  prints or returns (``print(len('hello'))``, "the result of ``'abc'.upper()``"), the expression
  is small and pure, and the answer never states its value once the expression itself is taken
  out of it.

The expressions are evaluated by :mod:`quality.code_eval` (a walk over the syntax tree with size
limits; nothing is passed to ``eval``, and nothing in the answer is run). The signal does not
apply when none of this is present.

Imports the standard library and ``quality``'s own modules (``_types``, ``_view``, ``verify``,
``code_eval``).
"""

from __future__ import annotations

import ast
import itertools
import re
from collections.abc import Iterator
from typing import Any

from quality._types import Signal
from quality._view import View
from quality.code_eval import evaluate, expression, parse
from quality.verify import close, numbers_in

_NAME = "code"
MAX_QUOTED = 5
"""Most ``print(`` calls or ``def`` lines of a prompt read: scoring stays cheap on any prompt."""
MAX_FUNCTION_CHARS = 2000
"""A function quoted for fixing is read from at most this many characters after its ``def``..."""
MAX_CUTS = 12
"""...cut at the last of these sentence or paragraph ends that parses."""
_BLOCK = re.compile(r"```[ \t]*([\w+-]*)[ \t]*\n(.*?)(```|\Z)", re.S)
_BRANCHES = (
    ast.If,
    ast.IfExp,
    ast.For,
    ast.AsyncFor,
    ast.While,
    ast.Try,
    ast.BoolOp,
    ast.Match,
    ast.comprehension,
)
_QUESTION = re.compile(
    r"(?:result|value|output)\s+of\s+(.{1,200}?)(?:\s+in\s+python\b|\s*\?|$)"
    r"|\bdoes\s+(.{1,200}?)\s+(?:return|evaluate\s+to|give|output|print)\b",
    re.I,
)


def _interesting(tree: ast.expr) -> bool:
    return isinstance(tree, ast.Call | ast.BinOp | ast.Subscript | ast.Compare | ast.UnaryOp)


def _print_arguments(prompt: str) -> Iterator[str]:
    """The argument of each ``print(...)`` call written in the prompt."""
    for m in itertools.islice(re.finditer(r"\bprint\s*\(", prompt), MAX_QUOTED):
        start = m.end()
        for end in range(start, min(len(prompt), start + 300)):
            if prompt[end] != ")":
                continue
            inner = prompt[start:end]
            if expression(inner) is not None:
                yield inner
                break


def asked_expression(prompt: str) -> tuple[str, Any, bool] | None:
    """``(source, value, printed)`` of the expression whose output the question asks for."""
    if not re.search(r"\bpython\b|\bprint\s*\(", prompt, re.I):
        return None
    for inner in _print_arguments(prompt):
        ok, value = evaluate(inner)
        if ok:
            return inner.strip(), value, True
    for m in _QUESTION.finditer(prompt):
        candidate = (m.group(1) or m.group(2) or "").strip().strip("`")
        tree = expression(candidate)
        if tree is not None and _interesting(tree):
            ok, value = evaluate(candidate)
            if ok:
                return candidate, value, False
    return None


def _spellings(value: Any, printed: bool) -> set[str]:
    if isinstance(value, type):
        return {value.__name__, f"<class '{value.__name__}'>"}
    found = {str(value)}
    if not printed or isinstance(value, str):
        found.add(repr(value))
    if isinstance(value, str):
        found |= {f'"{value}"', f"'{value}'"}
    return {s for s in found if s}


def states_value(answer: str, source: str, value: Any, printed: bool) -> bool:
    """The answer, with the expression itself taken out, states ``value``."""
    text = answer
    for echo in (f"print({source})", source):
        text = text.replace(echo, " ")
    if isinstance(value, int | float) and not isinstance(value, bool):
        return any(close(n, float(value)) for n in numbers_in(text))
    for spelling in _spellings(value, printed):
        pattern = re.escape(spelling)
        if re.search(rf"(?<![\w]){pattern}(?![\w])" if spelling[0].isalnum() else pattern, text):
            return True
    return False


def _python_blocks(view: View) -> Iterator[tuple[str, bool]]:
    """Each Python block of the answer, and whether it is closed (not cut off by the limit)."""
    about_python = bool(re.search(r"\bpython\b", view.instructions, re.I))
    for lang, body, end in _BLOCK.findall(view.content):
        lang = lang.lower()
        if lang in ("python", "py", "python3") or (
            not lang and about_python and re.search(r"^\s*def\s+\w+\s*\(", body, re.M)
        ):
            yield body, bool(end)


_FIX = re.compile(r"\b(?:bug|fix|correct|debug|wrong|broken|doesn't\s+work)\w*", re.I)
_DEF = re.compile(r"\bdef\s+\w+\s*\(")


def _functions(tree: ast.AST) -> list[str]:
    try:
        return [
            ast.dump(node)
            for node in ast.walk(tree)
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        ]
    except RecursionError:
        return []


def quoted_functions(prompt: str) -> list[str]:
    """Syntax trees of the functions written in the prompt (inline or on their own lines)."""
    found: list[str] = []
    for m in itertools.islice(_DEF.finditer(prompt), MAX_QUOTED):
        rest = prompt[m.start() : m.start() + MAX_FUNCTION_CHARS]
        ends = [e.start() for e in re.finditer(r"\n\s*\n|\.\s|\?|$", rest)]
        for end in sorted(set(ends), reverse=True)[:MAX_CUTS]:
            tree = parse(rest[:end])
            if tree is not None:
                found.extend(_functions(tree))
                break
    return found


def never_returns(tree: ast.AST) -> bool:
    """A function in ``tree`` calls itself and has no branch that could stop the recursion."""
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        inner = list(ast.walk(node))
        if any(isinstance(n, _BRANCHES) for n in inner):
            continue
        if any(
            isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == node.name
            for n in inner
        ):
            return True
    return False


def code_check(view: View) -> Signal:
    blocks = list(_python_blocks(view)) if "```" in view.content else []
    asked = asked_expression(view.prompt)
    if not blocks and asked is None:
        return Signal(_NAME, applied=False)
    hard: list[str] = []
    broken = unchanged = 0.0
    to_fix = quoted_functions(view.prompt) if blocks and _FIX.search(view.prompt) else []
    for body, closed in blocks:
        tree = parse(body)
        if tree is None:
            broken = max(broken, float(closed))  # a block cut off by the limit is truncation's
            continue
        if never_returns(tree) and "code_never_returns" not in hard:
            hard.append("code_never_returns")
        if to_fix and any(f in to_fix for f in _functions(tree)):
            unchanged = 1.0
    mismatch = 0.0
    if asked is not None and view.content.strip():
        mismatch = 0.0 if states_value(view.content, *asked) else 1.0
    soft: dict[str, str] = {}
    if broken:
        soft["code_syntax"] = "code_broken"
    if mismatch:
        soft["code_wrong_output"] = "code_mismatch"
    if unchanged:
        soft["code_unchanged"] = "code_unchanged"
    return Signal(
        _NAME,
        applied=True,
        features={"code_broken": broken, "code_mismatch": mismatch, "code_unchanged": unchanged},
        hard=tuple(hard),
        soft=soft,
    )
