#!/usr/bin/env bash
# The one-node scale figures of the book ("Performance: Registrations and heartbeats"): for 100 000 and 1 000 000
# instances, a registration storm through the HTTP API with sequential and with random host
# names (registrations/s, latency, bytes written, WAL, the server's memory per instance),
# then the heartbeat fan-in through a real nats-server and the registry stage alone.
#
#   scripts/bench-scale.sh                  both sizes
#   scripts/bench-scale.sh 100000           one size
#
# Needs nats-server (NATS_SERVER_BIN or PATH). Takes several minutes per size; run it on a
# quiet machine, the figures are wall-clock rates.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

sizes=("$@")
[[ ${#sizes[@]} -eq 0 ]] && sizes=(100000 1000000)
bench() { cargo bench -q -p ccfleet --features server,client --bench "$@"; }

for n in "${sizes[@]}"; do
    echo "=== $n instances (load average: $(cut -d' ' -f1-3 /proc/loadavg))"
    STORM_REGISTRATIONS=$n STORM_NAMES=sequential bench registration_storm
    STORM_REGISTRATIONS=$n STORM_NAMES=random bench registration_storm
    FANIN_INSTANCES=$n FANIN_ROUNDS=3 bench fan_in
done
