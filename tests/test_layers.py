"""The folders of proxy/ import one way, and quality/ imports nothing from proxy/.

The contracts live in pyproject.toml ([tool.importlinter]) and are drawn in
docs/architecture.md; import-linter reads the real import graph of the installed tree.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ROOMS = ["http", "routing", "engine", "upstream", "ledger", "audit"]


def test_the_import_contracts_hold() -> None:
    lint = Path(sys.executable).with_name("lint-imports")
    done = subprocess.run(
        [str(lint), "--no-cache"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 kept, 0 broken" in done.stdout


def test_every_room_says_what_it_holds_and_what_it_may_import() -> None:
    for room in ROOMS:
        init = ROOT / "proxy" / room / "__init__.py"
        doc = ast.get_docstring(ast.parse(init.read_text()))
        assert doc, f"proxy/{room}/__init__.py has no docstring"
        if room != "engine":
            assert "import" in doc, f"proxy/{room}/__init__.py does not say what it may import"


def test_the_old_flat_modules_are_gone() -> None:
    """A module left at the top of proxy/ beside its room would be a second home for it."""
    top = sorted(p.stem for p in (ROOT / "proxy").glob("*.py"))
    assert top == ["__init__", "__main__", "errors", "logs", "params"]
