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
# The TypeScript client's code is generated with the protoc-gen-es its
# lockfile pins, so its dependencies come first (unless installed already
# from this lockfile).
ts=clients/typescript
if command -v npm >/dev/null; then
  if [ ! -e "$ts/node_modules/.package-lock.json" ] || [ "$ts/package-lock.json" -nt "$ts/node_modules/.package-lock.json" ]; then
    (cd "$ts" && npm ci --no-audit --no-fund --loglevel=error)
  fi
else
  echo "npm is missing; the TypeScript client's generated code is not checked" >&2
fi
scripts/gen-proto.sh
generated=(api internal "$ts/src/gen")
if ! git diff --quiet -- "${generated[@]}" || [ -n "$(git status --porcelain -- "${generated[@]}")" ]; then
  echo "generated code is stale; run: go generate ./api/..." >&2
  git status --short -- "${generated[@]}" >&2
  exit 1
fi
