#!/usr/bin/env bash
# Make what the two device calls carry (bench/gpu/README.md), here, in the repository root:
#
#   .gpu1/  llama.cpp's source (the copy our pinned llama-cpp-python vendors, stripped to what
#           the two builds need, tar.xz), llama-cpp-python's Python files (no compiled lib:
#           call 1 builds it), the cp312 wheels of the Python packages the device lacks, and the
#           first part of the bundled SmolLM2 GGUF
#   .gpu2/  the rest of the GGUF and the whole file's SHA-256
#
# The GGUF is cut where the two folders come out the same size. Both folders are ignored by git
# (.gitignore). Each must stay under 55 MiB: with the working tree (about 8 MiB), a call carries
# at most 64 MiB. Needs ./dev's .venv (for the model file's path) and pip access to the package
# index (the sdist and the wheels).
#
#   bash bench/gpu/prepare.sh          # prints each folder's size at the end
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
ROOT=$PWD
PY=${PYTHON:-$ROOT/.venv/bin/python}
LIMIT_MIB=55
VERSION=$(sed -n 's/^LLAMA_CPP_VERSION=//p' dev)
CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/frugal-proxy/gpu
# The Python packages `frugal`'s in-process app, its engine worker and the bench import that the
# device's image lacks (docs: /work/.library/device/KINDS.md), at the versions of
# requirements/serve.lock. Found by running call2.sh in a venv holding only the image's packages.
WHEELS=(
    starlette==1.10.0 uvicorn==0.55.0 structlog==26.1.0 tenacity==9.2.1 httptools==0.9.0
    jsonschema==4.26.0 jsonschema-specifications==2025.9.1 referencing==0.37.0
    rpds-py==2026.9.1 jsonschema-rs==0.61.2 google-re2==1.1.20251105 diskcache==5.6.3
)

say() { printf '==> %s\n' "$*" >&2; }
[ -x "$PY" ] || { echo "prepare.sh: $PY missing: run ./dev test once first" >&2; exit 1; }
[ -n "$VERSION" ] || { echo "prepare.sh: LLAMA_CPP_VERSION not found in ./dev" >&2; exit 1; }

rm -rf .gpu1 .gpu2
mkdir -p .gpu1/whl .gpu2 "$CACHE"

# 1. llama.cpp's source, from the sdist of the llama-cpp-python version ./dev builds.
SDIST=$CACHE/llama_cpp_python-$VERSION.tar.gz
if [ ! -f "$SDIST" ]; then
    say "downloading the llama-cpp-python $VERSION sdist"
    "$PY" -m pip download -q --no-deps --no-binary :all: -d "$CACHE" "llama-cpp-python==$VERSION"
fi
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
tar -xzf "$SDIST" -C "$WORK"
PKG=$WORK/llama_cpp_python-$VERSION
SRC=$PKG/vendor/llama.cpp
say "stripping llama.cpp to what llama-server and libllama need"
# Not built: tests, examples, docs, models' vocab files, the web UI's sources (the server is
# built without its UI: LLAMA_BUILD_UI=OFF, LLAMA_USE_PREBUILT_UI=OFF), the other GPU backends.
rm -rf "${SRC:?}"/{models,docs,media,benches,tests,examples,pocs,gguf-py,conversion,.github,ci,skills}
rm -rf "$SRC"/tools/ui/{src,tests,package-lock.json} "$SRC"/tools/server/{tests,bench,public*}
for backend in "$SRC"/ggml/src/ggml-*/; do
    case $(basename "$backend") in ggml-cpu | ggml-cuda) ;; *) rm -rf "$backend" ;; esac
done
find "$SRC" \( -name '*.md' -o -name '*.png' -o -name '*.jpg' -o -name '*.gguf' \) -delete
tar -C "$PKG/vendor" -cJf .gpu1/llama.cpp.tar.xz llama.cpp
printf '%s\n' "$VERSION" >.gpu1/llama_cpp_python.version

# 2. llama-cpp-python's Python files (the package loads libllama.so from LLAMA_CPP_LIB_PATH).
mkdir -p .gpu1/py
cp -r "$PKG/llama_cpp" .gpu1/py/
rm -rf .gpu1/py/llama_cpp/server

# 3. The wheels, for CPython 3.12 on manylinux x86-64.
say "downloading ${#WHEELS[@]} wheels for cp312"
platforms=()
for tag in manylinux_2_28 manylinux_2_27 manylinux_2_24 manylinux_2_17 manylinux2014 manylinux1; do
    platforms+=(--platform "${tag}_x86_64")
done
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${platforms[@]}" -d .gpu1/whl "${WHEELS[@]}"

# 4. The CPU libraries our own llama-cpp-python wheel ships (./dev's build on this machine), a
# second candidate for the bundled engine there: call2.sh uses the first of the device's build
# and these that loads the model in a child process (the device's build once crashed in it).
LIBS=$("$PY" -c 'import llama_cpp, pathlib; print(pathlib.Path(llama_cpp.__file__).parent / "lib")')
tar -cJf .gpu2/lib-here.tar.xz -C "$LIBS" --dereference \
    libllama.so libllama.so.0 libggml.so libggml.so.0 libggml-base.so libggml-base.so.0 \
    libggml-cpu.so libggml-cpu.so.0

# 5. The bundled model, cut so that the two folders weigh the same, and its SHA-256.
MODEL=$("$PY" -c 'from proxy.engine.model_files import bundled_model_path; print(bundled_model_path())')
SIZE=$(stat -c %s "$MODEL")
EXTRA=$(($(du -sb --apparent-size .gpu1 | cut -f1) - $(du -sb --apparent-size .gpu2 | cut -f1)))
FIRST=$(((SIZE - EXTRA) / 2))
[ "$FIRST" -gt 0 ] || FIRST=1
head -c "$FIRST" "$MODEL" >.gpu1/model.part1
tail -c +"$((FIRST + 1))" "$MODEL" >.gpu2/model.part2
(cd "$(dirname "$MODEL")" && sha256sum "$(basename "$MODEL")") >.gpu2/model.sha256

# What travels besides: the working tree (tracked files, and untracked ones git does not ignore).
TREE=$( (git ls-files -z; git ls-files -z --others --exclude-standard) | du -cb --apparent-size --files0-from=- 2>/dev/null | tail -1 | cut -f1)
printf 'working tree: %s MiB\n' "$((TREE / 1048576))"
status=0
for dir in .gpu1 .gpu2; do
    mib=$(du -sm --apparent-size "$dir" | cut -f1)
    printf '%s: %s MiB (a call with it carries %s MiB of 64)\n' "$dir" "$mib" "$((mib + TREE / 1048576 + 1))"
    du -sh --apparent-size "$dir"/* | sed 's/^/    /'
    if [ "$mib" -ge "$LIMIT_MIB" ]; then
        echo "prepare.sh: $dir is over $LIMIT_MIB MiB" >&2
        status=1
    fi
done
exit $status
