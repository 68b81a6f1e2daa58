#!/usr/bin/env bash
# The main job: setup, then the benchmark on the built-in default link (a
# memif pair in one process: no NIC, no hugepages needed). Extra arguments go
# to emx-bench (see `emx-bench --help`).
set -euo pipefail
cd "$(dirname "$0")/.."
# Under sudo: the invoking user's Rust, and target/ given back to them.
source scripts/sudo-rust.sh
bash scripts/setup.sh
# (The build is quiet: say why the first run waits.)
[ -x "${CARGO_TARGET_DIR:-target}/release/emx-bench" ] \
    || echo "bench: building emx-bench (release; a few minutes the first time)" >&2
cargo run --release --quiet -p emx-bench -- "$@"
