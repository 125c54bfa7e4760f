#!/usr/bin/env bash
# Build the FerretDB test server (MongoDB wire protocol over SQLite) used by the
# store contract tests, from the Go module proxy, into $LMEDGE_TOOLS_DIR/bin.
#
# Why not `go install ...@v1.24.2` (or a wrapper module with `go get -tool`): both
# compile, but the binary panics at start ("Invalid build/version/version.txt"),
# because FerretDB generates build/version/version.txt in its repository and never
# publishes it in the module, and the check runs whenever the main package comes
# from the FerretDB module. So: download the module source from the proxy, write
# the one missing file, and build inside FerretDB's own module with its own
# go.mod/go.sum (the exact dependency versions it was released with).
#
# Idempotent: exits at once when the binary already reports the wanted version.
set -euo pipefail

FERRETDB_VERSION="${FERRETDB_VERSION:-v1.24.2}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
tools_dir="${LMEDGE_TOOLS_DIR:-$root/.tools}"
bin_dir="$tools_dir/bin"
bin="$bin_dir/ferretdb"
stamp="$bin_dir/.ferretdb-version"
start=$(date +%s)

if [[ -x "$bin" && -f "$stamp" && "$(cat "$stamp")" == "$FERRETDB_VERSION" ]]; then
  echo "ferretdb $FERRETDB_VERSION already built at $bin ($(( $(date +%s) - start ))s)"
  exit 0
fi

command -v go >/dev/null || { echo "error: go is not installed; FerretDB is built from source" >&2; exit 1; }
mkdir -p "$bin_dir"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cd "$work"
# Other builds share the machine's few cores; stay out of their way.
export GOFLAGS="${GOFLAGS:-} -buildvcs=false"
mod_dir="$(go mod download -json "github.com/FerretDB/FerretDB@$FERRETDB_VERSION" \
  | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
[[ -d "$mod_dir" ]] || { echo "error: could not download FerretDB $FERRETDB_VERSION" >&2; exit 1; }
cp -r "$mod_dir" "$work/src"
chmod -R u+w "$work/src"
echo "$FERRETDB_VERSION" > "$work/src/build/version/version.txt"
cd "$work/src"
nice -n 10 go build -trimpath -o "$work/ferretdb" ./cmd/ferretdb
"$work/ferretdb" --version >/dev/null
mv "$work/ferretdb" "$bin"
echo "$FERRETDB_VERSION" > "$stamp"
echo "built ferretdb $FERRETDB_VERSION at $bin ($(( $(date +%s) - start ))s)"
