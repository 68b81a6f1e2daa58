#!/usr/bin/env bash
# The benchmark built with profile-guided optimization (PGO): an instrumented
# emx-bench runs a short training sweep of emx's own transports on the memif
# pair, and a second build lays out and inlines the code by that profile.
# Extra arguments go to the optimized emx-bench, as with scripts/bench.sh.
#
# Needs llvm-profdata of rustc's own LLVM version: rustup's llvm-tools
# component (tried first, and added when rustup can fetch it), or
# llvm-profdata-N from the distribution's llvm-N package. The first run
# takes two release builds more than scripts/bench.sh (a few minutes); later
# runs train again only when the code changed.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh

say() { echo "bench-pgo: $*" >&2; }

llvm_major=$(rustc -vV | sed -n 's/^LLVM version: \([0-9]*\).*/\1/p')
host=$(rustc -vV | sed -n 's/^host: //p')
if [ -z "$llvm_major" ] || [ -z "$host" ]; then
    say "cannot read rustc's LLVM version or host from 'rustc -vV'"
    exit 1
fi
rustup_tool="$(rustc --print sysroot)/lib/rustlib/$host/bin/llvm-profdata"
rustup_said=""
if [ ! -x "$rustup_tool" ] && command -v rustup >/dev/null; then
    say "adding rustup's llvm-tools component (for llvm-profdata)"
    # (What rustup said is kept for the message below, should it fail.)
    rustup_said=$(rustup component add llvm-tools 2>&1) || true
fi
profdata=""
for p in "$rustup_tool" "llvm-profdata-$llvm_major" llvm-profdata; do
    if command -v "$p" >/dev/null &&
        "$p" --version 2>/dev/null | grep -q "LLVM version $llvm_major\."; then
        profdata=$p
        break
    fi
done
if [ -z "$profdata" ]; then
    say "no llvm-profdata of LLVM $llvm_major (rustc's): run 'rustup component add llvm-tools'" \
        "(it needs the network)${rustup_said:+; it said: $rustup_said}"
    # A distribution's LLVM may lag rustc's: name its package only if there is one.
    if command -v apt-cache >/dev/null &&
        apt-cache policy "llvm-$llvm_major" 2>/dev/null | grep -q 'Candidate: [0-9]'; then
        say "or install the llvm-$llvm_major package (its llvm-profdata-$llvm_major)"
    fi
    exit 1
fi

# Separate target directories: the flags differ from a plain release build's,
# and each build stays cached beside it.
gen=target/pgo-gen
use=target/pgo
mkdir -p "$use"

# Runs cargo with the caller's rustc flags and one more: in cargo's encoded
# list (flags split by 0x1f), where a profile path with a space in it stays
# one flag (RUSTFLAGS is split at spaces).
with_flag() {
    local flag=$1 list
    shift
    if [ -n "${CARGO_ENCODED_RUSTFLAGS+set}" ]; then
        # Set, even empty, it is what cargo takes over RUSTFLAGS.
        list="${CARGO_ENCODED_RUSTFLAGS:+$CARGO_ENCODED_RUSTFLAGS$'\x1f'}"
    else
        local -a words=()
        read -ra words <<<"${RUSTFLAGS:-}"
        list=""
        # (An empty array is "unbound" to set -u before bash 4.4.)
        for w in ${words[@]+"${words[@]}"}; do list+="$w"$'\x1f'; done
    fi
    CARGO_ENCODED_RUSTFLAGS="$list$flag" RUSTFLAGS= "$@"
}

say "instrumented build ($gen)"
with_flag "-Cprofile-generate=$PWD/$gen/profiles" \
    cargo build --release --quiet -p emx-bench --target-dir "$gen"

# One profile per instrumented binary: a changed binary trains again, and the
# profile's path (in the flags) tells cargo to build the optimized one again.
stamp=$(sha256sum "$gen/release/emx-bench" | cut -c1-16)
profile="$PWD/$use/emx-bench-$stamp.profdata"
if [ ! -s "$profile" ]; then
    say "training run (emx and emx-thread on the memif pair)"
    rm -rf "$gen/profiles"
    train() { "$gen/release/emx-bench" --transports emx,emx-thread --rounds 1 --time-ms 100 \
        --warmup-ms 5 --quiet "$@" >/dev/null; }
    train --test latency --sizes 0,8,64,1K,4K,64K,1M
    train --test bandwidth,bibw --sizes 64,4K,64K,1M
    train --test msgrate --sizes 8,64
    rm -f "$use"/emx-bench-*.profdata
    "$profdata" merge -o "$profile" "$gen/profiles"
fi
say "optimized build ($use)"
with_flag "-Cprofile-use=$profile" \
    cargo build --release --quiet -p emx-bench --target-dir "$use"
exec "$use/release/emx-bench" "$@"
