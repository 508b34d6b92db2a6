#!/usr/bin/env bash
# Measures what the collectors cost on a real node: runs the agent with every collector
# plugin collecting every INTERVAL seconds from the real /proc and /sys, and samples the
# agent's CPU time (/proc/<pid>/stat) and resident memory (/proc/<pid>/status).
#
#   scripts/measure-collectors.sh [DURATION_SECONDS] [INTERVAL_SECONDS]
#
# Defaults: 600 s at a 10 s interval. The agent needs no cc-backend for this: its fleet URL
# points at a closed local port, so it runs the plugins without a service configuration, and
# the points go to stdout, which is discarded. Prints one line per sample (seconds, CPU
# seconds, RSS in KiB) and a summary: the CPU share of one core over the second half of the
# run (steady state: start-up compiles the components, which takes minutes in a debug build)
# and over the whole run, and the largest and last resident size.
#
# Set CCFLEET_BIN to an already built `ccfleet`; otherwise a release build is made. The
# components come from scripts/build-guests.sh (guest/target/components).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DURATION=${1:-600}
INTERVAL=${2:-10}

CCFLEET=${CCFLEET_BIN:-}
if [ -z "$CCFLEET" ]; then
    echo "==> building ccfleet (release)" >&2
    (cd "$ROOT" && cargo build --release --quiet -p ccfleet-host --bin ccfleet)
    CCFLEET="$ROOT/target/release/ccfleet"
fi
CCFLEET=$(realpath "$CCFLEET")
COMPONENTS="$ROOT/guest/target/components"
CCFLEET_BIN="$CCFLEET" bash "$ROOT/scripts/build-guests.sh" "$COMPONENTS" >/dev/null 2>&1

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

plugin() { # name config read-files...
    local name=$1 config=$2
    shift 2
    local grants
    grants=$(printf '"%s",' "$@" /proc/sys/kernel/hostname)
    printf '{"name": "%s", "path": "%s/%s.wasm", "collect-interval": "%ss", "config": %s, "capabilities": {"read-files": [%s]}}' \
        "$name" "$COMPONENTS" "$name" "$INTERVAL" "$config" "${grants%,}"
}

PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
cat >"$WORK/agent.json" <<JSON
{
  "service-type": "ccmc",
  "fleet": {"url": "http://127.0.0.1:$PORT", "cluster": "measure", "hostname": "$(hostname)",
            "cache-path": "fleet-config.json"},
  "metrics": {"type": "stdout"},
  "plugins": [
    $(plugin cpustat '{}' /proc/stat),
    $(plugin memstat '{"numa_stats": true}' /proc/meminfo '/sys/devices/system/node/node*/meminfo'),
    $(plugin loadavg '{}' /proc/loadavg),
    $(plugin netstat '{}' /proc/net/dev),
    $(plugin iostat '{}' /proc/diskstats),
    $(plugin diskstat '{}' /),
    $(plugin numastats '{}' '/sys/devices/system/node/node*/numastat'),
    $(plugin cpufreq '{}' '/sys/devices/system/cpu/cpu*/cpufreq/scaling_cur_freq' '/sys/devices/system/cpu/cpu*/topology/physical_package_id'),
    $(plugin tempstat '{}' '/sys/class/hwmon/**')
  ]
}
JSON

"$CCFLEET" agent --config "$WORK/agent.json" >/dev/null 2>"$WORK/agent.log" &
PID=$!
trap 'kill $PID 2>/dev/null || true; wait $PID 2>/dev/null || true; rm -rf "$WORK"' EXIT

TICK=$(getconf CLK_TCK)
cpu_seconds() { # utime + stime, fields 14 and 15 after the command name
    awk -v tick="$TICK" '{ sub(/^.*\) /, ""); print ($12 + $13) / tick }' "/proc/$PID/stat"
}
rss_kib() { awk '/^VmRSS:/ { print $2 }' "/proc/$PID/status"; }

echo "# seconds cpu_seconds rss_kib"
START=$(date +%s.%N)
BASE_CPU=""
BASE_T=""
MAX_RSS=0
ELAPSED=0
while [ "$(echo "$ELAPSED < $DURATION" | bc)" = 1 ]; do
    sleep "$INTERVAL"
    kill -0 "$PID" 2>/dev/null || { echo "the agent exited; its log:" >&2; cat "$WORK/agent.log" >&2; exit 1; }
    NOW=$(date +%s.%N)
    ELAPSED=$(echo "$NOW - $START" | bc)
    CPU=$(cpu_seconds)
    RSS=$(rss_kib)
    [ "$RSS" -gt "$MAX_RSS" ] && MAX_RSS=$RSS
    if [ -z "$BASE_CPU" ] && [ "$(echo "$ELAPSED * 2 >= $DURATION" | bc)" = 1 ]; then
        BASE_CPU=$CPU
        BASE_T=$ELAPSED
    fi
    printf '%.1f %s %s\n' "$ELAPSED" "$CPU" "$RSS"
done
WARNINGS=$(grep -c -E "WARN|ERROR" "$WORK/agent.log" || true)
awk -v cpu="$CPU" -v base="$BASE_CPU" -v t="$ELAPSED" -v t0="$BASE_T" -v rss="$RSS" -v max="$MAX_RSS" -v dur="$DURATION" -v iv="$INTERVAL" 'BEGIN {
    printf "# %d s, every collector at %d s: CPU %.4f%% of one core over the second half, %.4f%% including start-up; RSS max %.1f MiB, last %.1f MiB\n",
        dur, iv, 100 * (cpu - base) / (t - t0), 100 * cpu / t, max / 1024, rss / 1024 }'
echo "# agent log: $WARNINGS warning or error lines; the last three:"
grep -E "WARN|ERROR" "$WORK/agent.log" | tail -3 | sed "s/^/#   /"
