#!/usr/bin/env bash
# A private, throwaway PostgreSQL for tests and benchmarks.
#   scripts/postgres.sh start   # initdb (once) + start on 127.0.0.1:$PGPORT, create the database, print the URL
#   scripts/postgres.sh url     # print the URL
#   scripts/postgres.sh stop    # stop it (data stays in $PGDATA_ROOT; `purge` removes it)
# Runs the server as the `postgres` OS user when started as root. Trust auth on loopback only.
set -euo pipefail

PGBIN=${PGBIN:-/usr/lib/postgresql/15/bin}
PGDATA_ROOT=${PGDATA_ROOT:-/var/tmp/hpc-det-pg}
PGPORT=${PGPORT:-25432}  # below the ephemeral range (32768-60999): no client socket can hold it
PGDB=${PGDB:-hpcdet}
PGUSER_NAME=${PGUSER_NAME:-postgres}
DATA="$PGDATA_ROOT/data"
LOG="$PGDATA_ROOT/server.log"

as_pg() {
    if [ "$(id -u)" = 0 ]; then
        runuser -u postgres -- "$@"
    else
        "$@"
    fi
}

url() { echo "postgresql+psycopg://${PGUSER_NAME}@127.0.0.1:${PGPORT}/${PGDB}"; }

start() {
    mkdir -p "$PGDATA_ROOT"
    if [ "$(id -u)" = 0 ]; then chown postgres: "$PGDATA_ROOT"; fi
    if [ ! -f "$DATA/PG_VERSION" ]; then
        as_pg "$PGBIN/initdb" -D "$DATA" -U "$PGUSER_NAME" --auth=trust -E UTF8 >/dev/null
    fi
    if ! as_pg "$PGBIN/pg_ctl" -D "$DATA" status >/dev/null 2>&1; then
        as_pg "$PGBIN/pg_ctl" -D "$DATA" -l "$LOG" -w -t 30 start \
            -o "-h 127.0.0.1 -p $PGPORT -k $PGDATA_ROOT -c fsync=on -c max_connections=200" >/dev/null
    fi
    if ! as_pg "$PGBIN/psql" -h 127.0.0.1 -p "$PGPORT" -U "$PGUSER_NAME" -d postgres -tAc \
        "SELECT 1 FROM pg_database WHERE datname='$PGDB'" | grep -q 1; then
        as_pg "$PGBIN/createdb" -h 127.0.0.1 -p "$PGPORT" -U "$PGUSER_NAME" "$PGDB"
    fi
    url
}

stop() {
    if [ -f "$DATA/PG_VERSION" ]; then
        as_pg "$PGBIN/pg_ctl" -D "$DATA" -m fast -w stop >/dev/null 2>&1 || true
    fi
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    url) url ;;
    purge) stop; rm -rf "$PGDATA_ROOT" ;;
    *) echo "usage: $0 start|stop|url|purge" >&2; exit 2 ;;
esac
