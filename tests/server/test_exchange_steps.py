"""Who sets what on the exchange is read in one file (issue 40): outside proxy/serving/exchange.py
no module assigns an Exchange's field; every write goes through one of its named steps
(``ex.fell_back(reason)``, ``ex.served_locally(reason)``, ...).

The walk reads every module of ``proxy/`` (the package that is imported, so that the same test can
be pointed at another checkout) and finds the assignments whose target is an attribute of an
exchange: a name bound to one (``ex``, ``exchange``, a parameter or variable annotated ``Exchange``,
a variable made by ``Exchange(...)``), or an ``.ex`` / ``.exchange`` attribute (``turn.ex``);
``setattr`` on one counts too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import proxy

PROXY = Path(proxy.__file__).resolve().parent
HOME = PROXY / "serving" / "exchange.py"
NAMES = frozenset({"ex", "exchange"})


def _is_exchange_type(annotation: ast.expr | None) -> bool:
    if annotation is None:
        return False
    text = ast.unparse(annotation)
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        text = annotation.value
    return text.replace(" ", "").split("|")[0] == "Exchange"


class _Writes(ast.NodeVisitor):
    """The lines of ``tree`` that assign an attribute of an exchange."""

    def __init__(self) -> None:
        self.found: list[tuple[int, str]] = []
        self.scopes: list[set[str]] = [set(NAMES)]

    def _names(self) -> set[str]:
        return self.scopes[-1]

    def _function(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> None:
        names = set(self._names())
        arguments = node.args
        for arg in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]:
            if _is_exchange_type(arg.annotation):
                names.add(arg.arg)
        self.scopes.append(names)
        self.generic_visit(node)
        self.scopes.pop()

    visit_FunctionDef = _function  # noqa: N815 - ast.NodeVisitor's naming
    visit_AsyncFunctionDef = _function  # noqa: N815
    visit_Lambda = _function  # noqa: N815

    def _is_exchange(self, node: ast.expr) -> bool:
        if isinstance(node, ast.Name):
            return node.id in self._names()
        return isinstance(node, ast.Attribute) and node.attr in NAMES

    def _targets(self, target: ast.expr, line: int) -> None:
        if isinstance(target, ast.Tuple | ast.List):
            for element in target.elts:
                self._targets(element, line)
        elif isinstance(target, ast.Starred):
            self._targets(target.value, line)
        elif isinstance(target, ast.Attribute) and self._is_exchange(target.value):
            self.found.append((line, ast.unparse(target)))

    def visit_Assign(self, node: ast.Assign) -> None:  # noqa: N802
        made = isinstance(node.value, ast.Call) and ast.unparse(node.value.func) == "Exchange"
        for target in node.targets:
            if made and isinstance(target, ast.Name):
                self._names().add(target.id)
            self._targets(target, node.lineno)
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:  # noqa: N802
        self._targets(node.target, node.lineno)
        self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:  # noqa: N802
        if isinstance(node.target, ast.Name) and _is_exchange_type(node.annotation):
            self._names().add(node.target.id)
        self._targets(node.target, node.lineno)
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:  # noqa: N802
        if isinstance(node.func, ast.Name) and node.func.id == "setattr" and node.args:
            if self._is_exchange(node.args[0]):
                self.found.append((node.lineno, ast.unparse(node)))
        self.generic_visit(node)


def _writes(source: str) -> list[tuple[int, str]]:
    walker = _Writes()
    walker.visit(ast.parse(source))
    return walker.found


def test_the_walk_finds_every_kind_of_direct_write() -> None:
    # The walk itself, on a module written to break the rule in each way it knows.
    source = """
def handle(request, ex):
    ex.reason = "x"
    ex.route, ex.reason = "api", "y"
    ex.api_ms += 1.0
def step(turn, held: Exchange, other: "Exchange | None") -> None:
    turn.ex.error = "z"
    held.status = 499
    other.model = "m"
    setattr(held, "route", "local")
def made():
    fresh = Exchange(request_id="r")
    fresh.stream = True
    typed: Exchange = fresh
    typed.body = {}
def fine(thing, ex):
    thing.reason = "not an exchange"
    ex.fell_back("a step")
"""
    found = [text for _, text in _writes(source)]
    assert found == [
        "ex.reason",
        "ex.route",
        "ex.reason",
        "ex.api_ms",
        "turn.ex.error",
        "held.status",
        "other.model",
        "setattr(held, 'route', 'local')",
        "fresh.stream",
        "typed.body",
    ]


def test_only_exchange_py_assigns_an_exchange_field() -> None:
    outside = []
    for path in sorted(PROXY.rglob("*.py")):
        if path == HOME:
            continue
        for line, text in _writes(path.read_text(encoding="utf-8")):
            outside.append(f"{path.relative_to(PROXY.parent)}:{line}: {text}")
    print(f"{len(outside)} direct writes outside {HOME.relative_to(PROXY.parent)}")
    assert outside == [], "\n".join(outside)


def test_exchange_py_sets_its_fields_in_named_steps() -> None:
    # Inside exchange.py, fields are set by the Exchange's own methods (``self.x = ...``),
    # never by a module function reaching into an exchange it was handed.
    found = _writes(HOME.read_text(encoding="utf-8"))
    assert found == []
