#!/usr/bin/env bash
# Runs every test of GPU Commons: unit, property and integration tests, against SQLite and
# PostgreSQL, with the real Docker Engine. Arguments go to `cargo test`.
#
# First scripts/test-deps.sh makes sure the tests have what they need (Debian packages,
# moto in target/test-venv, a running Docker Engine): as root it installs what is missing,
# otherwise it says what is missing and how to install it. Unless TEST_DATABASE_URL is
# set, a private PostgreSQL server is started on a free port under target/test-pg and
# stopped at the end.
set -euo pipefail
cd "$(dirname "$0")/.."

die() { echo "scripts/test.sh: $*" >&2; exit 1; }
bash scripts/test-deps.sh

pg_pid=""
cleanup() {
  if [ -n "$pg_pid" ]; then
    "$PG_BIN/pg_ctl" -D "$PG_DATA" -m fast stop >/dev/null 2>&1 || runuser -u postgres -- "$PG_BIN/pg_ctl" -D "$PG_DATA" -m fast stop >/dev/null 2>&1 || true
  fi
}
trap cleanup EXIT

if [ -z "${TEST_DATABASE_URL:-}" ]; then
  PG_BIN="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)"
  [ -x "$PG_BIN/initdb" ] || die "PostgreSQL server binaries are missing (apt-get install postgresql)"
  PG_DATA="$PWD/target/test-pg/data"
  PG_SOCK="$PWD/target/test-pg"
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  as_pg=()
  # PostgreSQL refuses to run as root: use the postgres system user then.
  if [ "$(id -u)" = 0 ]; then as_pg=(runuser -u postgres --); fi
  rm -rf "$PG_DATA"; mkdir -p "$PG_DATA"
  [ "$(id -u)" = 0 ] && chown -R postgres "$PG_SOCK"
  "${as_pg[@]}" "$PG_BIN/initdb" -D "$PG_DATA" -U postgres -A trust >/dev/null
  "${as_pg[@]}" "$PG_BIN/pg_ctl" -D "$PG_DATA" -w -l "$PG_SOCK/log" \
    -o "-p $port -k $PG_SOCK -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=300" start >/dev/null
  pg_pid=1
  export TEST_DATABASE_URL="postgres://postgres@127.0.0.1:$port/postgres"
  echo "scripts/test.sh: private PostgreSQL on port $port"
fi

bash deploy/images/build-demo.sh
# A real Jupyter Server and JupyterLab for the web-app tests (built once per machine).
bash deploy/images/build-jupyter.sh
# The agents that tests run in-process start their attempt guards from this binary, and
# the cluster tests run it as a process: build it first, so it is never a stale one.
cargo build -p commons-agent --bin commons-agent
# The fuzzing harnesses (portal/tests/it/support/fuzzkit.rs) count their cases into this file.
rm -f target/fuzz-report.txt
cargo test --workspace --all-targets "$@"
if [ -f target/fuzz-report.txt ]; then
  echo "== fuzzing (cases run; COMMONS_FUZZ_CASES=N for a longer run)"
  sort target/fuzz-report.txt
fi
