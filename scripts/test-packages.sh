#!/usr/bin/env bash
# Builds the Debian packages of the portal and the agent with cargo-deb, then checks that
# each installs into a clean Debian root (a Docker container without network, made by
# debootstrap; no registry) and that its binary runs `--version`, its system user, config,
# state directory and systemd unit are in place, and it removes and purges cleanly.
#
#   bash scripts/test-packages.sh            # packages land in target/debian/
#
# Needs: cargo-deb (`cargo install cargo-deb`), python3 (the book's link check),
# debootstrap (`apt-get install debootstrap`), the Docker Engine, and Debian's mirror the first time (the clean root is
# kept as the local image gpu-commons-pkgtest:SUITE-HASH). Not part of scripts/test.sh: it
# makes a release build (see docs/src/development/tests.md, "Debian packages").
# Environment: DEBIAN_SUITE (default: the host's, so glibc matches), DEBIAN_MIRROR.
set -euo pipefail
cd "$(dirname "$0")/.."

die() { echo "scripts/test-packages.sh: $*" >&2; exit 1; }
command -v cargo-deb >/dev/null || die "cargo-deb is missing: cargo install cargo-deb"
command -v debootstrap >/dev/null || die "debootstrap is missing: apt-get install debootstrap"
command -v docker >/dev/null || die "docker is missing (apt-get install docker.io)"
docker info >/dev/null 2>&1 || die "the Docker Engine is not running or not reachable"

suite="${DEBIAN_SUITE:-$(. /etc/os-release && echo "$VERSION_CODENAME")}"
mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
work="$PWD/target/pkg-test"
mkdir -p "$work"

# 1. The packages (a release build of both binaries and the book, then one .deb each).
start=$(date +%s)
bash scripts/book.sh  # first: a broken link fails before the long build
cargo build --release -p commons-portal -p commons-agent
for crate in commons-portal commons-agent; do
  cargo deb --no-build -p "$crate" --output target/debian/ >/dev/null
done
echo "== packages built in $(( $(date +%s) - start )) s"
version=$(cargo metadata --no-deps --format-version 1 |
  python3 -c 'import json,sys; print(next(p["version"] for p in json.load(sys.stdin)["packages"] if p["name"]=="commons-agent"))')
portal_deb="target/debian/gpu-commons-portal_${version}-1_amd64.deb"
agent_deb="target/debian/gpu-commons-agent_${version}-1_amd64.deb"
for deb in "$portal_deb" "$agent_deb"; do
  [ -f "$deb" ] || die "$deb was not built"
  echo "== $deb: $(du -h "$deb" | cut -f1), Depends: $(dpkg-deb -f "$deb" Depends)"
  dpkg-deb -c "$deb" | grep -q '/book/index\.html$' || die "$deb does not ship the book"
done

# 2. A clean root with exactly what the packages depend on: a Depends that misses a
#    library shows below as a binary that does not start.
deps=$(for deb in "$portal_deb" "$agent_deb"; do dpkg-deb -f "$deb" Depends; done |
  tr ',' '\n' | sed -e 's/|.*//' -e 's/(.*)//' -e 's/ //g' | grep -v '^$' | sort -u | paste -sd, -)
tag="gpu-commons-pkgtest:${suite}-$(echo "$deps" | sha256sum | cut -c1-12)"
if ! docker image inspect "$tag" >/dev/null 2>&1; then
  echo "== debootstrap $suite (minbase + $deps) from $mirror"
  root="$work/root"
  rm -rf "$root"
  debootstrap --variant=minbase --include="$deps" "$suite" "$root" "$mirror" >"$work/debootstrap.log" 2>&1 ||
    die "debootstrap failed; see $work/debootstrap.log"
  tar -C "$root" -c . | docker import - "$tag" >/dev/null
  rm -rf "$root"
fi

# 3. Install, check, remove and purge each package in a fresh container.
check() {
  local deb=$1 script=$2
  docker run --rm --network none -v "$PWD/target/debian:/debs:ro" "$tag" \
    sh -euxc "dpkg -i /debs/$(basename "$deb") >/tmp/dpkg.log 2>&1 || { cat /tmp/dpkg.log; exit 1; }
$script"
}

check "$portal_deb" "
out=\$(commons-portal --version); echo \"\$out\"; [ \"\$out\" = 'commons-portal $version' ]
getent passwd gpu-commons | grep -q ':/var/lib/gpu-commons:/usr/sbin/nologin\$'
[ \"\$(stat -c '%U:%G %a' /var/lib/gpu-commons/portal)\" = 'gpu-commons:gpu-commons 750' ]
[ \"\$(stat -c '%U:%G %a' /etc/gpu-commons/portal.toml)\" = 'root:gpu-commons 640' ]
[ \"\$(stat -c '%U:%G %a %s' /etc/gpu-commons/session.key)\" = 'root:gpu-commons 640 64' ]
grep -q '^ExecStart=/usr/bin/commons-portal serve --config /etc/gpu-commons/portal.toml\$' /usr/lib/systemd/system/commons-portal.service
grep -qx /etc/gpu-commons/portal.toml /var/lib/dpkg/info/gpu-commons-portal.conffiles
grep -q 'Install from Debian packages' /usr/share/doc/gpu-commons-portal/book/src/admin/install.html
key=\$(sha256sum /etc/gpu-commons/session.key)
dpkg -i /debs/$(basename "$portal_deb") >/dev/null 2>&1
[ \"\$(sha256sum /etc/gpu-commons/session.key)\" = \"\$key\" ]  # kept on reinstall
dpkg -r gpu-commons-portal >/dev/null; [ ! -e /usr/bin/commons-portal ]
dpkg -P gpu-commons-portal >/dev/null; [ ! -e /etc/gpu-commons/session.key ]
echo 'portal package: ok'"

check "$agent_deb" "
out=\$(commons-agent --version); echo \"\$out\"; [ \"\$out\" = 'commons-agent $version' ]
getent group gpu-commons >/dev/null
[ \"\$(stat -c '%U:%G %a' /var/lib/gpu-commons/agent)\" = 'root:gpu-commons 750' ]
[ \"\$(stat -c '%U:%G %a' /etc/gpu-commons/agent.env)\" = 'root:root 600' ]
grep -q '^ExecStart=/usr/bin/commons-agent run --state-dir /var/lib/gpu-commons/agent --gpus auto\$' /usr/lib/systemd/system/commons-agent.service
grep -q '^KillMode=process\$' /usr/lib/systemd/system/commons-agent.service
[ -f /usr/share/doc/gpu-commons-agent/book/index.html ]
# The owner's commands find no agent running here, and say so.
if commons-agent status --state-dir /var/lib/gpu-commons/agent >/tmp/status.log 2>&1; then exit 1; fi
grep -q 'the agent is not running' /tmp/status.log || { cat /tmp/status.log; exit 1; }
dpkg -r gpu-commons-agent >/dev/null; [ ! -e /usr/bin/commons-agent ]
dpkg -P gpu-commons-agent >/dev/null
echo 'agent package: ok'"

echo "== both packages install into a clean $suite root and run (in $(( $(date +%s) - start )) s)"
