#!/usr/bin/env bash
# The test command of the README: every check CI runs, from a fresh machine.
# Usage: scripts/test.sh
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n==> %s\n' "$*"; }

# CUDA kernels: with no nvcc on the machine, install the pinned 13.0 one from
# PyPI into .cache/nvcc (seconds once cached), so every run compiles every
# kernel for every target; a register spill fails the build.
if [[ -z "${NVCC:-}" ]] && ! command -v nvcc >/dev/null \
    && [[ ! -x "${CUDA_HOME:-${CUDA_PATH:-/nonexistent}}/bin/nvcc" ]]; then
    step "install nvcc 13.0 from PyPI (scripts/install-nvcc.sh)"
    bash scripts/install-nvcc.sh
fi
export FP8_DENY_SPILLS=1

# Kernel parameter structs: regenerate the Rust side from the C header with
# bindgen and fail on any difference (libclang from PyPI's wheel).
step "bindgen: src/backend/cuda/params.rs matches cuda/include/fp8_params.h"
if [[ -z "${LIBCLANG_PATH:-}" ]]; then
    if [[ ! -f .cache/libclang/clang/native/libclang.so ]]; then
        python3 -m pip install --quiet --disable-pip-version-check --target .cache/libclang "libclang==18.*"
    fi
    export LIBCLANG_PATH="$PWD/.cache/libclang/clang/native"
fi
CARGO_TARGET_DIR="$PWD/target/gen-bindings" cargo run --quiet --release \
    --manifest-path tools/gen-bindings/Cargo.toml -- --check

step "cargo fmt --check"
cargo fmt --all -- --check

step "no dependency cycles between modules (scripts/check-cycles.py)"
python3 scripts/check-cycles.py

step "cargo clippy --all-targets -- -D warnings"
cargo clippy --release --all-targets -- -D warnings

step "SASS: the Hopper FP8 GEMM has QGMMA and 168 registers, no kernel spills (scripts/check-sass.sh)"
cargo build --release --quiet
bash scripts/check-sass.sh

step "cargo test --release (unit, integration, doc tests; exhaustive format tests included)"
cargo test --release

step "fp8 train smoke run (fp32 vs fp8-delayed, 20 steps)"
cargo run --release --quiet -- train --steps 20 --quiet --out target/ci-train
test -s target/ci-train/summary.json && test -s target/ci-train/loss.png

step "all checks passed"
