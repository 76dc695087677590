"""A small pure Python expression evaluated without ``eval``: what the code signal
(:mod:`quality.code_check`) compares an answer's stated value against.

    evaluate(source)    ``(True, value)`` for a small pure expression, else ``(False, None)``
    parse(source)       the syntax tree, or None for text that is not Python (or nested past
                        the parser's limit)
    expression(source)  the tree of one expression, or None

Expressions are evaluated by walking their syntax tree with a short list of pure builtins and
string methods, and size limits on every intermediate value, checked before an operation that
could build something big runs (``'a'.zfill(3000000000)``, ``'%3000000000d' % 1``,
``[0] * 10**10``); nothing is ever passed to ``eval``, and nothing in the answer is run.

Imports only the standard library.
"""

from __future__ import annotations

import ast
import operator
import re
from collections.abc import Callable, Collection
from typing import Any

_MAX_LEN = 1000
MAX_WEIGHT = 100_000
"""Most characters and items a value the evaluator builds may hold, nested ones included."""
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


def parse(source: str, mode: str = "exec") -> ast.AST | None:
    """The syntax tree of ``source`` (``mode`` as :func:`ast.parse`'s), None when it does not
    parse."""
    try:
        return ast.parse(source.strip(), mode=mode)
    except _UNPARSABLE:
        return None


def expression(source: str) -> ast.expr | None:
    """The tree of ``source`` read as one expression, None when it is not one."""
    tree = parse(source, "eval")
    return tree.body if isinstance(tree, ast.Expression) else None


def evaluate(source: str) -> tuple[bool, Any]:
    """``(True, value)`` for a small pure Python expression, else ``(False, None)``."""
    tree = expression(source)
    if tree is None:
        return False, None
    try:
        return True, _Walk().eval(tree)
    except (_Unsafe, TypeError, ArithmeticError, LookupError, *_UNPARSABLE):
        return False, None
