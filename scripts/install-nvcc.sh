#!/usr/bin/env bash
# Installs nvcc 13.0 from PyPI into .cache/nvcc (idempotent) and prints the nvcc path.
# Pinned to 13.0: the validation GPUs run driver 580 (CUDA 13.0), which cannot JIT newer PTX.
# Usage: scripts/install-nvcc.sh            (prints the path of nvcc on its last line)
set -euo pipefail
cd "$(dirname "$0")/.."
prefix="$PWD/.cache/nvcc"
nvcc="$prefix/nvidia/cu13/bin/nvcc"
if [[ ! -x "$nvcc" ]]; then
    python3 -m pip install --quiet --disable-pip-version-check --target "$prefix" \
        "nvidia-cuda-nvcc==13.0.*" "nvidia-cuda-crt==13.0.*" "nvidia-nvvm==13.0.*" \
        "nvidia-cuda-runtime==13.0.*" "nvidia-cuda-cccl==13.0.*" >&2
fi
[[ -x "$nvcc" ]] || { echo "install-nvcc: no nvcc at $nvcc after install" >&2; exit 1; }
echo "$nvcc"
