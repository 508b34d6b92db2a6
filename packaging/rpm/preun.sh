# Erasure (not upgrade): the services stop and are disabled before their files go.
if [ "$1" -eq 0 ]; then
    systemctl --no-reload disable --now ccfleet-agent.service ccfleet-server.service \
        >/dev/null 2>&1 || :
fi
exit 0
