#!/usr/bin/env bash
# The agent's own CPU and memory while it serves a lab server, measured from /proc:
#   1. idle: 8 fake GPUs, nothing running;
#   2. busy: 8 jobs running (one container of the demo image on each GPU, `sleep`), each
#      fake GPU reporting 90% utilisation, so every heartbeat, lease renewal, container
#      watch and periodic checkpoint sync has work.
# The portal (release build, SQLite, loopback) and the agent (release build, the real
# Docker Engine) run as separate processes; the figures are the agent process's alone,
# plus its per-attempt guard processes (`commons-agent guard`) in the busy phase.
#
#   bash scripts/agent-overhead.sh [SECONDS]      # SECONDS per phase, default 60
#   PROFILE=debug bash scripts/agent-overhead.sh  # the debug build instead of release
#   NO_BUILD=1 ...                                # use the binaries already built
#
# CPU is (utime + stime) of /proc/PID/stat over the phase, as a percentage of one core;
# RSS is VmRSS of /proc/PID/status, sampled every second (mean and peak).
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${1:-60}"
die() { echo "scripts/agent-overhead.sh: $*" >&2; exit 1; }
docker info >/dev/null 2>&1 || die "the Docker Engine is not running or not reachable"

profile="${PROFILE:-release}"
case "$profile" in
  release) [ -n "${NO_BUILD:-}" ] || cargo build --release -p commons-portal -p commons-agent ;;
  debug) [ -n "${NO_BUILD:-}" ] || cargo build -p commons-portal -p commons-agent ;;
  *) die "PROFILE is release or debug" ;;
esac
bash deploy/images/build-demo.sh >/dev/null
portal_bin="$PWD/target/$profile/commons-portal"
agent_bin="$PWD/target/$profile/commons-agent"
tmp=$(mktemp -d)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
url="http://127.0.0.1:$port"
export COMMONS_DATABASE_URL="sqlite://$tmp/portal.db"
portal_pid="" agent_pid=""
cleanup() {
  [ -n "$agent_pid" ] && kill "$agent_pid" 2>/dev/null || true
  [ -n "$portal_pid" ] && kill "$portal_pid" 2>/dev/null || true
  if [ -f "$tmp/agent/node.json" ]; then
    id=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["agent_id"])' "$tmp/agent/node.json")
    ids=$(docker ps -aq --filter "label=commons.agent=$id")
    [ -z "$ids" ] || docker rm -f $ids >/dev/null
  fi
  # The guards of the attempts end with their containers; wait for them before removing
  # the state dir they read.
  sleep 1
  # Jobs' volumes the agent mounted (as root it caps each job's disk with an ext4 image):
  # unmounted first, or rm would empty them through their mounts and leave them attached.
  findmnt -rn -o TARGET | grep "^$tmp/" | sort -r | xargs -r -n1 umount -l 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT

"$portal_bin" admin create-lab bench --name Bench >/dev/null
"$portal_bin" admin create-user ann --email ann@bench.test --lab bench --role admin >/dev/null
token=$("$portal_bin" admin api-token ann)
enrol=$("$portal_bin" admin enrol-token bench)
"$portal_bin" serve --listen "127.0.0.1:$port" --insecure-dev-login >"$tmp/portal.log" 2>&1 &
portal_pid=$!
for _ in $(seq 100); do curl -fs "$url/healthz" >/dev/null && break; sleep 0.2; done
curl -fs "$url/healthz" >/dev/null || die "the portal did not start; see $tmp/portal.log"

api() { curl -fs -H "Authorization: Bearer $token" -H 'content-type: application/json' "$@"; }
COMMONS_ENROL_TOKEN="$enrol" "$agent_bin" run --portal "$url" --state-dir "$tmp/agent" \
  --host-id-file "$tmp/host-id" --gpus fake:8xA100-80GB >"$tmp/agent.log" 2>&1 &
agent_pid=$!
for _ in $(seq 150); do
  n=$(api "$url/api/v1/nodes" | python3 -c 'import json,sys; v=json.load(sys.stdin); print(sum(len(n["gpus"]) for n in v if n["online"]))' || echo 0)
  [ "$n" = 8 ] && break; sleep 0.2
done
[ "$n" = 8 ] || die "the agent did not come online with 8 GPUs; see $tmp/agent.log"

ticks=$(getconf CLK_TCK)
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
rss_kb() { awk '/^VmRSS:/ {print $2}' "/proc/$1/status"; }
guards() { pgrep -f "^commons-agent guard --state-dir $tmp/agent " || true; }
# One phase: the agent's (and its guards') CPU over $secs, and the agent's RSS each second.
measure() {
  local phase=$1 c0 c1 g0=0 g1=0 rss_sum=0 rss_max=0 n=0 r
  c0=$(cpu_ticks "$agent_pid")
  for g in $(guards); do g0=$((g0 + $(cpu_ticks "$g"))); done
  for _ in $(seq "$secs"); do
    sleep 1
    r=$(rss_kb "$agent_pid"); rss_sum=$((rss_sum + r)); n=$((n + 1))
    [ "$r" -gt "$rss_max" ] && rss_max=$r
  done
  c1=$(cpu_ticks "$agent_pid")
  local guard_rss=0 count=0
  for g in $(guards); do
    g1=$((g1 + $(cpu_ticks "$g"))); guard_rss=$((guard_rss + $(rss_kb "$g"))); count=$((count + 1))
  done
  python3 - "$phase" "$secs" "$ticks" "$c0" "$c1" "$rss_sum" "$n" "$rss_max" "$g0" "$g1" "$count" "$guard_rss" <<'EOF'
import sys
phase, secs, ticks, c0, c1, rss_sum, n, rss_max, g0, g1, count, guard_rss = sys.argv[1:]
secs, ticks = float(secs), float(ticks)
cpu = (int(c1) - int(c0)) / ticks / secs * 100
line = (f"{phase}: agent CPU {cpu:.2f}% of one core over {secs:.0f} s, "
        f"RSS mean {int(rss_sum) / int(n) / 1024:.1f} MiB, peak {int(rss_max) / 1024:.1f} MiB")
if int(count):
    gcpu = (int(g1) - int(g0)) / ticks / secs * 100
    line += f"; {count} guards: CPU {gcpu:.2f}% together, RSS {int(guard_rss) / 1024:.1f} MiB together"
print(line)
EOF
}

sleep 5
echo "== $profile build, $(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg)"
measure "idle (8 fake GPUs, no job)"

job='{"image": "commons-demo:latest", "command": ["sleep", "3600"], "gpus": 1, "time_limit_minutes": 60}'
for _ in $(seq 8); do api -X POST -d "$job" "$url/api/v1/jobs" >/dev/null; done
for i in $(seq 0 7); do "$agent_bin" fake --state-dir "$tmp/agent" --gpu "$i" --util 90 >/dev/null; done
for _ in $(seq 300); do
  running=$(api "$url/api/v1/jobs" | python3 -c 'import json,sys; v=json.load(sys.stdin); v=v.get("jobs", v) if isinstance(v, dict) else v; print(sum(j["state"] == "running" for j in v))')
  [ "$running" = 8 ] && break; sleep 0.5
done
[ "$running" = 8 ] || die "only $running of 8 jobs are running; see $tmp/agent.log"
sleep 5
measure "busy (8 GPUs at 90%, 8 running containers)"
