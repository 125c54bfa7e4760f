#!/usr/bin/env bash
# Install the Debian packages `make images` and the real-node tier need:
# buildah and debootstrap (the images), containerd, runc and the CNI plugins
# (the workers), iptables (kube-proxy), gcc (the pause binary).
#
# Idempotent: exits at once when every command is present. Installs only as
# root with apt-get; otherwise names the packages and exits 0 (the tier then
# skips, or fails under LMEDGE_REQUIRE_TOOLS=1 with the same list).
set -euo pipefail
start=$(date +%s)
declare -A pkg=([buildah]=buildah [debootstrap]=debootstrap [containerd]=containerd [runc]=runc
  [iptables]=iptables [gcc]=gcc [/usr/lib/cni/bridge]=containernetworking-plugins)
missing=()
for cmd in "${!pkg[@]}"; do
  if [[ "$cmd" == /* ]]; then [[ -x "$cmd" ]] || missing+=("${pkg[$cmd]}")
  else command -v "$cmd" >/dev/null || missing+=("${pkg[$cmd]}"); fi
done
if [[ ${#missing[@]} -eq 0 ]]; then
  echo "real-node packages present ($(($(date +%s) - start))s)"
  exit 0
fi
if [[ "$(id -u)" != 0 ]] || ! command -v apt-get >/dev/null; then
  echo "real-node tier: missing ${missing[*]}; install them (Debian: apt-get install ${missing[*]})" >&2
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q --no-install-recommends "${missing[@]}"
echo "installed ${missing[*]} in $(($(date +%s) - start))s"
