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

Expressions are evaluated by walking their syntax tree with a short list of pure builtins and
string methods, and size limits on every intermediate value, checked before an operation that
could build something big runs (``'a'.zfill(3000000000)``, ``'%3000000000d' % 1``,
``[0] * 10**10``); nothing is ever passed to ``eval``, and nothing in the answer is run. The
signal does not apply when none of this is present.
"""

from __future__ import annotations

import ast
import itertools
import operator
import re
from collections.abc import Callable, Collection, Iterator
from typing import Any

from quality._types import Signal
from quality._view import View
from quality.verify import close, numbers_in

_NAME = "code"
_MAX_LEN = 1000
MAX_WEIGHT = 100_000
"""Most characters and items a value the evaluator builds may hold, nested ones included."""
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
_BINOPS: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_CMPOPS: dict[type[ast.cmpop], Callable[[Any, Any], Any]] = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.In: lambda a, b: a in b,
    ast.NotIn: lambda a, b: a not in b,
}
_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "len": len,
    "bool": bool,
    "int": int,
    "float": float,
    "str": str,
    "abs": abs,
    "min": min,
    "max": max,
    "sum": sum,
    "sorted": sorted,
    "list": list,
    "tuple": tuple,
    "set": set,
    "type": type,
    "round": round,
    "range": range,
}
_METHODS = frozenset(
    {
        "upper",
        "lower",
        "title",
        "capitalize",
        "swapcase",
        "strip",
        "lstrip",
        "rstrip",
        "split",
        "join",
        "replace",
        "count",
        "find",
        "index",
        "startswith",
        "endswith",
        "isdigit",
        "isalpha",
        "isupper",
        "islower",
        "zfill",
        "get",
        "keys",
        "values",
    }
)
_QUESTION = re.compile(
    r"(?:result|value|output)\s+of\s+(.{1,200}?)(?:\s+in\s+python\b|\s*\?|$)"
    r"|\bdoes\s+(.{1,200}?)\s+(?:return|evaluate\s+to|give|output|print)\b",
    re.I,
)


class _Unsafe(Exception):
    """The expression is not one the checker evaluates."""


_SCALAR_WEIGHT = 8
"""Weight of a number, None or a type: its repr is at most a few dozen characters (ints are
kept under 10**30)."""
_DIGITS = re.compile(r"\d+")
_CONTAINERS: tuple[type, ...] = (
    list,
    tuple,
    set,
    frozenset,
    dict,
    type({}.keys()),
    type({}.values()),
)


class _Walk:
    """One evaluation: the syntax tree walked node by node, every value's size known before
    anything bigger is built from it.

    A value's weight counts each character of its strings and each item of its containers
    (a list holding the same list 1,000 times counts it 1,000 times, as ``str()`` of it would
    print it), and no value may weigh more than :data:`MAX_WEIGHT`. Weights are remembered per
    object, so that checking ``[x] * 1000`` costs one look-up for ``x``. Operations whose
    result could be far bigger than their operands (``*`` on sequences, ``%`` formatting,
    ``str.join``, ``str.replace``, ``zfill``, ``round``'s digits, ``sum`` of sequences) are
    sized from their operands before they run.
    """

    def __init__(self) -> None:
        self._weights: dict[int, tuple[int, Any]] = {}

    def weight(self, value: Any) -> int:
        if isinstance(value, str):
            return len(value) + 1
        if isinstance(value, range):
            return (len(value) + 1) * _SCALAR_WEIGHT
        if not isinstance(value, _CONTAINERS):
            return _SCALAR_WEIGHT
        known = self._weights.get(id(value))
        if known is not None and known[1] is value:
            return known[0]
        items: Any = [*value.keys(), *value.values()] if isinstance(value, dict) else value
        total = 1 + len(items)
        for item in items:
            total += self.weight(item)
            if total > MAX_WEIGHT:
                raise _Unsafe
        self._weights[id(value)] = (total, value)  # the value is kept, so its id stays its own
        return total

    def sized(self, value: Any) -> Any:
        if isinstance(value, str | list | tuple | set | dict | range) and len(value) > _MAX_LEN:
            raise _Unsafe
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 10**30:
            raise _Unsafe
        if self.weight(value) > MAX_WEIGHT:
            raise _Unsafe
        return value

    def binop(self, op: ast.operator, left: Any, right: Any) -> Any:
        if isinstance(op, ast.Pow) and (
            not isinstance(right, int | float) or abs(right) > 64 or abs(left) > 10**6
        ):
            raise _Unsafe
        if isinstance(op, ast.Mult) and (
            isinstance(left, str | list | tuple) or isinstance(right, str | list | tuple)
        ):
            seq, count = (left, right) if isinstance(left, str | list | tuple) else (right, left)
            if not isinstance(count, int) or count > _MAX_LEN:
                raise _Unsafe
            if self.weight(seq) * max(count, 0) > MAX_WEIGHT:
                raise _Unsafe
        if isinstance(op, ast.Mod) and isinstance(left, str):
            # Widths and precisions are digit runs of the format ("%3000000000d", "%.999f"):
            # all of them together bound what formatting can add; "*" takes them from the
            # arguments, so it is refused.
            if "*" in left or _format_growth(left) + self.weight(right) > MAX_WEIGHT:
                raise _Unsafe
        return self.sized(_BINOPS[type(op)](left, right))

    def call(self, node: ast.Call) -> Any:
        args = [self.eval(a) for a in node.args]
        if isinstance(node.func, ast.Name) and node.func.id in _FUNCTIONS:
            name = node.func.id
            if name == "range" and any(abs(a) > _MAX_LEN for a in args):
                raise _Unsafe
            if name == "round" and len(args) > 1 and abs(args[1]) > _MAX_LEN:
                raise _Unsafe  # round(1, -10**18) builds 10**(10**18)
            if name == "sum" and not all(
                isinstance(a, int | float) for part in _sum_parts(args) for a in part
            ):
                raise _Unsafe  # sum() of lists copies the total once per item
            return self.sized(_FUNCTIONS[name](*args))
        if isinstance(node.func, ast.Attribute) and node.func.attr in _METHODS:
            owner = self.eval(node.func.value)
            if not isinstance(owner, str | list | tuple | dict):
                raise _Unsafe
            if isinstance(owner, str):
                self.check_str_method(owner, node.func.attr, args)
            return self.sized(getattr(owner, node.func.attr)(*args))
        raise _Unsafe

    def check_str_method(self, owner: str, method: str, args: list[Any]) -> None:
        """Refuse a string method whose result would weigh more than the limit."""
        if method == "zfill" and args and isinstance(args[0], int) and args[0] > _MAX_LEN:
            raise _Unsafe
        if method == "join" and args:
            parts = args[0]
            count = len(parts) if isinstance(parts, Collection) else 0
            if self.weight(parts) + len(owner) * count > MAX_WEIGHT:
                raise _Unsafe
        if method == "replace" and len(args) >= 2:
            old, new = args[0], args[1]
            if isinstance(old, str) and isinstance(new, str):
                hits = owner.count(old) if old else len(owner) + 1
                if len(owner) + hits * len(new) > MAX_WEIGHT:
                    raise _Unsafe

    def eval(self, node: ast.AST) -> Any:  # noqa: PLR0911, PLR0912 (one branch per node type)
        if isinstance(node, ast.Constant):
            if isinstance(node.value, bool | int | float | str) or node.value is None:
                return self.sized(node.value)
            raise _Unsafe
        if isinstance(node, ast.List | ast.Tuple | ast.Set):
            items = [self.eval(e) for e in node.elts]
            kind = {ast.List: list, ast.Tuple: tuple, ast.Set: set}[type(node)]
            return self.sized(kind(items))
        if isinstance(node, ast.Dict):
            if any(k is None for k in node.keys):
                raise _Unsafe
            pairs = zip(node.keys, node.values, strict=True)
            return self.sized({self.eval(k): self.eval(v) for k, v in pairs})  # type: ignore[arg-type]
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            return self.binop(node.op, self.eval(node.left), self.eval(node.right))
        if isinstance(node, ast.UnaryOp):
            value = self.eval(node.operand)
            if isinstance(node.op, ast.USub):
                return -value
            if isinstance(node.op, ast.UAdd):
                return +value
            if isinstance(node.op, ast.Not):
                return not value
            raise _Unsafe
        if isinstance(node, ast.BoolOp):
            values = [self.eval(v) for v in node.values]
            result = values[0]
            for v in values[1:]:
                result = (result and v) if isinstance(node.op, ast.And) else (result or v)
            return result
        if isinstance(node, ast.Compare):
            left = self.eval(node.left)
            for op, comparator in zip(node.ops, node.comparators, strict=True):
                if type(op) not in _CMPOPS:
                    raise _Unsafe
                right = self.eval(comparator)
                if not _CMPOPS[type(op)](left, right):
                    return False
                left = right
            return True
        if isinstance(node, ast.Subscript):
            target = self.eval(node.value)
            if isinstance(node.slice, ast.Slice):
                parts = (node.slice.lower, node.slice.upper, node.slice.step)
                bounds = [None if p is None else self.eval(p) for p in parts]
                return self.sized(target[slice(*bounds)])
            return self.sized(target[self.eval(node.slice)])
        if isinstance(node, ast.Call) and not node.keywords:
            return self.call(node)
        raise _Unsafe


def _format_growth(fmt: str) -> int:
    """An upper bound of what ``fmt % args`` adds to ``fmt`` besides the arguments' text."""
    return len(fmt) + sum(
        int(run) if len(run) < 7 else MAX_WEIGHT + 1 for run in _DIGITS.findall(fmt)
    )


def _sum_parts(args: list[Any]) -> list[Any]:
    """The items ``sum(*args)`` adds: those of its iterable, and its start value."""
    items = list(args[0]) if args and isinstance(args[0], Collection) else [None]
    return [items, args[1:]]


_UNPARSABLE = (SyntaxError, ValueError, RecursionError, MemoryError)
"""What ``ast.parse`` raises on text that is not Python, or nested too deep for the parser."""


def _parse(source: str, mode: str = "exec") -> ast.AST | None:
    try:
        return ast.parse(source.strip(), mode=mode)
    except _UNPARSABLE:
        return None


def _expression(source: str) -> ast.expr | None:
    tree = _parse(source, "eval")
    return tree.body if isinstance(tree, ast.Expression) else None


def evaluate(source: str) -> tuple[bool, Any]:
    """``(True, value)`` for a small pure Python expression, else ``(False, None)``."""
    tree = _expression(source)
    if tree is None:
        return False, None
    try:
        return True, _Walk().eval(tree)
    except (_Unsafe, TypeError, ArithmeticError, LookupError, *_UNPARSABLE):
        return False, None


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
            if _expression(inner) is not None:
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
        tree = _expression(candidate)
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
            tree = _parse(rest[:end])
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
        tree = _parse(body)
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
