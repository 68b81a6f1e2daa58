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
if [ "$(id -u)" = 0 ] && [ -n "${SUDO_USER:-}" ] && [ "$SUDO_USER" != root ] \
    && ! command -v cargo >/dev/null; then
    # `sudo bash scripts/test.sh`: sudo's PATH has no ~/.cargo/bin, and its
    # HOME is root's, where rustup finds no toolchain. Take the invoking
    # user's Rust, and give them back target/ (root-owned files there would
    # fail their next build).
    home=$(getent passwd "$SUDO_USER" | cut -d: -f6)
    if [ -n "$home" ] && [ -x "$home/.cargo/bin/cargo" ]; then
        echo "test: under sudo: using $SUDO_USER's Rust in $home/.cargo" >&2
        export PATH="$home/.cargo/bin:${CARGO_HOME:-$HOME/.cargo}/bin:$PATH"
        export RUSTUP_HOME="${RUSTUP_HOME:-$home/.rustup}"
        owner=$(stat -c %u:%g .)
        trap 'chown -R "$owner" target 2>/dev/null || true' EXIT
    fi
fi
bash scripts/setup.sh --test
cargo nextest run --workspace --all-features "$@"
cargo test --workspace --all-features --doc --quiet
