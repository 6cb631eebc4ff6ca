#!/usr/bin/env bash
# Writes a small data dir with the fence of git revision REV (default HEAD)
# and packs it as server/testdata/datadir-<rev>-<log store>.tar.gz, for
# TestUpgradeOpensOldDataDir: a data dir written by an older fence must
# open in this one. The state (tokens, ids, keys) is the same at every run:
#
#   session 1 (TTL 1h, owner "fixture") holds "orders" with token 1 and
#   "after-snapshot" with token 3; "jobs" was taken (token 2) and released;
#   orders/17 = "paid", fenced by orders' token 1; config = "v2" (it was
#   "v1" in the snapshot); counter = 20; then a snapshot, then more log.
#
# Usage: scripts/upgrade-fixture.sh [REV] [wal|bolt]
set -euo pipefail
cd "$(dirname "$0")/.."
rev=${1:-HEAD}
store=${2:-wal}
short=$(git rev-parse --short "$rev")
out=server/testdata/datadir-$short-$store.tar.gz
tmp=$(mktemp -d)
pid=
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; rm -rf "$tmp"' EXIT
mkdir "$tmp/src"
git archive "$rev" | tar -x -C "$tmp/src"
(cd "$tmp/src" && go build -o "$tmp/fence" ./cmd/fence)

port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
api=127.0.0.1:$(port)
"$tmp/fence" serve --data-dir "$tmp/data" --listen "$api" --raft-listen 127.0.0.1:$(port) \
  --log-store "$store" --snapshot-threshold 16 --snapshot-interval 100ms 2>"$tmp/serve.log" &
pid=$!
call() { curl -sf -H 'Content-Type: application/json' "http://$api/fence.v1.$1" -d "$2"; echo; }
for _ in $(seq 50); do curl -sf "http://$api/healthz" >/dev/null 2>&1 && break; sleep 0.1; done

call SessionService/CreateSession '{"ttl":"3600s","owner":"fixture"}'
call LockService/Acquire '{"sessionId":"1","lock":"orders"}'
call LockService/Acquire '{"sessionId":"1","lock":"jobs"}'
call LockService/Release '{"sessionId":"1","lock":"jobs","token":"2"}'
call KVService/Put '{"key":"orders/17","value":"cGFpZA==","fence":{"lock":"orders","token":"1"}}'
call KVService/Put '{"key":"config","value":"djE="}'
for i in $(seq 20); do
  call KVService/Put "{\"key\":\"counter\",\"value\":\"$(printf %s "$i" | base64)\"}" >/dev/null
done
for _ in $(seq 100); do ls "$tmp/data/snapshots/"*/state.bin >/dev/null 2>&1 && break; sleep 0.1; done
ls "$tmp/data/snapshots/"*/state.bin >/dev/null
call LockService/Acquire '{"sessionId":"1","lock":"after-snapshot"}'
call KVService/Put '{"key":"config","value":"djI="}'
kill -TERM "$pid"
wait "$pid"
pid=
tar -C "$tmp/data" --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -czf "$out" .
echo "wrote $out ($(stat -c %s "$out") bytes)"
