#!/usr/bin/env bash
# Stop the running real-node tier (see up.sh): every process, the namespaces,
# links, cgroups; sysctls the kubelet changed are restored. Safe to run twice.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$repo"
exec "${LMEDGE_PYTHON:-$repo/.venv/bin/python}" -m tests.realnode.tier down
