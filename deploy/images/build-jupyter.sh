#!/usr/bin/env bash
# Builds commons-jupyter:test, the image the web-app tests run a real Jupyter Server and
# JupyterLab in, without any registry: a Debian root made by debootstrap (minbase plus
# python3) and the Python packages installed from PyPI on this machine (pip --target,
# binary wheels only) into /opt/jupyter in that root, imported with `docker import`.
# Jobs run it as `python3 -m jupyterlab ...` (PYTHONPATH and Jupyter's data, lab and
# config paths under /opt/jupyter are set in the image: pip --target puts the packages'
# data files there, not under /usr).
#
# The image is labelled with a hash of this recipe; when the engine already has it, the
# script does nothing (a fresh machine builds it once: about 2-4 minutes).
#
# Needs: root, debootstrap, docker, a Debian mirror and PyPI.
# Usage: build-jupyter.sh [IMAGE]   (env PYTHON: a python3 with pip, default the tests' venv)
set -euo pipefail
cd "$(dirname "$0")/../.."
image="${1:-commons-jupyter:test}"
suite=bookworm
mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
packages=(jupyter-server==2.21.1 jupyterlab==4.6.6 "ipykernel>=6,<8")
recipe="$(sha256sum "$0" | cut -c1-16)"

have="$(docker image inspect "$image" --format '{{ index .Config.Labels "commons.recipe" }}' 2>/dev/null || true)"
if [ "$have" = "$recipe" ]; then
  echo "$image is up to date"
  exit 0
fi
command -v debootstrap >/dev/null || { echo "build-jupyter.sh: apt-get install debootstrap" >&2; exit 1; }
python="${PYTHON:-target/test-venv/bin/python}"
[ -x "$python" ] || python=python3

work="$(mktemp -d)"
cleanup() { rm -rf "$work"; }
trap cleanup EXIT
root="$work/root"
echo "build-jupyter.sh: debootstrap $suite (minbase, python3) from $mirror"
debootstrap --variant=minbase --include=python3 "$suite" "$root" "$mirror" >"$work/debootstrap.log" 2>&1 || {
  tail -n 30 "$work/debootstrap.log" >&2
  exit 1
}
# What an image does not need.
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* "$root"/usr/share/doc \
  "$root"/usr/share/man "$root"/usr/share/locale
echo "build-jupyter.sh: pip install ${packages[*]}"
"$python" -m pip install --quiet --disable-pip-version-check --no-warn-conflicts --no-compile \
  --only-binary=:all: --python-version 3.11 --implementation cp --platform manylinux2014_x86_64 \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform any \
  --target "$root/opt/jupyter" "${packages[@]}"
tar -C "$root" -c . | docker import \
  -c 'ENV PYTHONPATH=/opt/jupyter' \
  -c 'ENV JUPYTER_PATH=/opt/jupyter/share/jupyter' \
  -c 'ENV JUPYTERLAB_DIR=/opt/jupyter/share/jupyter/lab' \
  -c 'ENV JUPYTER_CONFIG_PATH=/opt/jupyter/etc/jupyter' \
  -c 'ENV PATH=/opt/jupyter/bin:/usr/local/bin:/usr/bin:/bin' \
  -c "LABEL commons.recipe=$recipe" \
  - "$image" >/dev/null
echo "built $image ($(docker image inspect "$image" --format '{{ .Size }}' | numfmt --to=iec))"
