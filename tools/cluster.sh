#!/usr/bin/env bash
# Start or stop a local test Kubernetes cluster for poking at by hand: the
# same control plane and fake GPU workers as the pytest `kube_cluster`
# fixture, left running in the background.
#
#   tools/cluster.sh up [DIR]     # prints `export KUBECONFIG=...`
#   tools/cluster.sh down [DIR]
#
# DIR defaults to <repo>/.lmedge/cluster.  Needs `make tools` (or
# tools/build-k8s.sh) first.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${PYTHON:-$repo/.venv/bin/python}"
cmd="${1:-}"
dir="${2:-$repo/.lmedge/cluster}"

case "$cmd" in
  up | down) exec "$python" "$repo/tests/fixtures/cluster.py" "$cmd" "$dir" ;;
  *)
    echo "usage: tools/cluster.sh up|down [DIR]" >&2
    exit 2
    ;;
esac
