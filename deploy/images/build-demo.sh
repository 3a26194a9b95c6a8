#!/usr/bin/env bash
# Builds the demo image commons-demo:latest without any registry: a FROM-scratch image
# holding Debian's static busybox (sh, echo, sleep, nc, httpd, ...).
# Needs: docker, and the busybox-static package (apt-get install busybox-static).
set -euo pipefail
image="${1:-commons-demo:latest}"
busybox="${BUSYBOX:-/bin/busybox}"
linkage="$(ldd "$busybox" 2>&1 || true)"
if [ ! -x "$busybox" ] || ! grep -Eq 'not a dynamic executable|statically linked' <<<"$linkage"; then
  echo "build-demo.sh: $busybox is not a static busybox; install it with: apt-get install busybox-static" >&2
  exit 1
fi
ctx="$(mktemp -d)"
trap 'rm -rf "$ctx"' EXIT
cp "$busybox" "$ctx/busybox"
cat > "$ctx/Dockerfile" <<'DOCKERFILE'
FROM scratch
COPY busybox /bin/busybox
RUN ["/bin/busybox", "--install", "-s", "/bin"]
RUN ["/bin/sh", "-c", "mkdir -p /tmp /checkpoint /home/job && chmod 1777 /tmp /checkpoint /home/job"]
ENV PATH=/bin HOME=/home/job
WORKDIR /home/job
CMD ["sh", "-c", "echo hello from GPU Commons; echo GPUs: $NVIDIA_VISIBLE_DEVICES"]
DOCKERFILE
if ! docker build -q -t "$image" "$ctx" >"$ctx/build.log" 2>&1; then
  cat "$ctx/build.log" >&2
  exit 1
fi
echo "built $image"
