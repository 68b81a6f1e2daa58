# Sourced by the scripts that build (test.sh, bench.sh, .ci/run): run under
# `sudo`, they take the invoking user's Rust, and give target/ back to its
# owner at exit. sudo's PATH has no ~/.cargo/bin and its HOME is root's,
# where rustup finds no toolchain; and a cargo that root has from the
# distribution (Debian 12's is 1.63) is older than emx needs, so the user's
# rustup toolchain is taken whenever there is one, not only when root has no
# cargo. Root-owned files left in target/ would fail the user's next build.
# Sets an EXIT trap: source it before any trap of the script's own.
if [ "$(id -u)" = 0 ] && [ -n "${SUDO_USER:-}" ] && [ "$SUDO_USER" != root ]; then
    emx_sudo_home=$(getent passwd "$SUDO_USER" | cut -d: -f6)
    if [ -n "$emx_sudo_home" ] && [ -x "$emx_sudo_home/.cargo/bin/cargo" ]; then
        case ":$PATH:" in
            *":$emx_sudo_home/.cargo/bin:"*) ;;
            *)
                echo "$(basename "$0"): under sudo: using $SUDO_USER's Rust in $emx_sudo_home/.cargo" >&2
                # (root's own cargo home after it, for what setup installs.)
                export PATH="$emx_sudo_home/.cargo/bin:${CARGO_HOME:-$HOME/.cargo}/bin:$PATH"
                export RUSTUP_HOME="${RUSTUP_HOME:-$emx_sudo_home/.rustup}"
                ;;
        esac
        emx_sudo_owner=$(stat -c %u:%g .)
        trap 'chown -R "$emx_sudo_owner" target 2>/dev/null || true' EXIT
    fi
fi
