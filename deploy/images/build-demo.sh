#!/usr/bin/env bash
# Builds the demo image commons-demo:latest without any registry: a FROM-scratch image
# holding Debian's static busybox (sh, echo, sleep, nc, httpd, ...) and, when this machine
# has it, OpenSSH's sftp-server with the libraries it links (scp and sftp through the
# gateway use it).
# Needs: docker, and the busybox-static package (apt-get install busybox-static);
# openssh-sftp-server for sftp in the image.
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
mkdir -p "$ctx/root/etc"
# The job's user (65534) by name: sftp-server, ssh sessions and `id` look it up.
printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/home/job:/bin/sh\n' >"$ctx/root/etc/passwd"
printf 'root:x:0:\nnogroup:x:65534:\n' >"$ctx/root/etc/group"
sftp=/usr/lib/openssh/sftp-server
if [ -x "$sftp" ]; then
  # The binary and every library it links, at the same paths.
  for f in "$sftp" $(ldd "$sftp" | grep -o '/[^ ]*'); do
    mkdir -p "$ctx/root$(dirname "$f")"
    cp -L "$f" "$ctx/root$f"
  done
else
  echo "build-demo.sh: no $sftp here (apt-get install openssh-sftp-server): the image gets no sftp" >&2
fi
cat > "$ctx/Dockerfile" <<'DOCKERFILE'
FROM scratch
COPY busybox /bin/busybox
COPY root/ /
RUN ["/bin/busybox", "--install", "-s", "/bin"]
RUN ["/bin/sh", "-c", "mkdir -p /tmp /checkpoint /home/job && chmod 1777 /tmp /checkpoint /home/job"]
ENV PATH=/bin HOME=/home/job
WORKDIR /home/job
LABEL commons.demo-version="2"
CMD ["sh", "-c", "echo hello from GPU Commons; echo GPUs: $NVIDIA_VISIBLE_DEVICES"]
DOCKERFILE
if ! docker build -q -t "$image" "$ctx" >"$ctx/build.log" 2>&1; then
  cat "$ctx/build.log" >&2
  exit 1
fi
echo "built $image"
