# systemd creates these at each start (StateDirectory=, CacheDirectory=); made here too so
# that `--check-config` run by hand sees the directories the examples name.
for dir in /var/lib/ccfleet-agent /var/lib/ccfleet-server /var/cache/ccfleet-agent; do
    [ -d "$dir" ] || install -d -o ccfleet -g ccfleet -m 0700 "$dir"
done
# Where the units' LoadCredential= reads the token and passwords: root's alone.
[ -d /etc/ccfleet/credentials ] || install -d -m 0700 /etc/ccfleet/credentials
# First installation: the agent, which most hosts of a fleet run, is enabled (not started: it
# needs a fleet address and credentials first); the server is enabled by hand on its host.
# Upgrades leave an administrator's choice alone.
if [ "$1" -eq 1 ]; then
    systemctl --no-reload enable ccfleet-agent.service >/dev/null 2>&1 || :
fi
if [ -d /run/systemd/system ]; then
    systemctl daemon-reload >/dev/null 2>&1 || :
fi
exit 0
