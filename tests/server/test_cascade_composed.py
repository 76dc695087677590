"""Every endpoint reads top to bottom (issue 40): each holds a Cascade (proxy/serving/cascade.py)
and calls its steps; no endpoint's handler subclasses another class, no module reaches into another
object's private attribute, and no handler makes a response it does not send. Every endpoint is a
service that takes a call, made from the request in one place, and returns an answer or a stream
of events.

The checks read the modules of ``proxy/server``, ``proxy/serving`` and ``proxy/protocol`` (of the
package that is imported, so that the same test can be pointed at another checkout) with ``ast``.
"""

from __future__ import annotations

import ast
import typing
from pathlib import Path

import proxy
from proxy.server.endpoints import ENDPOINTS
from proxy.serving.call import Call, Outcome

ROOMS = [Path(proxy.__file__).resolve().parent / room for room in ("server", "serving", "protocol")]


def _trees() -> list[tuple[str, ast.Module]]:
    return [
        (path.name, ast.parse(path.read_text(encoding="utf-8")))
        for room in ROOMS
        for path in sorted(room.glob("*.py"))
    ]


def test_no_endpoint_subclasses_another_class() -> None:
    made = {getattr(endpoint.make, "__name__", "") for endpoint in ENDPOINTS}
    subclassed = [
        f"{name}: {node.name}({', '.join(ast.unparse(base) for base in node.bases)})"
        for name, tree in _trees()
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef) and node.name in made and node.bases
    ]
    assert subclassed == []


def _own(tree: ast.Module) -> set[str]:
    """The private names a module defines for its objects: its functions and methods, what
    it assigns to ``self._x``, and the fields its classes declare (a dataclass's)."""
    names = {
        node.name
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    }
    names |= {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
    }
    names |= {
        statement.target.id
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef)
        for statement in node.body
        if isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name)
    }
    return names


# The one reach into private state the rooms keep, with why: frugal serve's uvicorn server drops
# SIGTERM from the signals uvicorn re-raises after its drain, and uvicorn has no public way to.
THIRD_PARTY = {"run.py": {"_captured_signals"}}


def test_no_module_calls_a_private_step_it_does_not_define() -> None:
    # ``other._x`` reaches into another object; ``self._x`` must be defined in the same module
    # (not inherited from another endpoint's, as /v1/responses once called chat's ``_json``).
    reached = []
    for name, tree in _trees():
        own = _own(tree)
        for node in ast.walk(tree):
            if not (
                isinstance(node, ast.Attribute)
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
            ):
                continue
            mine = isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")
            if node.attr in THIRD_PARTY.get(name, set()):
                continue
            if not mine or node.attr not in own:
                reached.append(f"{name}:{node.lineno}: {ast.unparse(node)}")
    assert reached == []


def test_no_handler_makes_a_response_it_does_not_send() -> None:
    # A bare ``Response()`` (no body, no status) is a stand-in nobody reads.
    dummies = [
        f"{name}:{node.lineno}: {ast.unparse(node)}"
        for name, tree in _trees()
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and ast.unparse(node.func) == "Response"
        and not node.args
        and not node.keywords
    ]
    assert dummies == []


def test_every_endpoint_is_a_service_that_takes_a_call() -> None:
    # A service takes a call (id, key, the x-frugal headers, the body to read) and returns an
    # answer or a stream of events; it never sees a Starlette request (issue 40).
    taken = {endpoint.name: typing.get_type_hints(endpoint.make.__call__) for endpoint in ENDPOINTS}
    assert {name: hints.get("call") for name, hints in taken.items()} == dict.fromkeys(taken, Call)
    assert {name: hints.get("return") for name, hints in taken.items()} == dict.fromkeys(
        taken, Outcome
    )


def test_the_server_makes_a_call_in_one_place() -> None:
    made = sorted(
        f"{path.parent.name}/{path.name}"
        for path in (Path(proxy.__file__).resolve().parent).rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Call) and ast.unparse(node.func) == "Call"
    )
    assert made == ["server/calls.py"]
