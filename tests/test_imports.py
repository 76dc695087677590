"""No circle between the modules of proxy/: following imports from any module never leads back
to it.

import-linter (tests/test_layers.py) holds the rooms to one direction, but it compares rooms,
not modules: two modules of one room that import each other, or a chain of five that closes
on itself, pass it. Such a circle runs today only because one of its imports is deferred (inside
a function, or under ``TYPE_CHECKING``), and a reader following the code goes round it. So this
test reads every ``import`` of every module with :mod:`ast` (those under ``TYPE_CHECKING`` and
inside functions too), builds the graph of modules, and fails on each circle it finds.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _module_of(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    """Every module of proxy/, by dotted name (a package by its own name: its __init__)."""
    return {_module_of(p): p for p in sorted((ROOT / "proxy").rglob("*.py"))}


def _resolve(name: str, known: dict[str, Path]) -> str | None:
    """The module of proxy/ that ``name`` is or is in (a class or function of it)."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def imports_of(module: str, known: dict[str, Path]) -> set[str]:
    """The modules of proxy/ that ``module`` imports, wherever the import stands."""
    path = known[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            names = [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        for name in names:
            target = _resolve(name, known)
            if target is not None and target != module:
                found.add(target)
    return found


def graph() -> dict[str, set[str]]:
    known = modules()
    return {m: imports_of(m, known) for m in known}


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Each strongly connected group of more than one module (Tarjan's algorithm), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(edges.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return sorted(found)


def test_the_graph_sees_deferred_imports() -> None:
    """An import under TYPE_CHECKING or in a function is an edge: the circles are read from
    every import, not only those that run at import time."""
    edges = graph()
    assert "proxy.server.run" in edges["proxy.cli.serving"]  # imported inside _serve
    assert "proxy.ledger.writing.writer" in edges["proxy.serving.services"]  # TYPE_CHECKING


def test_no_circle_between_modules() -> None:
    assert circles(graph()) == []
