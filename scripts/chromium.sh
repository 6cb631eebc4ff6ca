#!/usr/bin/env bash
# Makes sure headless Chromium is installed, for the console's browser test
# (server/console_browser_test.go), and prints its path on stdout (and
# nothing else there: logs go to stderr).
#
#   export FENCE_TEST_CHROMIUM="$(scripts/chromium.sh)"
#
# It uses $FENCE_TEST_CHROMIUM, /usr/bin/chromium or chromium on the PATH
# when one is there; otherwise it installs Debian's `chromium` and
# `chromium-driver` packages (as root).
set -euo pipefail

log() { echo "chromium.sh: $*" >&2; }
die() { log "$@"; exit 1; }

find_chromium() {
  local c
  for c in "${FENCE_TEST_CHROMIUM:-}" /usr/bin/chromium "$(command -v chromium 2>/dev/null || true)"; do
    if [ -n "$c" ] && [ -x "$c" ]; then echo "$c"; return; fi
  done
}

bin=$(find_chromium)
if [ -z "$bin" ]; then
  [ "$(id -u)" -eq 0 ] || die "Chromium is not installed and installing it needs root: apt-get install chromium chromium-driver"
  log "no chromium; installing Debian's chromium and chromium-driver packages"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update >&2
  apt-get install -y --no-install-recommends chromium chromium-driver >&2
  bin=$(find_chromium)
  [ -n "$bin" ] || die "apt-get installed chromium but no /usr/bin/chromium appeared"
fi
log "using $bin ($("$bin" --version 2>/dev/null || echo 'version unknown'))"
echo "$bin"
