#!/usr/bin/env bash
# Builds every guest plugin (each cdylib crate of guest/) into WebAssembly components.
#
#   scripts/build-guests.sh [--install] [OUT_DIR]
#
# OUT_DIR defaults to guest/target/components. The work is done by `ccfleet plugin build
# guest`, which finds the plugin crates itself (a new one needs no edit here) and picks the
# toolchain, in order of preference:
#   - rustup's wasm targets (wasm32-unknown-unknown for the no_std plugins, wasm32-wasip2 for
#     the std + WASI ones), as on an ordinary developer machine;
#   - Debian's Rust (rustc-web, with its std sources for -Zbuild-std), lld and wasi-libc.
# When neither is there it says exactly what to install and exits with status 3; nothing is
# installed unless this script is given --install, which runs the apt-get line below.
#
# Set CCFLEET_BIN to use an already built `ccfleet`; otherwise it is built with cargo.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
GUEST="$ROOT/guest"
APT_PACKAGES="rustc-web rust-web-src lld-22 wasi-libc"

usage() {
    echo "usage: $0 [--install] [OUT_DIR]" >&2
    exit 2
}

INSTALL=0
OUT=""
for arg in "$@"; do
    case "$arg" in
        --install) INSTALL=1 ;;
        -h|--help) usage ;;
        -*) echo "unknown option: $arg" >&2; usage ;;
        *) [ -z "$OUT" ] || usage; OUT="$arg" ;;
    esac
done
OUT=${OUT:-$GUEST/target/components}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)

if [ "$INSTALL" = 1 ]; then
    echo "==> apt-get install -y $APT_PACKAGES" >&2
    apt-get update
    # shellcheck disable=SC2086
    apt-get install -y $APT_PACKAGES
fi

# Settings of an outer cargo (e.g. when run from a test) must not leak into these builds.
unset RUSTFLAGS CARGO_ENCODED_RUSTFLAGS RUSTC_WRAPPER RUSTC_WORKSPACE_WRAPPER CARGO_BUILD_TARGET RUSTC RUSTDOC CARGO_TARGET_DIR

CCFLEET=${CCFLEET_BIN:-}
if [ -n "$CCFLEET" ]; then
    CCFLEET=$(cd "$ROOT" && realpath "$CCFLEET")
else
    echo "==> building ccfleet (for \`ccfleet plugin build\`)" >&2
    (cd "$ROOT" && cargo build --quiet -p ccfleet-host --bin ccfleet)
    CCFLEET="$ROOT/target/debug/ccfleet"
fi

# The component paths go to stderr, as the build's progress does.
"$CCFLEET" plugin build "$GUEST" --target-dir "$GUEST/target" --out "$OUT" >&2
