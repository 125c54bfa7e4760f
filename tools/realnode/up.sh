#!/usr/bin/env bash
# Start the real-node test tier in DIR and leave it running (for poking at by
# hand; the test suite starts its own): the local control plane, CoreDNS and two
# real workers (kubelet + containerd each, in their own network and mount
# namespaces). Needs root, `make images` and `make realnode-tools`.
#   tools/realnode/up.sh DIR   then   export KUBECONFIG=DIR/control-plane/kubeconfig
#   tools/realnode/down.sh     stops it and restores everything it changed
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
[[ $# -eq 1 ]] || { echo "usage: tools/realnode/up.sh DIR" >&2; exit 2; }
cd "$repo"
exec "${LMEDGE_PYTHON:-$repo/.venv/bin/python}" -m tests.realnode.tier up "$(realpath -m "$1")"
