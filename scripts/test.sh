#!/usr/bin/env bash
# The whole test suite: setup, then every test in its own process (nextest),
# then the documentation examples. Extra arguments go to nextest.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" != 0 ]; then
    # Said first, not after minutes of tests: the rest passes, these fail.
    echo "test: not root: the veth, namespace and testbed tests will fail (they make network" \
        "namespaces and veth pairs); run the suite as root for all of it" >&2
fi
# Under sudo: the invoking user's Rust, and target/ given back to them.
source scripts/sudo-rust.sh
bash scripts/setup.sh --test
cargo nextest run --workspace --all-features "$@"
cargo test --workspace --all-features --doc --quiet
