#!/usr/bin/env bash
# Builds the guest plugins (guest/) into WebAssembly components.
#
#   scripts/build-guests.sh [--install] [OUT_DIR]
#
# OUT_DIR defaults to guest/target/components. Toolchains, in order of preference:
#   - rustup's wasm targets (wasm32-unknown-unknown for the no_std plugins, wasm32-wasip2 for
#     the std + WASI ones), as on an ordinary developer machine;
#   - Debian's Rust (rustc-web, with its std sources for -Zbuild-std), lld and wasi-libc.
# When neither is there the script says exactly what to install and stops; it installs
# nothing itself unless given --install, which runs the apt-get line below.
#
# Core modules are turned into components by `ccfleet plugin componentize` (the wit-component
# library inside the host binary); no wasm-tools CLI is needed. Set CCFLEET_BIN to use an
# already built `ccfleet`; otherwise it is built with cargo.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
GUEST="$ROOT/guest"
APT_PACKAGES="rustc-web rust-web-src lld-22 wasi-libc"
NOSTD_PLUGINS=(roster-logger loadavg hello hostile-trap hostile-loop hostile-memory-bomb hostile-oversized-emit hostile-log-flood)
STD_PLUGINS=(hostile-proc-probe)

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

# Settings of an outer cargo (e.g. when run from a test) must not leak into the guest build.
unset RUSTFLAGS CARGO_ENCODED_RUSTFLAGS RUSTC_WRAPPER RUSTC_WORKSPACE_WRAPPER CARGO_BUILD_TARGET RUSTC RUSTDOC
export CARGO_TARGET_DIR="$GUEST/target"

rustup_has() {
    command -v rustup >/dev/null 2>&1 && rustup target list --installed 2>/dev/null | grep -qx "$1"
}

WASM_LD=""
for candidate in wasm-ld-22 wasm-ld-21 wasm-ld-20 wasm-ld-19 wasm-ld-18 wasm-ld; do
    if command -v "$candidate" >/dev/null 2>&1; then
        WASM_LD=$(command -v "$candidate")
        break
    fi
done

debian_ready() {
    [ -x /usr/bin/cargo ] && [ -x /usr/bin/rustc ] && [ -n "$WASM_LD" ] &&
        [ -d "$(/usr/bin/rustc --print sysroot)/lib/rustlib/src/rust/library" ]
}

debian_wasi_ready() {
    debian_ready && [ -f /usr/lib/wasm32-wasi/libc.a ]
}

if rustup_has wasm32-unknown-unknown; then NOSTD=rustup
elif debian_ready; then NOSTD=debian
else NOSTD=""
fi
if rustup_has wasm32-wasip2; then STD=rustup
elif debian_wasi_ready; then STD=debian
else STD=""
fi

if [ -z "$NOSTD" ] || [ -z "$STD" ]; then
    {
        echo "error: no toolchain to build the WebAssembly guest plugins."
        [ -z "$NOSTD" ] && echo "  missing: a wasm32-unknown-unknown toolchain (for the no_std plugins)"
        [ -z "$STD" ] && echo "  missing: a wasm32-wasip2 toolchain, or wasm32-wasip1 with wasi-libc (for the std + WASI plugins)"
        echo "Install one of:"
        echo "  rustup target add wasm32-unknown-unknown wasm32-wasip2"
        echo "  apt-get install -y $APT_PACKAGES      (or run: $0 --install)"
    } >&2
    exit 3
fi

package_args() {
    local p
    for p in "$@"; do printf -- '-p\n%s\n' "$p"; done
}

cd "$GUEST"
mapfile -t NOSTD_ARGS < <(package_args "${NOSTD_PLUGINS[@]}")
mapfile -t STD_ARGS < <(package_args "${STD_PLUGINS[@]}")

echo "==> no_std plugins (wasm32-unknown-unknown, $NOSTD toolchain)" >&2
if [ "$NOSTD" = rustup ]; then
    cargo build --release --target wasm32-unknown-unknown "${NOSTD_ARGS[@]}"
else
    RUSTC=/usr/bin/rustc RUSTDOC=/usr/bin/rustdoc RUSTC_BOOTSTRAP=1 \
    CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_LINKER="$WASM_LD" \
        /usr/bin/cargo build --release --target wasm32-unknown-unknown \
        -Zbuild-std=core,alloc "${NOSTD_ARGS[@]}"
fi

if [ "$STD" = rustup ]; then
    STD_TARGET=wasm32-wasip2
    echo "==> std plugins (wasm32-wasip2, rustup toolchain)" >&2
    cargo build --release --target wasm32-wasip2 "${STD_ARGS[@]}"
else
    STD_TARGET=wasm32-wasip1
    echo "==> std plugins (wasm32-wasip1 + preview 1 adapter, debian toolchain)" >&2
    RUSTC=/usr/bin/rustc RUSTDOC=/usr/bin/rustdoc RUSTC_BOOTSTRAP=1 \
    CARGO_TARGET_WASM32_WASIP1_LINKER="$WASM_LD" \
    CARGO_TARGET_WASM32_WASIP1_RUSTFLAGS="-L /usr/lib/wasm32-wasi -C link-self-contained=no" \
        /usr/bin/cargo build --release --target wasm32-wasip1 \
        -Zbuild-std=std,panic_abort "${STD_ARGS[@]}"
fi

CCFLEET=${CCFLEET_BIN:-}
if [ -n "$CCFLEET" ]; then
    CCFLEET=$(cd "$ROOT" && realpath "$CCFLEET")
else
    echo "==> building ccfleet (for \`ccfleet plugin componentize\`)" >&2
    (cd "$ROOT" && unset CARGO_TARGET_DIR && cargo build --quiet -p ccfleet-host --bin ccfleet)
    CCFLEET="$ROOT/target/debug/ccfleet"
fi

componentize() {
    local plugin=$1 target=$2
    local module="$GUEST/target/$target/release/${plugin//-/_}.wasm"
    "$CCFLEET" plugin componentize "$module" "$OUT/$plugin.wasm"
    echo "    $OUT/$plugin.wasm" >&2
}

echo "==> components" >&2
for plugin in "${NOSTD_PLUGINS[@]}"; do componentize "$plugin" wasm32-unknown-unknown; done
for plugin in "${STD_PLUGINS[@]}"; do componentize "$plugin" "$STD_TARGET"; done
