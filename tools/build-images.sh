#!/usr/bin/env bash
# Build lmedge's container images offline, with buildah, for the real-node
# test tier (tools/realnode/) — from the same images/*/Dockerfile users build.
#
#   base         Debian bookworm minbase (debootstrap) + python3: stands in for
#                python:3.11-slim-bookworm, which cannot be pulled here
#   lmedge       images/controller/Dockerfile (controller, node agent, gateway, helm test)
#   model-server images/model-server/Dockerfile, stub backend, a tiny GPT-2 with
#                random weights baked in as the "weights" (made here, never downloaded)
#   agent-llm    images/agent-llm/Dockerfile: the chart's agentLLM server, from the
#                llama-cpp-python wheel `make tools` cached (no llama.cpp compile)
#                and the Gemma 3 270M GGUF it assembled, baked in
#   llama-cpp    images/llama-cpp/Dockerfile: llama.cpp's llama-server (the binary
#                tools/build-llama-server.sh built into .tools/bin) with the same
#                GGUF baked in, the image an `engine.kind: llama.cpp` LMService runs
#   ferretdb     the Go-built .tools/bin/ferretdb over SQLite: the chart's store in tests
#   pause        the pod sandbox, compiled from the Kubernetes module's pause.c
#
# Every image is exported as an oci-archive under $LMEDGE_TOOLS_DIR/images/
# (git-ignored) next to a .key file holding the hash of its inputs; a warm run
# with unchanged inputs only compares hashes. RUN steps have no network
# (`--network none`): pip installs come from a wheelhouse made on the host
# (`pip wheel`, from the configured package index) and mounted read-only.
#
# Output: $LMEDGE_TOOLS_DIR/images/{base,lmedge,model-server,agent-llm,llama-cpp,ferretdb,pause}.oci.tar
# and images.env (the image references, for people; the tier reads each
# archive's own name from its index).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
tools_dir="${LMEDGE_TOOLS_DIR:-$repo/.tools}"
out="$tools_dir/images"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
wheels="$out/wheelhouse"
weights="$repo/images/model-server/weights/tiny-gpt2"
python="${LMEDGE_PYTHON:-$repo/.venv/bin/python}"
suite=bookworm
mirror="${LMEDGE_DEBIAN_MIRROR:-$(sed -n 's/^URIs: *//p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -1)}"
mirror="${mirror:-http://deb.debian.org/debian}"
# libgomp1: llama.cpp's OpenMP runtime (the agent-llm image)
base_packages=python3,python3-venv,python3-pip,python-is-python3,libgomp1
version=0.1.0

step() { printf '[build-images] %s\n' "$*"; }
die() { printf 'build-images: %s\n' "$*" >&2; exit 1; }
start_all=$SECONDS

# Where the images cannot be built the real-node tier skips with the reason;
# CI (LMEDGE_REQUIRE_TOOLS=1) fails instead.
cannot() {
  if [[ "${LMEDGE_REQUIRE_TOOLS:-0}" =~ ^(1|true|yes)$ ]]; then die "$*"; fi
  printf 'build-images: %s; not building (the real-node tier will skip)\n' "$*" >&2
  exit 0
}
for tool in buildah debootstrap gcc sha256sum; do
  command -v "$tool" >/dev/null ||
    cannot "$tool not found (Debian: apt-get install buildah debootstrap gcc containerd runc containernetworking-plugins)"
done
[[ $(id -u) == 0 ]] || cannot "needs root (debootstrap and buildah's storage)"
[[ -x "$python" ]] || die "$python not found; run \`make install\` first"

# A private buildah store: nothing here touches the host's default one.
bh=(buildah --root "$out/storage" --runroot "$out/run" --storage-driver overlay)

# The store keeps only the base between builds: every other image lives in
# its archive (which is all the tier reads), so an earlier run's images and
# a killed build's containers do not pile up (each image is ~0.8 GB unpacked).
"${bh[@]}" rm --all >/dev/null 2>&1 || true
while read -r ref; do
  [[ "$ref" == localhost/lmedge/base:* ]] || "${bh[@]}" rmi -f "$ref" >/dev/null 2>&1 || true
done < <("${bh[@]}" images --format '{{.Name}}:{{.Tag}}' 2>/dev/null)

# room NAME MB: stop with a clear message, before building NAME, when the
# disk under $out has less than MB MiB free (a build unpacks its layer, tars it
# and stores it: about three times the image's size at its peak).
room() {
  local avail
  avail=$(($(df -Pk "$out" | awk 'NR == 2 { print $4 }') / 1024))
  ((avail >= $2)) ||
    die "building the $1 image needs about $2 MiB free under $out; the disk has $avail MiB (free some space and rerun \`make images\`)"
}

# hash_of FILES/DIRS...: one sha256 over their paths and contents.
hash_of() {
  find "$@" -type f -not -path '*/__pycache__/*' -not -name '*.pyc' -print0 |
    LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum | cut -c1-16
}

# fresh NAME KEY: true when NAME's archive exists and was built from KEY.
fresh() {
  [[ -s "$out/$1.oci.tar" && "$(cat "$out/$1.key" 2>/dev/null)" == "$2" ]]
}

# ensure_local NAME REF: REF is in the buildah store (re-imported from the
# archive when the store was wiped but the archive kept).
ensure_local() {
  "${bh[@]}" inspect --type image "$2" >/dev/null 2>&1 ||
    "${bh[@]}" pull -q "oci-archive:$out/$1.oci.tar:$2" >/dev/null
}

# export NAME REF KEY: write the archive, then the key (so a killed run is rebuilt).
# The archive is replaced in one rename, so a tier starting meanwhile sees
# the old image or the new one, never a half-written file.
export_image() {
  rm -f "$out/$1.key" "$out/$1.oci.tar.tmp"
  "${bh[@]}" push -q "$2" "oci-archive:$out/$1.oci.tar.tmp:$2"
  mv -f "$out/$1.oci.tar.tmp" "$out/$1.oci.tar"
  echo "$3" >"$out/$1.key"
}

# --- base: debootstrap minbase + python3 ------------------------------------
base_ref="localhost/lmedge/base:$suite"
base_key="$(printf '%s\n' "$suite" "$base_packages" "base-v1" | sha256sum | cut -c1-16)"
if fresh base "$base_key"; then
  step "base $base_key up to date"
else
  t=$SECONDS
  room base 1024
  step "debootstrap $suite (minbase + $base_packages) from $mirror"
  rootfs="$out/rootfs-$suite"
  rm -rf "$rootfs"
  nice debootstrap --variant=minbase --include="$base_packages" "$suite" "$rootfs" "$mirror" \
    >"$out/debootstrap.log" 2>&1 || die "debootstrap failed; see $out/debootstrap.log"
  # As in the official python image: pip may install into the system
  # interpreter (images/model-server/Dockerfile does), no apt lists, no caches.
  rm -f "$rootfs"/usr/lib/python3*/EXTERNALLY-MANAGED
  rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*.bin "$rootfs"/var/log/*
  ctr="$("${bh[@]}" from scratch)"
  tar -C "$rootfs" -cf "$out/rootfs.tar" .
  "${bh[@]}" add "$ctr" "$out/rootfs.tar" / >/dev/null
  # The wheelhouse is mounted at /wheels in every build (never baked in).
  "${bh[@]}" config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --env LANG=C.UTF-8 --env PIP_NO_INDEX=1 --env PIP_FIND_LINKS=/wheels \
    --cmd '["python3"]' "$ctr"
  "${bh[@]}" commit -q --rm "$ctr" "$base_ref" >/dev/null
  rm -rf "$rootfs" "$out/rootfs.tar"
  export_image base "$base_ref" "$base_key"
  step "base built in $((SECONDS - t))s"
fi
ensure_local base "$base_ref"

# --- wheelhouse --------------------------------------------------------------
# lmedge's runtime dependencies and its build backend, as wheels for the
# base's CPython 3.11; keyed by pyproject.toml.
# The agent-llm image's llama-cpp-python: the wheel tools/build-llama.sh built
# and cached (`make tools`), with its server's dependencies.
llama_version="$(sed -n 's/^LLAMA_VERSION=//p' "$repo/tools/build-llama.sh")"
llama_cache="${LMEDGE_WHEEL_CACHE:-$HOME/.cache/lmedge/wheels}"
llama_wheel="$(ls "$llama_cache"/llama_cpp_python-"$llama_version"-*.whl 2>/dev/null | head -n1 || true)"
[[ -n "$llama_wheel" ]] ||
  die "no llama-cpp-python $llama_version wheel in $llama_cache; run \`make tools\` (tools/build-llama.sh)"
agent_model="$tools_dir/models/$(sed -n 's/^MODEL_FILE=//p' "$repo/tools/build-llama.sh")"
[[ -s "$agent_model" ]] || die "no GGUF model at $agent_model; run \`make tools\` (tools/build-llama.sh)"
wheels_key="$( (hash_of "$repo/pyproject.toml"; basename "$llama_wheel") | sha256sum | cut -c1-16)"
if [[ "$(cat "$wheels/.key" 2>/dev/null)" == "$wheels_key" ]]; then
  step "wheelhouse $wheels_key up to date"
else
  t=$SECONDS
  step "wheelhouse for $(sed -n 's/^name = "\(.*\)"/\1/p' "$repo/pyproject.toml" | head -1) (pip wheel)"
  mkdir -p "$wheels"
  mapfile -t backend_reqs < <("$python" -c 'import sys, tomllib
print("\n".join(tomllib.load(open(sys.argv[1], "rb"))["build-system"]["requires"]))' \
    "$repo/pyproject.toml")
  nice "$python" -m pip wheel -q --disable-pip-version-check -w "$wheels" "$repo" \
    "${backend_reqs[@]}" "huggingface_hub>=0.24" || die "pip wheel failed"
  nice "$python" -m pip wheel -q --disable-pip-version-check -w "$wheels" \
    --find-links "$llama_cache" --only-binary llama-cpp-python \
    "llama-cpp-python[server]==$llama_version" || die "pip wheel (llama-cpp-python[server]) failed"
  rm -f "$wheels"/lmedge-*.whl
  echo "$wheels_key" >"$wheels/.key"
  step "wheelhouse made in $((SECONDS - t))s"
fi

# bud NAME REF KEY DOCKERFILE ARGS...: buildah build from the repository root
# (or $BUD_CONTEXT), offline, with the local base as PYTHON_IMAGE and the wheelhouse at /wheels.
bud() {
  local name="$1" ref="$2" key="$3" dockerfile="$4"
  shift 4
  local t=$SECONDS
  room "$name" 3072
  step "$name: buildah bud -f ${dockerfile#"$repo"/} -t $ref"
  nice "${bh[@]}" bud -q --layers=false --network none --pull=never \
    --volume "$wheels:/wheels:ro" --build-arg "PYTHON_IMAGE=$base_ref" \
    -f "$dockerfile" -t "$ref" "$@" "${BUD_CONTEXT:-$repo}" >"$out/$name.log" 2>&1 ||
    die "$name build failed; last lines of $out/$name.log:
$(tail -n 20 "$out/$name.log")"
  export_image "$name" "$ref" "$key"
  "${bh[@]}" rmi -f "$ref" >/dev/null
  step "$name built in $((SECONDS - t))s"
}

src_key="$(hash_of "$repo/lmedge" "$repo/examples" "$repo/pyproject.toml" "$repo/README.md" "$repo/LICENSE")"

# --- lmedge (controller) image ----------------------------------------------
key="$(printf '%s\n' "$base_key" "$wheels_key" "$src_key" \
  "$(hash_of "$repo/images/controller")" | sha256sum | cut -c1-16)"
lmedge_ref="localhost/lmedge/lmedge:$version-${key:0:8}"
if fresh lmedge "$key"; then step "lmedge $key up to date"; else
  bud lmedge "$lmedge_ref" "$key" "$repo/images/controller/Dockerfile"
fi

# --- model-server image: stub backend, tiny random GPT-2 --------------------
if [[ ! -s "$weights/config.json" ]]; then
  step "making a tiny random-weight GPT-2 in ${weights#"$repo"/}"
  "$python" "$repo/tools/realnode/tiny_gpt2.py" "$weights" || die "tiny GPT-2 failed"
fi
key="$(printf '%s\n' "$base_key" "$wheels_key" "$src_key" \
  "$(hash_of "$repo/images/model-server")" | sha256sum | cut -c1-16)"
model_ref="localhost/lmedge/model-server-tiny-gpt2:$version-${key:0:8}"
if fresh model-server "$key"; then step "model-server $key up to date"; else
  bud model-server "$model_ref" "$key" "$repo/images/model-server/Dockerfile" \
    --build-arg MODEL_ID=local:tiny-gpt2 --build-arg LM=lm1 \
    --build-arg MODALITY=text-to-text --build-arg BACKEND=stub --build-arg EXTRAS= \
    --build-arg STUB_SECONDS=1
fi

# --- agent-llm image: the chart's self-hosted agent LLM, model baked in ---------
# The build context is the image's folder plus the GGUF (hard-linked where the
# disk allows), as `docker build --build-arg MODEL_FILE=... images/agent-llm`.
key="$(printf '%s\n' "$base_key" "$wheels_key" "$(hash_of "$repo/images/agent-llm")" \
  "$(stat -c '%s %Y' "$agent_model")" | sha256sum | cut -c1-16)"
agent_llm_ref="localhost/lmedge/agent-llm:$version-${key:0:8}"
if fresh agent-llm "$key"; then step "agent-llm $key up to date"; else
  ctx_dir="$out/agent-llm-context"
  rm -rf "$ctx_dir" && mkdir -p "$ctx_dir"
  cp "$repo/images/agent-llm/serve.py" "$ctx_dir/"
  ln -f "$agent_model" "$ctx_dir/model.gguf" 2>/dev/null || cp "$agent_model" "$ctx_dir/model.gguf"
  BUD_CONTEXT="$ctx_dir" bud agent-llm "$agent_llm_ref" "$key" "$repo/images/agent-llm/Dockerfile" \
    --build-arg MODEL_FILE=model.gguf --build-arg LLAMA_VERSION="$llama_version"
  rm -rf "$ctx_dir"
fi

# --- llama-cpp image: llama-server + the GGUF, for a llama.cpp LMService ---------
# The build context is the image's folder plus the binary and the GGUF (hard-linked
# where the disk allows), as the Dockerfile's `docker build` with them copied in. Without the binary the image is left out (the tier's
# llama.cpp test then skips), except under LMEDGE_REQUIRE_TOOLS=1.
llama_server="$tools_dir/bin/llama-server"
llama_cpp_ref=""
if [[ ! -x "$llama_server" ]]; then
  if [[ "${LMEDGE_REQUIRE_TOOLS:-0}" =~ ^(1|true|yes)$ ]]; then
    die "$llama_server not built; run \`make tools\` (tools/build-llama-server.sh)"
  fi
  step "llama-cpp skipped: $llama_server not built (\`make tools\`)"
else
  key="$(printf '%s\n' "$base_key" "$(hash_of "$repo/images/llama-cpp")" \
    "$(sha256sum <"$llama_server")" "$(stat -c '%s %Y' "$agent_model")" | sha256sum | cut -c1-16)"
  llama_cpp_ref="localhost/lmedge/llama-cpp:$version-${key:0:8}"
  if fresh llama-cpp "$key"; then step "llama-cpp $key up to date"; else
    ctx_dir="$out/llama-cpp-context"
    rm -rf "$ctx_dir" && mkdir -p "$ctx_dir"
    cp "$repo/images/llama-cpp/Dockerfile" "$ctx_dir/"
    cp "$llama_server" "$ctx_dir/llama-server"
    ln -f "$agent_model" "$ctx_dir/model.gguf" 2>/dev/null || cp "$agent_model" "$ctx_dir/model.gguf"
    BUD_CONTEXT="$ctx_dir" bud llama-cpp "$llama_cpp_ref" "$key" "$repo/images/llama-cpp/Dockerfile" \
      --build-arg MODEL_FILE=model.gguf
    rm -rf "$ctx_dir"
  fi
fi

# --- ferretdb image ------------------------------------------------------------
ferret="$tools_dir/bin/ferretdb"
[[ -x "$ferret" ]] || die "$ferret not built; run \`make tools\`"
ferret_version="$("$ferret" --version | sed -n 's/^version: v//p')"
key="$(printf '%s\n' "$base_key" "$(sha256sum <"$ferret")" \
  "$(hash_of "$repo/tools/realnode/ferretdb-entrypoint.sh" "$repo/tools/realnode/mongosh-ping.py")" |
  sha256sum | cut -c1-16)"
ferret_ref="localhost/lmedge/ferretdb:$ferret_version"
if fresh ferretdb "$key"; then step "ferretdb $key up to date"; else
  t=$SECONDS
  ctr="$("${bh[@]}" from --pull=never "$base_ref")"
  "${bh[@]}" copy --chmod 0755 "$ctr" "$ferret" /usr/local/bin/ferretdb
  "${bh[@]}" copy --chmod 0755 "$ctr" "$repo/tools/realnode/ferretdb-entrypoint.sh" /entrypoint.sh
  # The chart's readiness probe runs `mongosh ... ping`.
  "${bh[@]}" copy --chmod 0755 "$ctr" "$repo/tools/realnode/mongosh-ping.py" /usr/local/bin/mongosh
  "${bh[@]}" config --user 999:999 --port 27017 --entrypoint '["/entrypoint.sh"]' --cmd '[]' \
    --label org.opencontainers.image.title=ferretdb "$ctr"
  "${bh[@]}" commit -q --rm "$ctr" "$ferret_ref" >/dev/null
  export_image ferretdb "$ferret_ref" "$key"
  "${bh[@]}" rmi -f "$ferret_ref" >/dev/null
  step "ferretdb built in $((SECONDS - t))s"
fi

# --- pause image -----------------------------------------------------------------
pause_c="$(cd "$repo/tools/k8s/kube" && go list -m -f '{{.Dir}}' k8s.io/kubernetes)/build/pause/linux/pause.c"
[[ -f "$pause_c" ]] || die "pause.c not found at $pause_c (go mod download in tools/k8s/kube)"
key="$(sha256sum <"$pause_c" | cut -c1-16)"
pause_ref="localhost/lmedge/pause:3.10"
if fresh pause "$key"; then step "pause $key up to date"; else
  gcc -Os -static -DVERSION=lmedge-local -o "$out/pause" "$pause_c"
  ctr="$("${bh[@]}" from scratch)"
  "${bh[@]}" copy --chmod 0755 "$ctr" "$out/pause" /pause
  "${bh[@]}" config --user 65535:65535 --entrypoint '["/pause"]' "$ctr"
  "${bh[@]}" commit -q --rm "$ctr" "$pause_ref" >/dev/null
  export_image pause "$pause_ref" "$key"
  "${bh[@]}" rmi -f "$pause_ref" >/dev/null
  step "pause built"
fi

cat >"$out/images.env.tmp" <<EOF
LMEDGE_IMAGE_BASE=$base_ref
LMEDGE_IMAGE_LMEDGE=$lmedge_ref
LMEDGE_IMAGE_MODEL_SERVER=$model_ref
LMEDGE_IMAGE_AGENT_LLM=$agent_llm_ref
LMEDGE_IMAGE_LLAMA_CPP=$llama_cpp_ref
LMEDGE_IMAGE_FERRETDB=$ferret_ref
LMEDGE_IMAGE_PAUSE=$pause_ref
EOF
mv "$out/images.env.tmp" "$out/images.env"
step "done in $((SECONDS - start_all))s ($out)"
