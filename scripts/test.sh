#!/usr/bin/env bash
# The whole test suite: installs dependencies, checks formatting and lints, builds, and runs
# every test (unit tests, and integration tests against real mariadbd processes started by
# the lab on loopback ports). This is exactly what CI runs.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/deps.sh
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked -- -D warnings
cargo build --workspace --all-targets --locked
if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --workspace --locked --no-fail-fast --test-threads 4
else
  cargo test --workspace --locked --no-fail-fast
fi
