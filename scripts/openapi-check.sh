#!/usr/bin/env bash
# Checks the REST API against its OpenAPI document (docs/openapi.json):
#
# 1. the document is valid OpenAPI (openapi-spec-validator);
# 2. a live portal (SQLite in a temporary folder, an operator who administers a lab, a
#    personal access token, a server enrolled by a real agent with fake GPUs, so the
#    node, overview and utilisation answers are not empty) answers every operation, for generated valid and invalid
#    requests, with no 5xx and with responses that match the document (schemathesis,
#    checks not_a_server_error and response_schema_conformance).
#
# That docs/openapi.json is what the portal serves is a unit test
# (`cargo test -p commons-portal --lib openapi`). The Python tools go into target/test-venv
# (as scripts/test-deps.sh does for moto). OPENAPI_CHECK_EXAMPLES sets how many requests
# schemathesis makes per operation and phase (default 50: under a minute once built).
set -euo pipefail
cd "$(dirname "$0")/.."

say() { echo "scripts/openapi-check.sh: $*" >&2; }
venv=target/test-venv
examples="${OPENAPI_CHECK_EXAMPLES:-50}"

want=("openapi-spec-validator==0.9.0" "schemathesis==4.32.5")
frozen="$("$venv/bin/pip" freeze 2>/dev/null || true)"
if ! { grep -qxF "${want[0]}" <<<"$frozen" && grep -qxF "${want[1]}" <<<"$frozen"; }; then
  [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
  say "installing ${want[*]} into $venv"
  "$venv/bin/pip" install -q "${want[@]}" >/tmp/openapi-check-pip.log 2>&1 || {
    cat /tmp/openapi-check-pip.log >&2
    say "pip install failed (log above)"
    exit 1
  }
fi

"$venv/bin/openapi-spec-validator" docs/openapi.json

cargo build -q -p commons-portal --bin commons-portal -p commons-agent --bin commons-agent
portal=target/debug/commons-portal
agent=target/debug/commons-agent
work="$(mktemp -d)"
pid=""
agent_pid=""
cleanup() {
  for p in $agent_pid $pid; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

db="sqlite://$work/portal.db"
head -c 64 /dev/urandom >"$work/session.key"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
cat >"$work/portal.toml" <<EOF
database_url = "$db"
listen = "127.0.0.1:$port"
session_key_file = "$work/session.key"
EOF
admin() { "$portal" admin --config "$work/portal.toml" "$@"; }
admin create-lab vision --name "Vision Lab" >/dev/null
admin create-lab nlp --name "NLP Lab" >/dev/null
admin create-user olga --email olga@campus.example --lab vision --role admin --operator >/dev/null
admin create-user bob --email bob@campus.example --lab nlp >/dev/null
admin images allow commons-demo:latest \
  --digest "sha256:$(printf '0%.0s' $(seq 64))" >/dev/null
token="$(admin api-token olga)"
enrol="$(admin enrol-token vision)"

base="http://127.0.0.1:$port"
"$portal" serve --config "$work/portal.toml" >"$work/portal.log" 2>&1 &
pid=$!
for _ in $(seq 1 100); do
  curl -fsS "$base/api/v1/openapi.json" -o /dev/null 2>/dev/null && break
  kill -0 "$pid" 2>/dev/null || { cat "$work/portal.log" >&2; say "the portal did not start"; exit 1; }
  sleep 0.2
done

# A server of vision's, enrolled by a real agent with two fake GPUs (no job runs there:
# the allowed image's pinned digest is no image here).
"$agent" run --portal "$base" --enrol-token "$enrol" --state-dir "$work/agent" \
  --host-id-file "$work/host-id" --name vision-gpu1 --gpus fake:2xA100-80GB \
  --job-disk watch >"$work/agent.log" 2>&1 &
agent_pid=$!
for _ in $(seq 1 300); do
  curl -fsS -H "Authorization: Bearer $token" "$base/api/v1/nodes" | grep -q '"online":true' && break
  kill -0 "$agent_pid" 2>/dev/null || { cat "$work/agent.log" >&2; say "the agent did not start"; exit 1; }
  sleep 0.2
done
curl -fsS -H "Authorization: Bearer $token" "$base/api/v1/nodes" | grep -q '"online":true' || {
  tail -n 20 "$work/agent.log" >&2
  say "the agent did not come online within 60 s (its log above)"
  exit 1
}

# Something to read back: a queued job, an SSH key.
api() { curl -fsS -H "Authorization: Bearer $token" -H 'Content-Type: application/json' "$@" >/dev/null; }
api -X POST "$base/api/v1/jobs" \
  -d '{"image": "commons-demo:latest", "gpus": 1, "time_limit_minutes": 5, "lab": "vision"}'
if command -v ssh-keygen >/dev/null; then
  ssh-keygen -q -t ed25519 -N '' -C olga@laptop -f "$work/id_ed25519"
  api -X POST "$base/api/v1/ssh-keys" -d "{\"public_key\": \"$(cat "$work/id_ed25519.pub")\"}"
fi

say "schemathesis against $base, $examples examples per operation"
t0=$SECONDS
status=0
"$venv/bin/st" run docs/openapi.json --url "$base" \
  -H "Authorization: Bearer $token" \
  --checks not_a_server_error,response_schema_conformance \
  --max-examples "$examples" --seed 1 --workers 1 \
  --request-timeout 20 --warnings off || status=$?
say "schemathesis took $((SECONDS - t0)) s"
if [ "$status" != 0 ]; then
  tail -n 40 "$work/portal.log" >&2
  say "the API does not keep to docs/openapi.json (schemathesis exit $status; the portal's log above)"
fi
exit "$status"
