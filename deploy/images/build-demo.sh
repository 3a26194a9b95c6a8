#!/usr/bin/env bash
# Builds the demo image commons-demo:latest without any registry: a FROM-scratch image
# holding a static busybox (sh, echo, sleep, nc, httpd, ...) and, when this machine has
# it, OpenSSH's sftp-server with the libraries it links (scp and sftp through the gateway
# use it).
#
# Without a static busybox (Debian: apt-get install busybox-static), and only when
# DEMO_IMAGE_ALLOW_HOST=1 (what `commons-portal demo` sets), it builds a smaller image
# from this machine's own shell and coreutils and the shared libraries they link (found
# with ldd): enough for the demo's jobs, not for the tests (no nc, no httpd). That image
# is labelled commons.demo-version="2-host", so the tests' check rebuilds it once
# busybox-static is there.
#
# Needs: docker. Usage: build-demo.sh [IMAGE]   (env BUSYBOX: the busybox to use)
set -euo pipefail
image="${1:-commons-demo:latest}"
version=2
busybox="${BUSYBOX:-/bin/busybox}"

static_busybox() {
  [ -x "$busybox" ] || return 1
  local linkage
  linkage="$(ldd "$busybox" 2>&1 || true)"
  grep -Eq 'not a dynamic executable|statically linked' <<<"$linkage"
}

ctx="$(mktemp -d)"
trap 'rm -rf "$ctx"' EXIT
mkdir -p "$ctx/root/etc" "$ctx/root/bin"

# Copies binary $1 to $2 in the image, and every library it links at the same paths.
copy_linked() {
  local from="$1" to="$2" lib
  mkdir -p "$ctx/root$(dirname "$to")"
  cp -L "$from" "$ctx/root$to"
  for lib in $(ldd "$from" 2>/dev/null | grep -o '/[^ ]*' || true); do
    [ -e "$ctx/root$lib" ] && continue
    mkdir -p "$ctx/root$(dirname "$lib")"
    cp -L "$lib" "$ctx/root$lib"
  done
}

if static_busybox; then
  cp "$busybox" "$ctx/root/bin/busybox"
  install_applets='RUN ["/bin/busybox", "--install", "-s", "/bin"]'
  label="$version"
elif [ "${DEMO_IMAGE_ALLOW_HOST:-}" = 1 ]; then
  echo "build-demo.sh: no static busybox here ($busybox); building $image from this machine's" \
       "own sh and coreutils instead (enough for the demo; the tests need: apt-get install busybox-static)" >&2
  sh_bin="$(type -P dash || type -P bash)" || { echo "build-demo.sh: no dash or bash on this machine" >&2; exit 1; }
  copy_linked "$sh_bin" /bin/sh
  for tool in cat chmod cp date echo env false head hostname id kill ls mkdir mv printf \
              rm seq sleep sort tail tee touch tr true uname wc base64 timeout; do
    path="$(type -P "$tool" || true)"
    [ -n "$path" ] && copy_linked "$path" "/bin/$tool"
  done
  install_applets=''
  label="$version-host"
else
  echo "build-demo.sh: $busybox is not a static busybox; install it with: apt-get install busybox-static" >&2
  exit 1
fi

# The job's user (65534) by name: sftp-server, ssh sessions and `id` look it up.
printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/home/job:/bin/sh\n' >"$ctx/root/etc/passwd"
printf 'root:x:0:\nnogroup:x:65534:\n' >"$ctx/root/etc/group"
sftp=/usr/lib/openssh/sftp-server
if [ -x "$sftp" ]; then
  copy_linked "$sftp" "$sftp"
else
  echo "build-demo.sh: no $sftp here (apt-get install openssh-sftp-server): the image gets no sftp" >&2
fi
cat > "$ctx/Dockerfile" <<DOCKERFILE
FROM scratch
COPY root/ /
$install_applets
RUN ["/bin/sh", "-c", "mkdir -p /tmp /checkpoint /home/job && chmod 1777 /tmp /checkpoint /home/job"]
ENV PATH=/bin HOME=/home/job
WORKDIR /home/job
LABEL commons.demo-version="$label"
CMD ["sh", "-c", "echo hello from GPU Commons; echo GPUs: \$NVIDIA_VISIBLE_DEVICES"]
DOCKERFILE
if ! docker build -q -t "$image" "$ctx" >"$ctx/build.log" 2>&1; then
  cat "$ctx/build.log" >&2
  exit 1
fi
echo "built $image"
