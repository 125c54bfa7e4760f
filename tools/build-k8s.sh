#!/usr/bin/env bash
# Build the test Kubernetes cluster from the Go module proxy: kube-apiserver,
# kube-controller-manager, kube-scheduler, etcd, kwok and kwokctl, plus the
# KWOK stage definitions the fake nodes/pods need.
#
# Output: ${LMEDGE_TOOLS_DIR:-<repo>/.tools}/bin/* and .../share/kwok/stages.yaml.
# Re-running with every binary present at the pinned version is a fast no-op.
#
# The kube binaries come from k8s.io/kubernetes, which `go install` refuses
# because of its replace directives; tools/k8s/kube is a wrapper module that
# pins it and maps each staging module to its published v0.x twin.  etcd's
# main package lives in its (unpublishable) root module, so tools/k8s/etcd
# carries the three-line main that calls etcdmain.
set -euo pipefail

KUBE_VERSION=v1.36.3
ETCD_VERSION=v3.6.16
KWOK_VERSION=v0.8.0
COREDNS_VERSION=v1.12.4

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
tools_dir="${LMEDGE_TOOLS_DIR:-$repo/.tools}"
bin="$tools_dir/bin"
share="$tools_dir/share/kwok"
mkdir -p "$bin" "$share"
tools_dir="$(cd "$tools_dir" && pwd)"
bin="$tools_dir/bin"

# Builds share two cores with test runs; stay polite and bounded.
gobuild=(nice -n 10 go build -trimpath -p "${LMEDGE_GO_PARALLEL:-2}")
goinstall=(nice -n 10 go install -trimpath -p "${LMEDGE_GO_PARALLEL:-2}")
export CGO_ENABLED=0

start_all=$SECONDS
step() { printf '[build-k8s] %s\n' "$*"; }

# has_version BINARY EXPECTED ARGS... : the binary exists and its version
# output contains EXPECTED.
has_version() {
  local exe="$1" want="$2"
  shift 2
  [[ -x "$exe" ]] || return 1
  "$exe" "$@" 2>/dev/null | grep -F -- "$want" >/dev/null
}

# --- kube-apiserver, kube-controller-manager, kube-scheduler -------------
if has_version "$bin/kube-apiserver" "Kubernetes $KUBE_VERSION" --version &&
  has_version "$bin/kube-controller-manager" "Kubernetes $KUBE_VERSION" --version &&
  has_version "$bin/kube-scheduler" "Kubernetes $KUBE_VERSION" --version; then
  step "kube binaries $KUBE_VERSION present"
else
  t=$SECONDS
  step "building kube-apiserver, kube-controller-manager, kube-scheduler $KUBE_VERSION"
  minor="${KUBE_VERSION#v1.}"
  minor="${minor%%.*}"
  build_date="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  ldflags="-s -w"
  # Without these the servers report v0.0.0-master and clients (and our
  # version check above) cannot tell what they run.
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X $pkg.gitVersion=$KUBE_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.gitCommit=go-module-proxy"
    ldflags+=" -X $pkg.buildDate=$build_date"
  done
  # One invocation so the shared packages compile once for all three.
  (cd "$repo/tools/k8s/kube" && "${gobuild[@]}" -ldflags "$ldflags" -o "$bin/" \
    k8s.io/kubernetes/cmd/kube-apiserver \
    k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kube-scheduler)
  has_version "$bin/kube-apiserver" "Kubernetes $KUBE_VERSION" --version ||
    { echo "build-k8s: kube-apiserver does not report $KUBE_VERSION" >&2; exit 1; }
  step "kube binaries built in $((SECONDS - t))s"
fi

# --- kubelet, kube-proxy (the real-node tier, tools/realnode/) ------------
# Separate from the control-plane build so a machine that only runs the KWOK
# tiers does not pay for them: LMEDGE_BUILD_KUBELET=1 (set by
# tools/realnode/up.sh and `make realnode`) builds them.
if [[ "${LMEDGE_BUILD_KUBELET:-0}" == "1" ]]; then
  if has_version "$bin/kubelet" "Kubernetes $KUBE_VERSION" --version &&
    has_version "$bin/kube-proxy" "Kubernetes $KUBE_VERSION" --version; then
    step "kubelet, kube-proxy $KUBE_VERSION present"
  else
    t=$SECONDS
    step "building kubelet, kube-proxy $KUBE_VERSION"
    minor="${KUBE_VERSION#v1.}"
    minor="${minor%%.*}"
    ldflags="-s -w"
    for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
      ldflags+=" -X $pkg.gitVersion=$KUBE_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
      ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.gitCommit=go-module-proxy"
    done
    (cd "$repo/tools/k8s/kube" && "${gobuild[@]}" -ldflags "$ldflags" -o "$bin/" \
      k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-proxy)
    has_version "$bin/kubelet" "Kubernetes $KUBE_VERSION" --version ||
      { echo "build-k8s: kubelet does not report $KUBE_VERSION" >&2; exit 1; }
    step "kubelet, kube-proxy built in $((SECONDS - t))s"
  fi
  # The tier's cluster DNS (service and worker names), run on the host.
  if has_version "$bin/coredns" "CoreDNS-${COREDNS_VERSION#v}" -version; then
    step "coredns $COREDNS_VERSION present"
  else
    t=$SECONDS
    step "building coredns $COREDNS_VERSION"
    GOBIN="$bin" "${goinstall[@]}" -ldflags "-s -w" "github.com/coredns/coredns@$COREDNS_VERSION"
    has_version "$bin/coredns" "CoreDNS-${COREDNS_VERSION#v}" -version ||
      { echo "build-k8s: coredns does not report $COREDNS_VERSION" >&2; exit 1; }
    step "coredns built in $((SECONDS - t))s"
  fi
fi

# --- etcd ---------------------------------------------------------------
if has_version "$bin/etcd" "etcd Version: ${ETCD_VERSION#v}" --version; then
  step "etcd $ETCD_VERSION present"
else
  t=$SECONDS
  step "building etcd $ETCD_VERSION"
  (cd "$repo/tools/k8s/etcd" && "${gobuild[@]}" -ldflags "-s -w" -o "$bin/etcd" .)
  has_version "$bin/etcd" "etcd Version: ${ETCD_VERSION#v}" --version ||
    { echo "build-k8s: etcd does not report $ETCD_VERSION" >&2; exit 1; }
  step "etcd built in $((SECONDS - t))s"
fi

# --- kwok, kwokctl ------------------------------------------------------
if has_version "$bin/kwok" "${KWOK_VERSION#v}" --version &&
  has_version "$bin/kwokctl" "${KWOK_VERSION#v}" --version; then
  step "kwok $KWOK_VERSION present"
else
  t=$SECONDS
  step "building kwok, kwokctl $KWOK_VERSION"
  kwok_ld="-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=${KWOK_VERSION#v}"
  kwok_ld+=" -X sigs.k8s.io/kwok/pkg/consts.KubeVersion=${KUBE_VERSION#v}"
  GOBIN="$bin" "${goinstall[@]}" -ldflags "$kwok_ld" \
    "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION" "sigs.k8s.io/kwok/cmd/kwokctl@$KWOK_VERSION"
  step "kwok built in $((SECONDS - t))s"
fi

# --- KWOK stages --------------------------------------------------------
# kwok v0.8 refuses to start without Stage objects.  These are the "fast"
# set kwokctl uses by default: nodes become Ready at once and keep a lease,
# pods go Running at once, Job pods complete, deleted pods are released.
stages="$share/stages-$KWOK_VERSION.yaml"
if [[ -s "$stages" ]]; then
  step "kwok stages present"
else
  kwok_dir="$(go mod download -json "sigs.k8s.io/kwok@$KWOK_VERSION" |
    sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
  [[ -d "$kwok_dir/kustomize/stage" ]] ||
    { echo "build-k8s: kwok module source not found (got '$kwok_dir')" >&2; exit 1; }
  tmp="$stages.tmp"
  : >"$tmp"
  for f in node/fast/node-initialize.yaml node/heartbeat-with-lease/node-heartbeat-with-lease.yaml \
    pod/fast/pod-ready.yaml pod/fast/pod-complete.yaml pod/fast/pod-delete.yaml; do
    { echo "---"; cat "$kwok_dir/kustomize/stage/$f"; } >>"$tmp"
  done
  mv "$tmp" "$stages"
  step "kwok stages written to $stages"
fi
ln -sfn "$(basename "$stages")" "$share/stages.yaml"

step "done in $((SECONDS - start_all))s ($bin)"
