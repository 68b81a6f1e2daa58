#!/usr/bin/env bash
# The whole test suite: setup, then every test in its own process (nextest),
# then the documentation examples. Extra arguments go to nextest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --test
cargo nextest run --workspace --all-features "$@"
cargo test --workspace --all-features --doc --quiet
