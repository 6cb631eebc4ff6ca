#!/usr/bin/env bash
# Starts a throwaway PostgreSQL for the tests and prints its DSN on stdout
# (and nothing else there: logs go to stderr and to $FENCE_PG_DIR/postgres.log).
#
#   export FENCE_TEST_POSTGRES="$(scripts/postgres.sh)"
#
# FENCE_PG_PORT (default 54329) and FENCE_PG_DIR (default /tmp/fence-pg-$PORT)
# choose the port and the directory holding the cluster (data/), the unix
# socket and the log. If a server already answers on the port, it is reused.
# The server listens on 127.0.0.1 only, trusts every local connection, and
# has a superuser `fence` and a database `fence`. Durability is switched off
# (fsync=off): it is for tests only.
#
# Without PostgreSQL on the machine, it installs Debian's `postgresql`
# package (as root). Stop the server with:
#   pg_ctl -D "$FENCE_PG_DIR/data" stop    (as the owner of the directory)
set -euo pipefail

port="${FENCE_PG_PORT:-54329}"
dir="${FENCE_PG_DIR:-/tmp/fence-pg-$port}"
dsn="postgres://fence@127.0.0.1:$port/fence?sslmode=disable"

log() { echo "postgres.sh: $*" >&2; }
die() { log "$@"; exit 1; }

newest_bin() {
  local d
  d=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)
  if [ -n "$d" ] && [ -x "$d/pg_ctl" ]; then echo "$d"; fi
}

bin=$(newest_bin)
if [ -z "$bin" ]; then
  [ "$(id -u)" -eq 0 ] || die "PostgreSQL is not installed and installing it needs root: apt-get install postgresql"
  log "no PostgreSQL under /usr/lib/postgresql; installing Debian's postgresql package"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update >&2
  apt-get install -y --no-install-recommends postgresql >&2
  bin=$(newest_bin)
  [ -n "$bin" ] || die "apt-get installed postgresql but no /usr/lib/postgresql/*/bin/pg_ctl appeared"
fi
log "using $bin"

# The server refuses to run as root: run its tools as the postgres OS user.
as_owner() {
  if [ "$(id -u)" -eq 0 ]; then
    (cd / && runuser -u postgres -- "$@")
  else
    "$@"
  fi
}

psql_fence() {
  "$bin/psql" -X -q -h 127.0.0.1 -p "$port" -U fence "$@"
}

ensure_database() {
  local exists
  exists=$(psql_fence -d postgres -tAc "SELECT 1 FROM pg_database WHERE datname = 'fence'") ||
    die "the server on 127.0.0.1:$port does not let user fence in (is it another cluster?)"
  if [ "$exists" != "1" ]; then
    log "creating database fence"
    "$bin/createdb" -h 127.0.0.1 -p "$port" -U fence fence >&2
  fi
  psql_fence -d fence -tAc "SELECT 1" >/dev/null || die "cannot connect to $dsn"
}

ready() { "$bin/pg_isready" -q -h 127.0.0.1 -p "$port" -t 2; }

# Serialize concurrent runs for the same port. The lock's descriptor is
# closed for pg_ctl so the server does not inherit (and keep) the lock.
lockfile="/tmp/fence-pg-$port.lock"
exec 9>"$lockfile"
if command -v flock >/dev/null; then flock 9; fi

if ready; then
  log "a server already answers on 127.0.0.1:$port; reusing it"
  ensure_database
  echo "$dsn"
  exit 0
fi

mkdir -p "$dir"
if [ "$(id -u)" -eq 0 ]; then chown postgres: "$dir"; fi
chmod 700 "$dir"
data="$dir/data"

init_cluster() {
  log "initdb into $data"
  rm -rf "$data"
  as_owner "$bin/initdb" -D "$data" -U fence --auth=trust --encoding=UTF8 --locale=C.UTF-8 --no-sync >>"$dir/initdb.log" 2>&1 ||
    { cat "$dir/initdb.log" >&2; die "initdb failed"; }
}

start_server() {
  log "starting PostgreSQL on 127.0.0.1:$port (log: $dir/postgres.log)"
  as_owner "$bin/pg_ctl" -D "$data" -l "$dir/postgres.log" -w -t 60 \
    -o "-c listen_addresses=127.0.0.1 -p $port -k '$dir' -c fsync=off -c full_page_writes=off -c max_connections=200" \
    start 9>&- >&2
}

if [ -f "$data/PG_VERSION" ]; then
  # A cluster left by an earlier run whose server is not running: start it,
  # and if that fails (another major version, a broken directory), start over.
  if ! start_server; then
    log "could not start the existing cluster in $data; creating a new one"
    init_cluster
    start_server || { tail -n 30 "$dir/postgres.log" >&2; die "PostgreSQL did not start"; }
  fi
else
  init_cluster
  start_server || { tail -n 30 "$dir/postgres.log" >&2; die "PostgreSQL did not start"; }
fi

ensure_database
log "ready: $dsn"
echo "$dsn"
