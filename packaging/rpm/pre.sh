# The `ccfleet` system account the units run as (the account of
# /usr/lib/sysusers.d/ccfleet.conf, made before the files are in place).
getent group ccfleet >/dev/null || groupadd --system ccfleet
getent passwd ccfleet >/dev/null || useradd --system --gid ccfleet --home-dir /nonexistent \
    --no-create-home --shell /sbin/nologin --comment "ccfleet agent and fleet server" ccfleet
exit 0
