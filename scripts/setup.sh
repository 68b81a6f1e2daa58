#!/usr/bin/env bash
# Installs what emx needs to build, test and benchmark on Debian or Ubuntu, and
# reserves hugepages when it can (nothing requires them). Idempotent: silent
# when everything is already there. Needs root for apt-get and hugepages (it
# uses sudo when it is not root and sudo exists).
#
#   setup.sh          what the benchmark needs
#   setup.sh --test   that, and cargo-nextest, the test runner
set -euo pipefail
TEST=0
[ "${1:-}" = --test ] && TEST=1

# Debian packages: DPDK 22.11+ and its drivers (memif, af_packet, tap, ring, ...),
# what bindgen and the C shim need, iproute2 for the namespace tests and testbed.
PACKAGES=(libdpdk-dev dpdk pkg-config clang libclang-dev gcc libc6-dev iproute2 procps)
HUGEPAGES=${EMX_HUGEPAGES:-512}   # 2 MiB pages to reserve; 0 to skip
# At most an eighth of the memory (512 pages pin 1 GiB until reboot).
if [ -z "${EMX_HUGEPAGES:-}" ] && [ -r /proc/meminfo ]; then
  eighth=$(awk '/^MemTotal:/ {print int($2 / 2048 / 8)}' /proc/meminfo)
  [ "${eighth:-0}" -lt "$HUGEPAGES" ] && HUGEPAGES=$eighth
fi

say() { printf 'setup: %s\n' "$*" >&2; }

as_root() {
  if [ "$(id -u)" = 0 ]; then "$@"
  elif command -v sudo >/dev/null; then sudo "$@"
  else return 1; fi
}
# For the best-effort steps: never asks for a password (a kernel that cannot
# reserve every hugepage would otherwise prompt on every run).
as_root_quietly() {
  if [ "$(id -u)" = 0 ]; then "$@"
  elif command -v sudo >/dev/null; then sudo -n "$@"
  else return 1; fi
}

# A DPDK that pkg-config already finds (built from source into /usr/local,
# say) is used as it is: installing the distribution's beside it would leave
# which one links to pkg-config's search order.
if pkg-config --atleast-version=22.11 libdpdk 2>/dev/null; then
  wanted=()
  for p in "${PACKAGES[@]}"; do
    case $p in libdpdk-dev|dpdk) ;; *) wanted+=("$p") ;; esac
  done
  PACKAGES=("${wanted[@]}")
fi
missing=()
if command -v dpkg-query >/dev/null; then
  for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
else
  # Not Debian or Ubuntu: what the build and the tests use, however it was
  # installed (the DPDK check below says what it found).
  for c in pkg-config clang cc ip; do
    command -v "$c" >/dev/null || missing+=("$c")
  done
fi
if [ ${#missing[@]} -gt 0 ]; then
  if ! command -v apt-get >/dev/null; then
    say "missing ${missing[*]}, and this is not a Debian/Ubuntu system: install DPDK >= 22.11 (pkg-config libdpdk), clang, libclang and iproute2 by hand"
    exit 1
  fi
  say "installing ${missing[*]}"
  # (through sudo too, which would drop an exported variable)
  # On a fresh VM another apt (unattended-upgrades, apt-daily) often holds
  # the locks for minutes: dpkg's is waited for (the timeout), the package
  # lists' with a few tries; any other failure is said as apt said it.
  apt=(env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600)
  # A dpkg run cut short earlier would fail every install until configured.
  as_root env DEBIAN_FRONTEND=noninteractive dpkg --configure -a >/dev/null 2>&1 || true
  for try in 1 2 3 4 5 6 7 8 9 10; do
    err=$(as_root "${apt[@]}" update -qq 2>&1 >/dev/null) && break
    case $err in
      *lock*) [ "$try" = 10 ] || { say "apt's package lists are locked by another apt: waiting"; sleep 30; continue; } ;;
    esac
    say "apt-get update failed (run as root?): $err"
    exit 1
  done
  as_root "${apt[@]}" install -y -qq --no-install-recommends "${missing[@]}" >/dev/null \
    || { say "apt-get install ${missing[*]} failed"; exit 1; }
fi

if ! pkg-config --atleast-version=22.11 libdpdk 2>/dev/null; then
  say "pkg-config finds no DPDK >= 22.11 (found: $(pkg-config --modversion libdpdk 2>/dev/null || echo none))"
  exit 1
fi

if ! command -v cargo >/dev/null; then
  say "cargo not found: install Rust (https://rustup.rs) and run this again${SUDO_USER:+ (under sudo, scripts/test.sh and bench.sh take a Rust in ~$SUDO_USER/.cargo; for the others, keep your PATH: sudo env PATH=\$PATH ...)}"
  exit 1
fi
# The workspace's rust-version: an older Rust (Debian's own cargo is 1.63)
# would fail later with an error that names neither.
need=$(sed -n 's/^rust-version *= *"\(.*\)"/\1/p' "$(dirname "$0")/../Cargo.toml" | head -n 1)
have=$(rustc --version 2>/dev/null | awk '{print $2}')
if [ -n "$need" ] && ! printf '%s\n%s\n' "$need" "${have:-0}" | sort -V -C; then
  say "Rust ${have:-?} is older than the $need emx needs: install a current one (https://rustup.rs, or rustup update)${SUDO_USER:+; under sudo this is the Rust of root: keep your PATH to use yours, sudo env PATH=\$PATH ...}"
  exit 1
fi
if [ "$TEST" = 1 ] && ! cargo nextest --version >/dev/null 2>&1; then
  say "installing cargo-nextest (the test runner: one process per test, as DPDK needs)"
  # Its newest needs a newer Rust than emx does (1.91 in 2026-11): on an
  # older one, the last release that builds there (the crate's rust-version
  # history).
  nextest=
  for step in 1.91: 1.89:0.9.128 1.88:0.9.114 1.87:0.9.109 1.86:0.9.106 \
              1.85:0.9.100 1.81:0.9.96; do
    if printf '%s\n%s\n' "${step%%:*}" "${have:-0}" | sort -V -C; then
      nextest=${step#*:}
      break
    fi
  done
  cargo install --locked --quiet cargo-nextest ${nextest:+--version "$nextest"}
fi

# Hugepages: best effort. Without them everything runs with --no-huge.
nr=/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages
if [ "$HUGEPAGES" -gt 0 ] && [ -e "$nr" ]; then
  if [ "$(cat "$nr")" -lt "$HUGEPAGES" ]; then
    echo "$HUGEPAGES" | as_root_quietly tee "$nr" >/dev/null 2>&1 || true
    [ "$(cat "$nr")" -ge "$HUGEPAGES" ] \
      || say "reserved $(cat "$nr") of $HUGEPAGES hugepages; emx runs without them (--no-huge) where short (EMX_HUGEPAGES=0 skips this)"
  fi
  if ! grep -q ' hugetlbfs ' /proc/mounts; then
    { as_root_quietly mkdir -p /dev/hugepages && as_root_quietly mount -t hugetlbfs nodev /dev/hugepages; } >/dev/null 2>&1 \
      || say "could not mount hugetlbfs on /dev/hugepages; emx runs without hugepages (--no-huge; EMX_HUGEPAGES=0 skips this)"
  fi
fi
exit 0
