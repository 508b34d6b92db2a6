#!/usr/bin/env bash
# Builds the .deb and .rpm with scripts/package.sh and checks them on this Debian machine
# (as root: the .deb is installed with dpkg and purged at the end).
#
#   scripts/test-packages.sh                  packages the dist build (slow to build)
#   scripts/test-packages.sh --binary PATH [--plugins DIR]
#                                             packages an already built `ccfleet` and plugins
#                                             (scripts/test.sh passes the ones its tests use)
#
# The .deb: installed, the `ccfleet` system user exists, `ccfleet --version` runs, the
# packaged example configurations pass `agent --check-config` and `server --check-config`
# run as that user, the installed units pass `systemd-analyze verify`, the agent's unit is
# enabled and the server's is not, an edited configuration file survives a reinstall, so
# does a disabled agent, and a purge removes the files. The .rpm: its files are those of the
# .deb, those under /etc marked %config, its scriptlets create the user and enable the agent,
# and its payload unpacks into a scratch root where the binary runs.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

package_args=()
while (($#)); do
    case "$1" in
        --binary|--plugins) [[ $# -ge 2 ]] || { echo "$1 needs a value" >&2; exit 2; }
            package_args+=("$1" "$2"); shift 2 ;;
        *) echo "usage: $0 [--binary PATH [--plugins DIR]]" >&2; exit 2 ;;
    esac
done

fail() { echo "package test: $*" >&2; exit 1; }
say() { printf '==> %s\n' "$*" >&2; }

[[ $(id -u) -eq 0 ]] || fail "must run as root (it installs and purges the .deb)"
for tool in dpkg rpm rpm2archive systemd-analyze runuser; do
    command -v "$tool" >/dev/null || fail "$tool is missing: scripts/test.sh installs it (apt)"
done
if dpkg-query -W -f='${Status}' ccfleet 2>/dev/null | grep -q "ok installed"; then
    fail "the ccfleet package is installed on this machine; this test would purge it: remove it first (dpkg --purge ccfleet)"
fi
# A `ccfleet` account left by an earlier run (purges keep it) would hide a package that no
# longer creates it.
if getent passwd ccfleet >/dev/null; then userdel ccfleet; fi
if getent group ccfleet >/dev/null; then groupdel ccfleet; fi

out=$(mktemp -d)
scratch=$(mktemp -d)
# The machine is left as it was found: what a purge keeps by design (the account, the
# services' state) goes too.
cleanup() {
    dpkg --purge ccfleet >/dev/null 2>&1 || true
    if getent passwd ccfleet >/dev/null; then userdel ccfleet; fi
    if getent group ccfleet >/dev/null; then groupdel ccfleet; fi
    rm -rf "$out" "$scratch" /var/lib/ccfleet-agent /var/lib/ccfleet-server
}
trap cleanup EXIT

scripts/package.sh "${package_args[@]}" --out "$out"
deb=$(echo "$out"/ccfleet_*.deb)
rpmfile=$(echo "$out"/ccfleet-*.rpm)
[[ -f $deb ]] || fail "no .deb in $out"
[[ -f $rpmfile ]] || fail "no .rpm in $out"

# The collector plugins the packages must hold, named as package.sh selects them.
expected_plugins=()
for manifest in guest/plugins/*/Cargo.toml; do
    grep -q '^description = "Collector plugin:' "$manifest" || continue
    expected_plugins+=("$(sed -n 's/^name = "\(.*\)"$/\1/p' "$manifest" | head -n 1).wasm")
done
((${#expected_plugins[@]} >= 20)) || fail "only ${#expected_plugins[@]} collector plugins found under guest/plugins"

say "installing $(basename "$deb")"
dpkg -i "$deb"

say "the installed package"
version=$(/usr/bin/ccfleet --version)
[[ $version == "ccfleet "* ]] || fail "ccfleet --version printed: $version"
echo "$version"
account=$(getent passwd ccfleet) || fail "no ccfleet user after the installation"
uid=$(echo "$account" | cut -d: -f3)
((uid < 1000)) || fail "the ccfleet user is not a system user (uid $uid)"
[[ $account == *:/usr/sbin/nologin ]] || fail "the ccfleet user has a login shell: $account"
for plugin in "${expected_plugins[@]}"; do
    [[ -f /usr/lib/ccfleet/plugins/$plugin ]] || fail "/usr/lib/ccfleet/plugins/$plugin is missing"
done
installed_plugins=$(find /usr/lib/ccfleet/plugins -name '*.wasm' | wc -l)
((installed_plugins == ${#expected_plugins[@]})) ||
    fail "$installed_plugins plugins installed, ${#expected_plugins[@]} expected (test plugins must stay out)"
for file in /usr/share/man/man1/ccfleet.1.gz /usr/share/man/man1/ccfleet-agent.1.gz \
    /usr/share/man/man1/ccfleet-server.1.gz /usr/share/bash-completion/completions/ccfleet \
    /usr/share/zsh/vendor-completions/_ccfleet /usr/share/fish/vendor_completions.d/ccfleet.fish \
    /usr/lib/sysusers.d/ccfleet.conf; do
    [[ -s $file ]] || fail "$file is missing or empty"
done
zcat /usr/share/man/man1/ccfleet-agent.1.gz | grep -q '^\.SH CONFIGURATION' ||
    fail "ccfleet-agent(1) has no CONFIGURATION section"
grep -q 'complete -F' /usr/share/bash-completion/completions/ccfleet ||
    fail "the bash completion is not a completion script"
[[ $(stat -c %a /etc/ccfleet/server.env) == 600 ]] || fail "/etc/ccfleet/server.env is not mode 0600"
[[ $(stat -c %a:%U /etc/ccfleet/credentials) == 700:root ]] || fail "/etc/ccfleet/credentials is not root's, mode 0700"
for dir in /var/lib/ccfleet-agent /var/lib/ccfleet-server /var/cache/ccfleet-agent; do
    [[ $(stat -c %U "$dir") == ccfleet ]] || fail "$dir does not belong to ccfleet"
done
conffiles=$(dpkg-query -W -f='${Conffiles}\n' ccfleet)
for conf in agent.json server.json server.env config-tree/defaults.json config-tree/ccmc/fritz/node01.json; do
    grep -q " /etc/ccfleet/$conf " <<<"$conffiles" || fail "/etc/ccfleet/$conf is not a conffile"
done

say "the packaged example configurations, checked as the ccfleet user"
grep -q '"/usr/lib/ccfleet/plugins/loadavg.wasm"' /etc/ccfleet/agent.json ||
    fail "the packaged agent.json does not name the packaged plugins"
if grep -q 'fleet-ceiling' /etc/ccfleet/agent.json; then
    fail "the packaged agent.json widens the fleet-ceiling"
fi
report=$(cd / && runuser -u ccfleet -- /usr/bin/ccfleet agent --check-config --config /etc/ccfleet/agent.json) ||
    fail "agent --check-config failed: $report"
echo "$report"
grep -q 'plugin loadavg: /usr/lib/ccfleet/plugins/loadavg.wasm compiles' <<<"$report" ||
    fail "agent --check-config did not compile the packaged plugin"
/usr/bin/ccfleet keygen --out "$scratch/keys.env" >/dev/null
public_key=$(sed -n 's/^JWT_PUBLIC_KEY=//p' "$scratch/keys.env")
[[ -n $public_key ]] || fail "ccfleet keygen wrote no JWT_PUBLIC_KEY"
report=$(cd / && runuser -u ccfleet -- env JWT_PUBLIC_KEY="$public_key" \
    /usr/bin/ccfleet server --check-config --config /etc/ccfleet/server.json) ||
    fail "server --check-config failed: $report"
echo "$report"
# Without a key (the packaged server.env holds none) the server must not start.
if (cd / && runuser -u ccfleet -- env -u JWT_PUBLIC_KEY /usr/bin/ccfleet server --check-config \
    --config /etc/ccfleet/server.json >/dev/null); then
    fail "server --check-config passed without a JWT public key"
fi

say "the installed units"
for unit in ccfleet-agent ccfleet-server; do
    file=/usr/lib/systemd/system/$unit.service
    grep -q '^User=ccfleet$' "$file" || fail "$file does not run as ccfleet"
    if grep -q 'DynamicUser\|/usr/local/' "$file"; then fail "$file: DynamicUser or /usr/local left"; fi
    grep -q "^ExecStart=/usr/bin/ccfleet ${unit#ccfleet-} --config /etc/ccfleet/${unit#ccfleet-}.json$" "$file" ||
        fail "$file does not start the packaged binary with the packaged configuration"
done
verify=$(systemd-analyze verify /usr/lib/systemd/system/ccfleet-agent.service \
    /usr/lib/systemd/system/ccfleet-server.service 2>&1) || fail "systemd-analyze verify: $verify"
[[ -z $verify ]] || fail "systemd-analyze verify: $verify"
wants=/etc/systemd/system/multi-user.target.wants
[[ -L $wants/ccfleet-agent.service ]] || fail "ccfleet-agent.service is not enabled"
[[ ! -e $wants/ccfleet-server.service ]] || fail "ccfleet-server.service is enabled"

say "a reinstall keeps an edited configuration and a disabled agent"
printf '\n' >>/etc/ccfleet/agent.json
edited=$(sha256sum </etc/ccfleet/agent.json)
systemctl disable ccfleet-agent.service
dpkg -i "$deb"
[[ $(sha256sum </etc/ccfleet/agent.json) == "$edited" ]] || fail "the reinstall replaced the edited agent.json"
[[ ! -e $wants/ccfleet-agent.service ]] || fail "the reinstall enabled the disabled agent again"

say "purging"
dpkg --purge ccfleet
for gone in /usr/bin/ccfleet /etc/ccfleet/agent.json /usr/lib/systemd/system/ccfleet-agent.service \
    /usr/lib/ccfleet/plugins/loadavg.wasm /var/cache/ccfleet-agent; do
    [[ ! -e $gone ]] || fail "$gone is still there after the purge"
done
getent passwd ccfleet >/dev/null || fail "the purge removed the ccfleet user (its files may remain)"
[[ -d /var/lib/ccfleet-server ]] || fail "the purge removed the server's state"

say "the .rpm: $(basename "$rpmfile")"
rpm_files=$(rpm -qpl "$rpmfile")
# The same files, but for zsh's completion directory, which the distributions name
# differently, and the copyright file that only Debian's policy asks for.
deb_files=$(dpkg-deb -c "$deb" | awk '$1 !~ /^d/ {p = $6; sub(/^\.?\/?/, "/", p); print p}' |
    grep -vx /usr/share/doc/ccfleet/copyright)
differ=$(diff <(sed 's|/zsh/vendor-completions/|/zsh/site-functions/|' <<<"$deb_files" | sort) \
    <(sort <<<"$rpm_files")) || fail "the .rpm and the .deb hold different files:
$differ"
flags=$(rpm -qp --qf '[%{FILEFLAGS:fflags} %{FILEMODES:perms} %{FILENAMES}\n]' "$rpmfile")
for conf in agent.json server.json server.env config-tree/defaults.json config-tree/ccmc/fritz/node01.json; do
    grep -q "^c .* /etc/ccfleet/$conf$" <<<"$flags" || fail "/etc/ccfleet/$conf is not %config: $(grep "/etc/ccfleet/$conf$" <<<"$flags")"
done
grep -q '^c -rw------- /etc/ccfleet/server.env$' <<<"$flags" || fail "server.env is not mode 0600 in the .rpm"
if grep -v '^c ' <<<"$flags" | grep -q ' /etc/'; then
    fail "a file under /etc is not %config"
fi
scripts=$(rpm -qp --scripts "$rpmfile")
echo "$scripts" | grep -q '^preinstall scriptlet' || fail "the .rpm has no %pre scriptlet"
grep -q 'useradd --system' <<<"$scripts" || fail "the .rpm's scriptlets create no system user"
grep -q 'systemctl --no-reload enable ccfleet-agent.service' <<<"$scripts" || fail "the .rpm does not enable the agent"
if grep -q 'enable ccfleet-server' <<<"$scripts"; then fail "the .rpm enables the server"; fi
grep -q 'disable --now ccfleet-agent.service ccfleet-server.service' <<<"$scripts" ||
    fail "the .rpm does not stop its services on erasure"
for script in packaging/rpm/*.sh packaging/debian/*; do
    sh -n "$script" || fail "$script is not valid sh"
done
# rpm2archive, not rpm2cpio: Debian's rpm2cpio exits 1 on this payload after writing all of it.
(cd "$scratch" && mkdir rpmroot && cd rpmroot && rpm2archive - <"$rpmfile" | tar -xz)
[[ $("$scratch/rpmroot/usr/bin/ccfleet" --version) == "$version" ]] ||
    fail "the .rpm's binary is not the .deb's version"

say "packages ok"
