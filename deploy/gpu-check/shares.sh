#!/bin/bash
# Shares of one GPU on real hardware (issue 32 §3): the agent's executor with the NVML
# backend and --share-mode mps starts two half shares of GPU 0 (a CUDA program each),
# then nvidia-smi must show the MPS server and both clients, each job its variables, and
# the MPS daemon must stop with the last share. Prints PASS/FAIL lines; exits non-zero on
# any FAIL. NOT YET RUN ON HARDWARE.
#
# Needs: an NVIDIA GPU and driver (nvidia-smi, nvidia-cuda-mps-control on PATH), Docker
# with the NVIDIA container toolkit, root (MPS and the job volumes), the Rust toolchain,
# and a CUDA image with PyTorch loaded locally (COMMONS_GPU_CHECK_IMAGE, default
# pytorch/pytorch:latest; `docker pull` it first: the agent runs local images by ID).
#
#   sudo deploy/gpu-check/shares.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
fail() { echo "FAIL $*"; exit 1; }
command -v nvidia-smi >/dev/null || fail "nvidia-smi not found: no NVIDIA driver here"
command -v nvidia-cuda-mps-control >/dev/null || fail "nvidia-cuda-mps-control not found"
nvidia-smi -L | grep -q . || fail "nvidia-smi lists no GPU"
image=${COMMONS_GPU_CHECK_IMAGE:-pytorch/pytorch:latest}
docker image inspect "$image" >/dev/null 2>&1 || fail "image $image is not loaded (docker pull $image)"
echo "PASS prerequisites ($(nvidia-smi --query-gpu=name --format=csv,noheader | head -1))"
# MPS needs the GPU in a compute mode that allows several processes (the default).
mode=$(nvidia-smi -i 0 --query-gpu=compute_mode --format=csv,noheader)
echo "GPU 0 compute mode: $mode"
cargo build -q -p commons-agent --bin commons-agent
COMMONS_GPU_CHECK_IMAGE="$image" cargo test -q -p commons-agent --test it -- \
    --ignored --nocapture --exact shares_nvml::two_half_shares_run_under_mps_on_a_real_gpu \
    2>&1 | tee /tmp/commons-gpu-check-shares.log | grep -E '^(PASS|FAIL)|test result' || true
grep -q '^FAIL' /tmp/commons-gpu-check-shares.log && exit 1
grep -q 'test result: ok. 1 passed' /tmp/commons-gpu-check-shares.log || fail "the check did not run (see /tmp/commons-gpu-check-shares.log)"
echo "PASS shares under MPS"
