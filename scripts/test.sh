#!/usr/bin/env bash
# The test command of the README: every check CI runs, from a fresh machine.
# Usage: scripts/test.sh
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n==> %s\n' "$*"; }

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy --all-targets -- -D warnings"
cargo clippy --release --all-targets -- -D warnings

step "cargo test --release (unit, integration, doc tests; exhaustive format tests included)"
cargo test --release

step "all checks passed"
