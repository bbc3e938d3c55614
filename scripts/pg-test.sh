#!/usr/bin/env bash
# A throw-away PostgreSQL 15 cluster for the Postgres store's tests: initdb into a temp dir as
# the `postgres` user (initdb refuses root), a free loopback port, password (SCRAM) auth with a
# random password, no unix socket. Two ways to use it:
#
#   bash scripts/pg-test.sh -- cargo test -p sandboxd-postgres
#       runs the command with SANDBOXD_TEST_PG_URL exported, then stops and removes the cluster;
#   eval "$(bash scripts/pg-test.sh start)"   …   bash scripts/pg-test.sh stop "$SANDBOXD_TEST_PG_DIR"
#       leaves it running (CI: the whole `cargo test`), printing the variables to export;
#   bash scripts/pg-test.sh halt DIR  /  bash scripts/pg-test.sh resume DIR
#       shuts the cluster down (fast: sessions cut, committed work kept) and starts it again on
#       the same port, for tests of a store that goes away and comes back.
#
# Each test makes its own database in the cluster (CREATE DATABASE with a random name) and drops
# it afterwards, so tests run in parallel against one cluster.
set -euo pipefail

bindir=${PG_BINDIR:-/usr/lib/postgresql/15/bin}
as_pg() { # runs a command as the cluster's owner (root may not run initdb/postgres)
    if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

start() {
    [ -x "$bindir/initdb" ] || {
        echo "pg-test: no $bindir/initdb: apt-get install postgresql-15" >&2
        exit 2
    }
    local dir port pw
    dir=$(mktemp -d /tmp/sandboxd-pg.XXXXXX)
    if [ "$(id -u)" = 0 ]; then chown postgres: "$dir"; fi
    chmod 700 "$dir"
    pw=$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n')
    printf '%s\n' "$pw" >"$dir/pw"
    if [ "$(id -u)" = 0 ]; then chown postgres: "$dir/pw"; fi
    as_pg "$bindir/initdb" -D "$dir/data" -U postgres --auth=scram-sha-256 \
        --pwfile="$dir/pw" -E UTF8 --locale=C.UTF-8 >"$dir/initdb.log" 2>&1 || {
        cat "$dir/initdb.log" >&2
        exit 1
    }
    port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
    printf '%s\n' "$port" >"$dir/port"
    run "$dir"
    echo "export SANDBOXD_TEST_PG_URL='postgres://postgres:$pw@127.0.0.1:$port/postgres'"
    echo "export SANDBOXD_TEST_PG_DIR='$dir'"
}

run() { # starts the cluster in $1 on the port recorded there
    local dir=$1 port
    port=$(cat "$dir/port")
    as_pg "$bindir/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 30 \
        -o "-c listen_addresses=127.0.0.1 -p $port -c unix_socket_directories='' -c max_connections=200 -c fsync=off" \
        start >/dev/null || {
        cat "$dir/server.log" >&2
        exit 1
    }
}

ours() { # refuses a directory this script did not make
    case "$1" in /tmp/sandboxd-pg.*) ;; *)
        echo "pg-test: refusing to touch $1" >&2
        exit 2
        ;;
    esac
}

stop() {
    local dir=$1
    case "$dir" in /tmp/sandboxd-pg.*) ;; *)
        echo "pg-test: refusing to remove $dir" >&2
        exit 2
        ;;
    esac
    as_pg "$bindir/pg_ctl" -D "$dir/data" -m immediate -w stop >/dev/null 2>&1 || true
    rm -rf "$dir"
}

case "${1:-}" in
start) start ;;
halt)
    ours "${2:?the cluster directory}"
    as_pg "$bindir/pg_ctl" -D "$2/data" -m fast -w stop >/dev/null
    ;;
resume)
    ours "${2:?the cluster directory}"
    run "$2"
    ;;
stop) stop "${2:?the cluster directory (SANDBOXD_TEST_PG_DIR)}" ;;
--)
    shift
    eval "$(start)"
    trap 'stop "$SANDBOXD_TEST_PG_DIR"' EXIT
    "$@"
    ;;
*)
    echo "usage: $0 start | stop DIR | halt DIR | resume DIR | -- COMMAND…" >&2
    exit 2
    ;;
esac
