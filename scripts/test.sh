#!/usr/bin/env bash
# The whole test suite, as CI runs it: formatting, vet, generated code up to
# date, and every test with the race detector. Extra arguments go to go test
# (for example: scripts/test.sh -run TestKill ./server/).
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== gofmt"
unformatted=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))
if [ -n "$unformatted" ]; then
  echo "gofmt would change:"; echo "$unformatted"; exit 1
fi

echo "== go vet"
go vet ./...
echo "== go build for 32-bit (int is 32 bits there)"
GOARCH=386 go build ./...

echo "== cross-build: the CLI, client, fencing, nolock and fencetest on six platforms"
# The server may stay Unix-only; what clients and resources import must
# build (and its tests type-check) wherever they run.
for os in linux darwin windows; do
  for arch in amd64 arm64; do
    GOOS=$os GOARCH=$arch go build -o /dev/null ./cmd/fence
    GOOS=$os GOARCH=$arch go vet ./client/ ./fencing/... ./nolock/ ./fencetest/
  done
done

echo "== node"
# The TypeScript client (clients/typescript) is built and tested from go
# test with Node and npm; without them, install Debian's. Under CI a Node
# that cannot be had fails the run (TestTypeScriptClient fails without it);
# elsewhere that test is skipped.
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "installing Debian's nodejs and npm"
    apt-get update -qq >/dev/null && apt-get install -y -qq --no-install-recommends nodejs npm >/dev/null
  else
    echo "node or npm is missing and cannot be installed here; the TypeScript client's tests will be skipped outside CI"
  fi
fi
if command -v npm >/dev/null; then
  echo "node $(node --version), npm $(npm --version)"
  (cd clients/typescript && npm ci --no-audit --no-fund --loglevel=error)
fi

echo "== generated code"
scripts/check-generated.sh

echo "== systemd-analyze (deploy/fence.service is verified with it)"
if ! command -v systemd-analyze >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "installing Debian's systemd for systemd-analyze"
    apt-get update -qq >/dev/null && apt-get install -y -qq --no-install-recommends systemd >/dev/null
  else
    echo "systemd-analyze is missing and cannot be installed here; deploy's unit check is skipped outside CI"
  fi
fi

echo "== python"
# The Python client's suite (clients/python_test.go) runs under python3;
# under CI a missing one fails that test, so install Debian's when missing.
if ! command -v python3 >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "installing Debian's python3 for the Python client's suite"
    apt-get update -qq >/dev/null && apt-get install -y -qq --no-install-recommends python3 >/dev/null
  else
    echo "python3 is missing and cannot be installed here; the Python client's suite is skipped outside CI"
  fi
fi

echo "== postgres"
# The PostgreSQL tests use the server at FENCE_TEST_POSTGRES; without one,
# start a throwaway server (scripts/postgres.sh). Under CI a server that
# cannot be had fails the run; elsewhere those tests are skipped.
if [ -z "${FENCE_TEST_POSTGRES:-}" ]; then
  if FENCE_TEST_POSTGRES=$(scripts/postgres.sh); then
    export FENCE_TEST_POSTGRES
  elif [ -n "${CI:-}" ]; then
    echo "scripts/postgres.sh failed, and CI needs PostgreSQL"; exit 1
  else
    echo "scripts/postgres.sh failed: the PostgreSQL tests will be skipped"
    unset FENCE_TEST_POSTGRES
  fi
fi
echo "FENCE_TEST_POSTGRES=${FENCE_TEST_POSTGRES:-} (PostgreSQL for the tests)"

echo "== chromium"
# The console's browser test drives headless Chromium; without one,
# scripts/chromium.sh installs Debian's chromium package (once: it is kept
# when present). Under CI a browser that cannot be had fails the run;
# elsewhere that test is skipped.
if FENCE_TEST_CHROMIUM=$(scripts/chromium.sh); then
  export FENCE_TEST_CHROMIUM
elif [ -n "${CI:-}" ]; then
  echo "scripts/chromium.sh failed, and CI needs Chromium"; exit 1
else
  echo "scripts/chromium.sh failed: the console's browser test will be skipped"
  unset FENCE_TEST_CHROMIUM
fi
echo "FENCE_TEST_CHROMIUM=${FENCE_TEST_CHROMIUM:-} (Chromium for the console test)"

echo "== go test -race"
if [ $# -eq 0 ]; then set -- ./...; fi
go test -race -count=1 -timeout 20m "$@"
