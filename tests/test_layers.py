"""The folders of proxy/ import one way, quality/ imports nothing from proxy/, and each room's
docstring says what the room holds and imports, truly.

The contracts live in pyproject.toml ([tool.importlinter], with no exception carved out by
``ignore_imports``) and are drawn in docs/architecture.md; import-linter reads the real import
graph of the installed tree. The docstrings are held to the code here: each room (a package of
proxy/, or a folder inside one, and quality/dev) names every module and folder it holds, and
each room of proxy/ names every other room or shared module its code imports, and never one
it says it does not. And the docstrings and comments of proxy/ and quality/ speak of this
repository: none cites by number (:data:`PRIVATE_SOURCES`) the articles the project was first
drawn from, which a reader of the repository does not have; the ideas are named instead
(finish-time routing, profiling-informed scheduling, the production account the project
started from). And the rooms stay small enough to read: no module of proxy/ or quality/ is over
:data:`MOST_LINES` lines, and no folder holds more than :data:`MOST_MODULES` modules directly
(a folder that fills up gets a sub-room with its own docstring).
"""

from __future__ import annotations

import ast
import io
import re
import subprocess
import sys
import tokenize
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ROOMS = sorted(p.parent.name for p in (ROOT / "proxy").glob("*/__init__.py"))
FOLDERS = sorted(
    str(p.parent.relative_to(ROOT))
    for p in [*(ROOT / "proxy").glob("**/__init__.py"), ROOT / "quality" / "dev" / "__init__.py"]
    if p.parent != ROOT / "proxy"
)
SHARED = ["proxy.config", "proxy.errors", "proxy.logs", "quality"]
MOST_LINES = 500
MOST_MODULES = 30
PRIVATE_SOURCES = re.compile(r"\bseeds?[ _-]?00[024]\b", re.IGNORECASE)


def _doc(folder: Path) -> str:
    return ast.get_docstring(ast.parse((folder / "__init__.py").read_text())) or ""


def _imported(room: str) -> set[str]:
    """The other rooms and shared modules that the code of proxy/<room>/ imports."""
    targets = [f"proxy.{r}" for r in ROOMS if r != room] + SHARED
    found: set[str] = set()
    for path in (ROOT / "proxy" / room).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            found |= {t for t in targets for n in names if n == t or n.startswith(t + ".")}
    return found


def _named(name: str, text: str) -> bool:
    return re.search(rf"(?<![\w.]){re.escape(name)}(?![\w])", text) is not None


def test_the_import_contracts_hold() -> None:
    lint = Path(sys.executable).with_name("lint-imports")
    done = subprocess.run(
        [str(lint), "--no-cache"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "3 kept, 0 broken" in done.stdout


def test_no_contract_carves_out_an_exception() -> None:
    linter = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    assert [c["name"] for c in linter["contracts"] if c.get("ignore_imports")] == []


def test_every_room_says_what_it_holds_and_what_it_may_import() -> None:
    for room in ROOMS:
        init = ROOT / "proxy" / room / "__init__.py"
        doc = ast.get_docstring(ast.parse(init.read_text()))
        assert doc, f"proxy/{room}/__init__.py has no docstring"
        if room != "engine":
            assert "import" in doc, f"proxy/{room}/__init__.py does not say what it may import"


@pytest.mark.parametrize("folder", FOLDERS)
def test_every_room_names_each_module_and_folder_it_holds(folder: str) -> None:
    path = ROOT / folder
    held = [p.stem for p in path.glob("*.py") if p.stem != "__init__"]
    held += [p.name for p in path.iterdir() if (p / "__init__.py").is_file()]
    doc = _doc(path)
    assert [m for m in sorted(held) if not _named(m, doc)] == [], f"{folder}/__init__.py"


@pytest.mark.parametrize("room", ROOMS)
def test_every_room_names_what_it_imports_and_imports_nothing_it_says_it_never_does(
    room: str,
) -> None:
    doc = " ".join(_doc(ROOT / "proxy" / room).split())
    imported = _imported(room)
    assert [t for t in sorted(imported) if not _named(t, doc)] == [], f"proxy/{room}/__init__.py"
    # in the paragraphs on imports, "never ``proxy.server`` ..." to the end of its sentence: none
    # of those is imported
    on_imports = " ".join(
        " ".join(p.split()) for p in _doc(ROOT / "proxy" / room).split("\n\n") if "import" in p
    )
    refused = " ".join(re.findall(r"\b[Nn]ever\b(.*?)(?:\.\s|\.$)", on_imports))
    assert [t for t in sorted(imported) if _named(t, refused)] == [], f"proxy/{room}/__init__.py"


def test_the_old_flat_modules_are_gone() -> None:
    """A module left at the top of proxy/ beside its room would be a second home for it."""
    top = sorted(p.stem for p in (ROOT / "proxy").glob("*.py"))
    assert top == ["__init__", "__main__", "errors", "logs"]


def _prose(source: str) -> list[str]:
    """The docstrings (of the module, its classes and functions) and the comments of ``source``."""
    kinds = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    nodes = [n for n in ast.walk(ast.parse(source)) if isinstance(n, kinds)]
    docs = [d for n in nodes if (d := ast.get_docstring(n, clean=False))]
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    return docs + [tok.string for tok in tokens if tok.type == tokenize.COMMENT]


def test_no_docstring_or_comment_cites_a_private_article() -> None:
    cited = [
        f"{path.relative_to(ROOT)}: {match.group(0)}"
        for room in ("proxy", "quality")
        for path in sorted((ROOT / room).rglob("*.py"))
        for text in _prose(path.read_text())
        for match in PRIVATE_SOURCES.finditer(text)
    ]
    assert cited == []


def test_no_module_is_over_500_lines() -> None:
    long = {
        str(path.relative_to(ROOT)): lines
        for room in ("proxy", "quality")
        for path in sorted((ROOT / room).rglob("*.py"))
        if (lines := len(path.read_text().splitlines())) > MOST_LINES
    }
    assert long == {}, f"split these along their seams: {long}"


def test_no_folder_holds_more_than_30_modules() -> None:
    modules = {
        str(folder.relative_to(ROOT)): len(
            [p for p in folder.glob("*.py") if p.name != "__init__.py"]
        )
        for room in ("proxy", "quality")
        for folder in [ROOT / room, *(p for p in (ROOT / room).rglob("*") if p.is_dir())]
        if "__pycache__" not in folder.parts
    }
    print(f"the fullest folders: {sorted(modules.items(), key=lambda kv: -kv[1])[:3]}")
    assert {f: n for f, n in modules.items() if n > MOST_MODULES} == {}, "make a sub-room"
