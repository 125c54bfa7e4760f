#!/usr/bin/env bash
# Build llama.cpp's own `llama-server` (continuous batching over parallel
# sequences) into ${LMEDGE_TOOLS_DIR:-<repo>/.tools}/bin/llama-server, for
# `lmedge calibrate --engine llama.cpp` and its tests. llama-cpp-python's server
# runs one request at a time, so it cannot measure decode at 2 or 4 sequences.
#
# The C++ source is the llama.cpp vendored in the same llama-cpp-python sdist
# that tools/build-llama.sh builds (one llama.cpp version in the project). Only
# the llama-server target is built (CPU, portable flags, no curl); the binary is
# cached in ${LMEDGE_BIN_CACHE:-~/.cache/lmedge/bin}/llama-server-<version> so a
# fresh clone on the same machine reuses it. Re-running with it in place is a
# fast no-op.
set -euo pipefail

LLAMA_VERSION=0.3.36
# Same portable CPU flags as build-llama.sh; static libraries so the one binary
# is all that needs caching.
LLAMA_CMAKE_ARGS="${LLAMA_CMAKE_ARGS:--DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON}"

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
tools_dir="${LMEDGE_TOOLS_DIR:-$repo/.tools}"
venv="${LMEDGE_VENV:-$repo/.venv}"
py="$venv/bin/python"
bin_cache="${LMEDGE_BIN_CACHE:-$HOME/.cache/lmedge/bin}"
sdists="${LMEDGE_SDIST_CACHE:-$HOME/.cache/lmedge/sdists}"
cached="$bin_cache/llama-server-$LLAMA_VERSION"
target="$tools_dir/bin/llama-server"
mkdir -p "$bin_cache" "$sdists" "$tools_dir/bin"

start=$SECONDS
if [[ ! -x "$cached" ]]; then
  [[ -x "$py" ]] || { echo "build-llama-server: no virtualenv at $venv (run make install first)" >&2; exit 1; }
  # cmake from the system, else its PyPI wheel in the venv (a fresh machine has none).
  if ! command -v cmake >/dev/null; then
    [[ -x "$venv/bin/cmake" ]] || "$py" -m pip install -q "cmake>=3.25,<4"
    export PATH="$venv/bin:$PATH"
  fi
  sdist="$(ls "$sdists"/llama_cpp_python-"$LLAMA_VERSION".tar.gz 2>/dev/null | head -n1 || true)"
  if [[ -z "$sdist" ]]; then
    "$py" -m pip download -q --no-binary :all: --no-deps -d "$sdists" "llama-cpp-python==$LLAMA_VERSION"
    sdist="$(ls "$sdists"/llama_cpp_python-"$LLAMA_VERSION".tar.gz | head -n1)"
  fi
  work="$(mktemp -d)"
  trap 'rm -rf "$work"' EXIT
  tar -xzf "$sdist" -C "$work"
  src="$work/llama_cpp_python-$LLAMA_VERSION/vendor/llama.cpp"
  echo "[build-llama-server] building llama-server $LLAMA_VERSION (llama.cpp from source; slow)"
  t0=$SECONDS
  # shellcheck disable=SC2086  # the flags are a word list
  cmake -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
    -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TOOLS=ON $LLAMA_CMAKE_ARGS >"$work/cmake.log" \
    || { cat "$work/cmake.log" >&2; exit 1; }
  nice -n 10 cmake --build "$work/build" --target llama-server -j "${LMEDGE_BUILD_PARALLEL:-2}" \
    >"$work/build.log" 2>&1 || { tail -n 40 "$work/build.log" >&2; exit 1; }
  # Copy beside the target and rename: an interrupted run never leaves a truncated binary.
  install -m 0755 "$work/build/bin/llama-server" "$cached.part"
  mv "$cached.part" "$cached"
  echo "[build-llama-server] built in $((SECONDS - t0))s ($cached)"
fi
if [[ ! -x "$target" ]] || ! cmp -s "$cached" "$target"; then
  install -m 0755 "$cached" "$target.part"
  mv "$target.part" "$target"
fi
"$target" --version >/dev/null 2>&1 || { echo "build-llama-server: $target does not run" >&2; exit 1; }
echo "[build-llama-server] ready in $((SECONDS - start))s ($target)"
