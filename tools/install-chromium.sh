#!/usr/bin/env bash
# Install the browser the dashboard's browser tests drive (tests/browser/):
# Debian's `chromium` package, run headless by Playwright's Python package.
#
# Why the system package and not `playwright install`: the tests must run
# offline and from the distribution's own, signed builds; Playwright's browser
# download fetches a build from its own CDN at run time. The tests point
# Playwright at this binary (`executable_path`), and `make install` sets
# PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD so nothing else is fetched.
#
# Idempotent: exits at once when a chromium is already on the PATH (or at
# $LMEDGE_CHROMIUM). Needs root (or sudo) and apt-get only when it must install.
set -euo pipefail

start=$(date +%s)
for candidate in "${LMEDGE_CHROMIUM:-}" chromium chromium-browser; do
  [[ -n "$candidate" ]] || continue
  if path="$(command -v "$candidate" 2>/dev/null)"; then
    echo "chromium already installed at $path ($(( $(date +%s) - start ))s)"
    exit 0
  fi
done

command -v apt-get >/dev/null || {
  echo "error: chromium is missing and apt-get is not available; install chromium with your" \
    "package manager, or set LMEDGE_CHROMIUM to a chromium binary" >&2
  exit 1
}
as_root=()
if [[ "$(id -u)" != 0 ]]; then
  command -v sudo >/dev/null || {
    echo "error: installing chromium needs root: run 'sudo apt-get install -y chromium'" >&2
    exit 1
  }
  as_root=(sudo)
fi
export DEBIAN_FRONTEND=noninteractive
# Only refresh the package lists when apt does not know the package yet.
if ! apt-cache show chromium >/dev/null 2>&1; then
  "${as_root[@]}" apt-get update -q
fi
"${as_root[@]}" apt-get install -y -q --no-install-recommends chromium fonts-dejavu-core
echo "chromium installed at $(command -v chromium) ($(( $(date +%s) - start ))s)"
