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
