"""One list of routing reasons (:class:`proxy.routing.reasons.Reason`), and the places that
repeat it held to it: the README's table, the ``x-frugal-reason`` enum of ``/openapi.json``,
and the bare ``reason`` strings of the engine's failures (below the routing room, they cannot
import the enum; the router turns them into it). The ``/metrics`` labels are checked on a
real server in ``tests/server/test_metrics.py``."""

from __future__ import annotations

import importlib
import pkgutil
import re
from pathlib import Path

import proxy
from proxy.errors import EngineError
from proxy.routing.reasons import Reason
from proxy.server.routes import openapi_spec

README = Path(__file__).resolve().parents[2] / "README.md"
VALUES = {reason.value for reason in Reason}


def readme_reasons() -> set[str]:
    """The first cells of the README's table that starts with the header ``| reason |``."""
    lines = README.read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if re.match(r"\|\s*reason\s*\|", line))
    found: set[str] = set()
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        cell = line.split("|")[1].strip()
        match = re.fullmatch(r"`([a-z_]+)`", cell)
        assert match, f"README reasons table: {cell!r} is not one `reason`"
        found.add(match.group(1))
    return found


def test_the_readme_table_lists_every_reason_and_no_other() -> None:
    assert readme_reasons() == VALUES


def test_openapi_lists_every_reason_on_the_header() -> None:
    spec = openapi_spec()
    headers = spec["paths"]["/v1/chat/completions"]["post"]["responses"]["200"]["headers"]
    assert headers["x-frugal-reason"]["schema"]["enum"] == [reason.value for reason in Reason]
    assert "cache" in headers["x-frugal-route"]["schema"]["enum"]


def test_every_engine_failure_says_a_reason_the_router_knows() -> None:
    for module in pkgutil.walk_packages(proxy.__path__, "proxy."):  # every subclass defined
        if module.name != "proxy.__main__":
            importlib.import_module(module.name)
    seen, todo = set(), [EngineError]
    while todo:
        cls = todo.pop()
        seen.add(cls)
        todo.extend(cls.__subclasses__())
    assert len(seen) >= 7, sorted(c.__name__ for c in seen)
    for cls in seen:
        assert cls.reason in VALUES, (cls.__name__, cls.reason)


def test_values_are_the_released_strings() -> None:
    """They are in ledgers and dashboards already: a rename is a migration, not an edit."""
    assert Reason.LOCAL_TIMEOUT == "local_timeout" and f"{Reason.CACHE}" == "cache"
    assert len(VALUES) == len(Reason)
