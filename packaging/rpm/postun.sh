# systemd forgets removed units and sees changed ones; a running agent keeps the old binary
# until it is restarted. On erasure the compiled-plugin cache goes; the `ccfleet` account
# and the services' state (/var/lib/ccfleet-*, the server's registry) are kept.
if [ -d /run/systemd/system ]; then
    systemctl daemon-reload >/dev/null 2>&1 || :
fi
if [ "$1" -eq 0 ]; then
    rm -rf /var/cache/ccfleet-agent
fi
exit 0
