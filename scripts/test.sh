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

echo "== generated code"
scripts/check-generated.sh

echo "== go test -race"
if [ $# -eq 0 ]; then set -- ./...; fi
go test -race -count=1 -timeout 20m "$@"
