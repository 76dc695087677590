"""The ``frugal`` command's own behaviour: every user error is one class, printed once as one
line with its exit code, and a reader that has gone ends the command quietly."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from proxy.audit.refit import CalibrationError
from proxy.cli import main
from proxy.engine.model_files import ModelLoadError
from proxy.engine.quantize import QuantizeError
from proxy.errors import ConfigError, UserError
from proxy.ledger.reports.build import ReportError
from proxy.ledger.tenants.keys import KeyCommandError
from proxy.models import ModelsError

FRUGAL = str(Path(sys.executable).with_name("frugal"))


@pytest.mark.parametrize(
    ("error", "label", "exit_code"),
    [
        (ConfigError("bad"), "frugal: config error", 2),
        (ModelLoadError("bad"), "frugal: model error", 2),
        (KeyCommandError("bad"), "frugal keys", 1),
        (ModelsError("bad"), "frugal models", 1),
        (CalibrationError("bad"), "frugal calibrate", 1),
        (QuantizeError("bad"), "frugal quantize", 1),
        (ReportError("bad", 3), "frugal report", 3),
    ],
)
def test_each_command_error_is_a_user_error_with_its_label_and_exit_code(
    error: UserError, label: str, exit_code: int
) -> None:
    assert isinstance(error, UserError)
    assert (error.label, error.exit_code, str(error)) == (label, exit_code, "bad")


def test_a_user_error_prints_one_line_with_its_label_and_exits_with_its_code(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = str(tmp_path / "ledger.db")
    assert main(["keys", "revoke", "nobody", "--db", db]) == 1
    assert main(["models", "rm", "not a name", "--config", str(tmp_path / "none.toml")]) == 2
    assert main(["report", "--db", db, "--month", "2026-13"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "frugal keys: no usable key named 'nobody'; see `frugal keys list`"
    assert err[1].startswith("frugal: config error: ")  # the config is read before the name
    assert err[2].startswith("frugal report: ")
    assert len(err) == 3


def _into_a_closed_pipe(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run the real ``frugal`` with stdout on a pipe whose reader has gone, and with Python's
    ordinary buffering (no PYTHONUNBUFFERED), as in a user's ``frugal ... | head -1``."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run(
            [FRUGAL, *args], stdout=write_end, stderr=subprocess.PIPE, text=True, check=False,
            cwd=cwd, env=env,
        )  # fmt: skip
    finally:
        os.close(write_end)


@pytest.mark.parametrize(
    "args",
    [
        ("keys", "list", "--format", "json"),
        ("report", "--month", "2026-10", "--format", "json"),
    ],
)
def test_a_buffered_short_output_into_a_closed_pipe_ends_quietly(
    args: tuple[str, ...], tmp_path: Path
) -> None:
    db = str(tmp_path / "ledger.db")
    assert main(["migrate", "--db", db]) == 0  # an empty ledger: the zero report, on stdout
    done = _into_a_closed_pipe(*args, "--db", db, cwd=tmp_path)
    assert "Traceback" not in done.stderr, done.stderr
    assert "BrokenPipeError" not in done.stderr, done.stderr
    assert "Exception ignored" not in done.stderr, done.stderr
    assert done.returncode == 141
