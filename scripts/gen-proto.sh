#!/usr/bin/env bash
# Regenerates the Go code next to every .proto under api/. Needs protoc
# (Debian: protobuf-compiler); the Go plugins come from go.mod's tool lines,
# so their versions are pinned with the module.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=$(mktemp -d)
trap 'rm -rf "$bin"' EXIT
go build -o "$bin/protoc-gen-go" google.golang.org/protobuf/cmd/protoc-gen-go
go build -o "$bin/protoc-gen-connect-go" connectrpc.com/connect/cmd/protoc-gen-connect-go
for root in api internal; do
  (cd "$root" && find . -name '*.proto' -print0 | xargs -0 protoc -I . \
    --plugin=protoc-gen-go="$bin/protoc-gen-go" --go_out=. --go_opt=paths=source_relative \
    --plugin=protoc-gen-connect-go="$bin/protoc-gen-connect-go" --connect-go_out=. --connect-go_opt=paths=source_relative)
done
# The TypeScript client's code (clients/typescript/src/gen), with the
# protoc-gen-es its package-lock.json pins; skipped until `npm ci` has run
# there (scripts/check-generated.sh runs it when npm is at hand).
es=clients/typescript/node_modules/.bin/protoc-gen-es
if [ -x "$es" ]; then
  rm -rf clients/typescript/src/gen
  mkdir -p clients/typescript/src/gen
  (cd api && protoc -I . --plugin=protoc-gen-es="../$es" --es_out=../clients/typescript/src/gen \
    --es_opt=target=ts,import_extension=js fence/v1/fence.proto)
fi
