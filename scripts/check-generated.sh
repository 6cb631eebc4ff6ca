#!/usr/bin/env bash
# Fails if the committed protobuf code differs from what the .proto files
# generate. Installs protoc from Debian's packages when it is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v protoc >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "installing protoc (protobuf-compiler)"
    apt-get update -qq >/dev/null && apt-get install -y -qq protobuf-compiler >/dev/null
  else
    echo "protoc is missing and cannot be installed here; skipping the generated-code check" >&2
    exit 0
  fi
fi
scripts/gen-proto.sh
if ! git diff --quiet -- api internal; then
  echo "generated code is stale; run: go generate ./api/..." >&2
  git diff --stat -- api internal >&2
  exit 1
fi
