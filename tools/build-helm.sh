#!/usr/bin/env bash
# Build Helm from the Go module proxy into ${LMEDGE_TOOLS_DIR:-<repo>/.tools}/bin.
# Re-running with helm present at the pinned version is a fast no-op.
set -euo pipefail

HELM_VERSION=v3.22.0

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
tools_dir="${LMEDGE_TOOLS_DIR:-$repo/.tools}"
mkdir -p "$tools_dir/bin"
bin="$(cd "$tools_dir/bin" && pwd)"
export CGO_ENABLED=0

start=$SECONDS
if [[ -x "$bin/helm" ]] &&
  "$bin/helm" version --template '{{.Version}}' 2>/dev/null | grep -Fx -- "$HELM_VERSION" >/dev/null; then
  echo "[build-helm] helm $HELM_VERSION present"
  exit 0
fi

echo "[build-helm] building helm $HELM_VERSION"
# `go install pkg@version` builds with Helm's own go.mod; ask it which
# client-go that is, because Helm's Makefile derives the Kubernetes version
# it assumes for `.Capabilities` and lint from it (otherwise it falls back to
# an old default).
helm_dir="$(go mod download -json "helm.sh/helm/v3@$HELM_VERSION" |
  sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
client_go="$(sed -n 's/^[[:space:]]*k8s.io\/client-go v0\.\([0-9]*\)\..*/\1/p' "$helm_dir/go.mod" | head -n1)"
[[ -n "$client_go" ]] || { echo "build-helm: cannot read client-go version from $helm_dir/go.mod" >&2; exit 1; }

ld="-s -w"
ld+=" -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
ld+=" -X helm.sh/helm/v3/internal/version.metadata="
ld+=" -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
for pkg in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
  ld+=" -X $pkg.k8sVersionMajor=1 -X $pkg.k8sVersionMinor=$client_go"
done

GOBIN="$bin" nice -n 10 go install -trimpath -p "${LMEDGE_GO_PARALLEL:-2}" -ldflags "$ld" \
  "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
got="$("$bin/helm" version --template '{{.Version}}')"
[[ "$got" == "$HELM_VERSION" ]] || { echo "build-helm: helm reports '$got', want $HELM_VERSION" >&2; exit 1; }
echo "[build-helm] helm $HELM_VERSION built in $((SECONDS - start))s ($bin/helm)"
