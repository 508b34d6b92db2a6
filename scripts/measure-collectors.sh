#!/usr/bin/env bash
# Measures what the collectors cost on a real node: runs the agent with every collector
# plugin collecting every INTERVAL seconds from the real /proc and /sys, and samples the
# agent's CPU time (utime + stime, /proc/<pid>/stat) and memory (/proc/<pid>/status and
# smaps_rollup) from outside, once a second.
#
#   scripts/measure-collectors.sh [DURATION_SECONDS] [INTERVAL_SECONDS]
#
# Defaults: 600 s at a 10 s interval. The agent needs no cc-backend for this: its fleet URL
# points at a closed local port, so it runs the plugins without a service configuration, and
# the points go to stdout, which is discarded. A first start of the agent, stopped when it
# has compiled the components into a compile cache of the run's own, comes before the
# measured one, which so starts warm, as the agent does on a node after its first start.
#
# With CC_METRIC_COLLECTOR set to a built ClusterCockpit cc-metric-collector binary (the book,
# "Node cost beside cc-metric-collector", says how to build one), that program runs beside
# the agent, started at the same moment, with the same nine collectors at the same interval
# and a stdout sink (discarded too), and is measured the same way.
#
# Prints one line per collect interval and process (seconds, CPU seconds, RSS in KiB) and a
# summary per process:
# - CPU per collect round in ms over the second half of the run (steady state) and its share
#   of one core, and the CPU taken in the first two seconds (start-up and the first one or
#   two rounds), in clock ticks and, to the nanosecond, as the threads alive then count it;
# - the peak resident memory (VmHWM) and, at the end, the resident memory split into
#   anonymous memory (with its transparent huge pages), file pages and shared memory;
# - for the agent, the resident memory at the end by kind of mapping (smaps): the binary,
#   the compiled components (mapped from the compile cache), other files, JIT code
#   (anonymous executable), linear memories (anonymous mappings of 1 GiB or more reserve
#   whole wasm memories with their guards), the memory images of components (memfd), thread
#   stacks and the rest of the anonymous memory (the heap).
#
# CONFIG=fritz runs NHR@FAU's `fritz` configuration (host/tests/fixtures/ccmc-fau/fritz) instead
# of the nine: its collectors.json and router.json given to cc-metric-collector with a stdout
# sink, and to the agent as `ccfleet agent import-ccmc` converts them, each collector at
# INTERVAL. Left out: the collectors FRITZ_LEAVE_OUT names (by default those cc-metric-
# collector cannot run on a machine without a PMU, InfiniBand, Lustre, `nfsstat` and hwmon:
# likwid ibstat lustrestat nfs4stat tempstat) and the router's `normalize_metrics`, a key of
# NHR@FAU's own build that cc-metric-collector's sources refuse; `netstat` gets this
# machine's devices but `lo` in place of fritz's.
#
# PAGE_CACHE=cold (the default) drops both programs' binaries and the compiled components
# from the page cache before the measured start, as after a node's reboot; PAGE_CACHE=warm
# leaves them as they are (a binary just built or copied is then cached in large folios,
# which makes each page fault map more of it).
#
# Set CCFLEET_BIN to an already built `ccfleet`; otherwise one is built with the `dist`
# profile, as nodes run it. The components come from scripts/build-guests.sh
# (guest/target/components), or from the directory CCFLEET_COMPONENTS names. CPU times count
# clock ticks (usually 10 ms): a longer run resolves a round's cost more finely.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DURATION=${1:-600}
INTERVAL=${2:-10}
PAGE_CACHE=${PAGE_CACHE:-cold}
CONFIG=${CONFIG:-nine}
FRITZ_LEAVE_OUT=${FRITZ_LEAVE_OUT:-likwid ibstat lustrestat nfs4stat tempstat}
case "$CONFIG" in
    nine|fritz) ;;
    *) echo "CONFIG must be nine or fritz, not $CONFIG" >&2; exit 2 ;;
esac

CCFLEET=${CCFLEET_BIN:-}
if [ -z "$CCFLEET" ]; then
    echo "==> building ccfleet (profile dist, as nodes run it)" >&2
    (cd "$ROOT" && cargo build --profile dist --quiet -p ccfleet-host --bin ccfleet)
    CCFLEET="$ROOT/target/dist/ccfleet"
fi
CCFLEET=$(realpath "$CCFLEET")
PEER=${CC_METRIC_COLLECTOR:-}
[ -z "$PEER" ] || PEER=$(realpath "$PEER")
COMPONENTS=${CCFLEET_COMPONENTS:-}
if [ -z "$COMPONENTS" ]; then
    COMPONENTS="$ROOT/guest/target/components"
    CCFLEET_BIN="$CCFLEET" bash "$ROOT/scripts/build-guests.sh" "$COMPONENTS" >/dev/null 2>&1
fi
COMPONENTS=$(realpath "$COMPONENTS")

WORK=$(mktemp -d)
PID=""
GPID=""
cleanup() {
    for p in $PID $GPID; do
        kill "$p" 2>/dev/null || true
        wait "$p" 2>/dev/null || true
    done
    rm -rf "$WORK"
}
trap cleanup EXIT

plugin() { # name config read-files...
    local name=$1 config=$2
    shift 2
    local grants
    grants=$(printf '"%s",' "$@" /proc/sys/kernel/hostname)
    printf '{"name": "%s", "path": "%s/%s.wasm", "collect-interval": "%ss", "config": %s, "capabilities": {"read-files": [%s]}}' \
        "$name" "$COMPONENTS" "$name" "$INTERVAL" "$config" "${grants%,}"
}

PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
# The network devices but `lo`, as a JSON list's items.
DEVICES=$(awk -F: 'NR > 2 { gsub(/ /, "", $1); if ($1 != "lo") printf "%s\"%s\"", (n++ ? ", " : ""), $1 }' /proc/net/dev)

# cc-metric-collector's main file, with its sections in files beside it.
peer_main() {
    mkdir -p "$WORK/peer"
    cat >"$WORK/peer/config.json" <<JSON
{"sinks-file": "sinks.json", "collectors-file": "collectors.json",
 "receivers-file": "receivers.json", "router-file": "router.json",
 "main": {"interval": "${INTERVAL}s", "duration": "1s"}}
JSON
    echo '{"stdout": {"type": "stdout", "meta_as_tags": ["unit"]}}' >"$WORK/peer/sinks.json"
    echo '{}' >"$WORK/peer/receivers.json"
}

if [ "$CONFIG" = fritz ]; then
    FRITZ="$ROOT/host/tests/fixtures/ccmc-fau/fritz"
    peer_main
    python3 - "$FRITZ" "$WORK/peer" "[$DEVICES]" $FRITZ_LEAVE_OUT <<'PY'
import json, sys
fritz, out, devices, leave_out = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), sys.argv[4:]
collectors = json.load(open(f"{fritz}/collectors.json"))
for name in leave_out:
    collectors.pop(name, None)
if "netstat" in collectors:
    collectors["netstat"]["include_devices"] = devices
router = json.load(open(f"{fritz}/router.json"))
router.pop("normalize_metrics", None)
json.dump(collectors, open(f"{out}/collectors.json", "w"), indent=1)
json.dump(router, open(f"{out}/router.json", "w"), indent=1)
PY
    "$CCFLEET" agent import-ccmc "$WORK/peer/config.json" -o "$WORK/imported.json" \
        --fleet-url "http://127.0.0.1:$PORT" --cluster measure --plugin-dir "$COMPONENTS" \
        >"$WORK/import.log" || { cat "$WORK/import.log" >&2; exit 1; }
    sed 's/^/# import-ccmc: /' "$WORK/import.log"
    # As the nine's configuration: a fleet cache and a compile cache of the run's own.
    python3 - "$WORK/imported.json" "$WORK/agent.json" "$(hostname)" <<'PY'
import json, sys
config = json.load(open(sys.argv[1]))
config["fleet"]["hostname"] = sys.argv[3]
config["fleet"]["cache-path"] = "fleet-config.json"
config["plugin-cache-dir"] = "cache/components"
json.dump(config, open(sys.argv[2], "w"), indent=1)
PY
else
cat >"$WORK/agent.json" <<JSON
{
  "service-type": "ccmc",
  "fleet": {"url": "http://127.0.0.1:$PORT", "cluster": "measure", "hostname": "$(hostname)",
            "cache-path": "fleet-config.json"},
  "plugin-cache-dir": "cache/components",
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
fi
PLUGINS=$(python3 -c 'import json, sys; print(len(json.load(open(sys.argv[1]))["plugins"]))' "$WORK/agent.json")
# A first start compiles the components into the run's own compile cache (and is stopped
# once all of them are there): the measured start is a warm one, as on a node after its first.
(cd "$WORK" && exec "$CCFLEET" agent --config "$WORK/agent.json" >/dev/null 2>"$WORK/warm-up.log") &
PID=$!
for _ in $(seq 1200); do
    [ "$(find "$WORK/cache/components" -name '*.cwasm' 2>/dev/null | wc -l)" -ge "$PLUGINS" ] && break
    kill -0 "$PID" 2>/dev/null || { echo "the agent exited; its log:" >&2; cat "$WORK/warm-up.log" >&2; exit 1; }
    sleep 0.5
done
kill "$PID"
wait "$PID" 2>/dev/null || true
PID=""

if [ -n "$PEER" ] && [ "$CONFIG" = nine ]; then
    # cc-metric-collector's configuration for the same work: its netstat measures only the
    # devices it is given, so it gets every device but `lo`, which the agent's netstat
    # measures by default.
    peer_main
    echo '{}' >"$WORK/peer/router.json"
    cat >"$WORK/peer/collectors.json" <<JSON
{"cpustat": {}, "memstat": {"numa_stats": true}, "loadavg": {},
 "netstat": {"include_devices": [$DEVICES], "send_abs_values": true, "send_derived_values": true},
 "iostat": {}, "diskstat": {}, "numastats": {}, "cpufreq": {}, "tempstat": {}}
JSON
fi

if [ "$PAGE_CACHE" = cold ]; then
    # Both programs' files leave the page cache, so each is read in by its own page faults:
    # how the kernel caches a file depends on how it came there (a file just written by a
    # linker or copied whole sits in large folios, and a fault maps the whole folio), and
    # that counts in the resident memory of whoever maps it.
    python3 - "$CCFLEET" ${PEER:+"$PEER"} "$WORK"/cache/components/*.cwasm <<'PY'
import os, sys
for path in sys.argv[1:]:
    fd = os.open(path, os.O_RDONLY)
    os.fdatasync(fd)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
PY
fi

(cd "$WORK" && exec "$CCFLEET" agent --config "$WORK/agent.json" >/dev/null 2>"$WORK/agent.log") &
PID=$!
if [ -n "$PEER" ]; then
    (cd "$WORK/peer" && exec "$PEER" -config config.json >/dev/null 2>"$WORK/peer.log") &
    GPID=$!
fi

TICK=$(getconf CLK_TCK)
# CPU time of the live threads in ns (the first field of each thread's schedstat): the
# start-up figure to the nanosecond, where utime + stime count whole clock ticks.
thread_ns() { cat /proc/"$1"/task/*/schedstat 2>/dev/null | awk '{ s += $1 } END { print s + 0 }'; }
cpu_seconds() { # pid: utime + stime, fields 14 and 15, counted after the command name
    awk -v tick="$TICK" '{ sub(/^.*\) /, ""); print ($12 + $13) / tick }' "/proc/$1/stat"
}
status_kib() { awk -v key="$2:" '$1 == key { print $2 }' "/proc/$1/status"; }
alive() {
    local p
    for p in $PID $GPID; do
        kill -0 "$p" 2>/dev/null && continue
        echo "process $p exited; the logs:" >&2
        cat "$WORK/agent.log" "$WORK/peer.log" 2>/dev/null | tail -20 >&2
        exit 1
    done
}

declare -A START_CPU START_NS HALF_CPU LAST_CPU
START=$(date +%s.%N)
HALF_T=""
ELAPSED=0
N=0
echo "# process seconds cpu_seconds rss_kib"
while [ "$(echo "$ELAPSED < $DURATION" | bc)" = 1 ]; do
    N=$((N + 1))
    # Sample at whole seconds after the start, whatever the time the sampling takes.
    sleep "$(echo "$START + $N - $(date +%s.%N)" | bc | sed 's/^-.*/0/')"
    alive
    ELAPSED=$(echo "$(date +%s.%N) - $START" | bc)
    for p in $PID $GPID; do
        LAST_CPU[$p]=$(cpu_seconds "$p")
        if [ "$N" = 2 ]; then
            START_CPU[$p]=${LAST_CPU[$p]}
            START_NS[$p]=$(thread_ns "$p")
        fi
        if [ $((N % INTERVAL)) = 0 ]; then
            name=agent
            [ "$p" = "$GPID" ] && name=cc-metric-collector
            printf '%s %.1f %s %s\n' "$name" "$ELAPSED" "${LAST_CPU[$p]}" "$(status_kib "$p" VmRSS)"
        fi
    done
    if [ -z "$HALF_T" ] && [ "$(echo "$ELAPSED * 2 >= $DURATION" | bc)" = 1 ]; then
        HALF_T=$ELAPSED
        for p in $PID $GPID; do HALF_CPU[$p]=${LAST_CPU[$p]}; done
    fi
done

summary() { # pid name
    local p=$1 name=$2
    local anon_huge
    anon_huge=$(awk '$1 == "AnonHugePages:" { print $2 }' "/proc/$p/smaps_rollup")
    awk -v name="$name" -v cpu="${LAST_CPU[$p]}" -v half="${HALF_CPU[$p]}" -v t="$ELAPSED" \
        -v t0="$HALF_T" -v iv="$INTERVAL" -v start="${START_CPU[$p]}" -v start_ns="${START_NS[$p]}" \
        -v hwm="$(status_kib "$p" VmHWM)" -v rss="$(status_kib "$p" VmRSS)" \
        -v anon="$(status_kib "$p" RssAnon)" -v file="$(status_kib "$p" RssFile)" \
        -v shmem="$(status_kib "$p" RssShmem)" -v huge="$anon_huge" 'BEGIN {
        printf "# %s: CPU per round %.3f ms (%.3f%% of one core) over the second half; in the first 2 s %d ms (%.1f ms as its live threads count it in schedstat)\n",
            name, 1000 * iv * (cpu - half) / (t - t0), 100 * (cpu - half) / (t - t0), 1000 * start, start_ns / 1e6
        printf "# %s: VmHWM %.1f MiB; at the end RSS %.1f MiB = anonymous %.1f (huge pages %.1f) + file %.1f + shmem %.1f\n",
            name, hwm / 1024, rss / 1024, anon / 1024, huge / 1024, file / 1024, shmem / 1024 }'
}

# The agent's resident memory at the end by kind of mapping: the binary's and other files'
# pages, anonymous executable mappings (JIT code), wasm linear memories (the accessible part
# and the copy-on-write image in front of the huge PROT_NONE reservation that ends each),
# other memfd images, thread stacks (above their guard page), 1 GiB anonymous arenas
# (mimalloc's) and the rest of the anonymous memory.
smaps_kinds() { # pid exe
    python3 - "/proc/$1/smaps" "$2" <<'PY'
import re, sys
vmas = []
for line in open(sys.argv[1]):
    m = re.match(r"([0-9a-f]+)-([0-9a-f]+) (\S+) \S+ \S+ \S+\s*(.*)", line)
    if m:
        vmas.append({"start": int(m[1], 16), "end": int(m[2], 16), "perms": m[3],
                     "path": m[4].strip(), "rss": 0})
    elif line.startswith("Rss:"):
        vmas[-1]["rss"] = int(line.split()[1])
GIB = 1 << 30
kinds = [None] * len(vmas)
for i, v in enumerate(vmas):
    if v["perms"].startswith("---") and v["end"] - v["start"] >= GIB and not v["path"]:
        j = i - 1
        while j >= 0 and vmas[j]["end"] == vmas[j + 1]["start"] and not vmas[j]["perms"].startswith("---") \
                and (not vmas[j]["path"] or vmas[j]["path"].startswith("/memfd:")):
            kinds[j] = "wasm linear memories"
            j -= 1
totals = {}
for i, v in enumerate(vmas):
    kind = kinds[i]
    size = v["end"] - v["start"]
    prev = vmas[i - 1] if i else None
    if kind:
        pass
    elif v["path"] == sys.argv[2]:
        kind = "the binary"
    elif v["path"].endswith(".cwasm"):
        kind = "compiled components"
    elif v["path"].startswith("/memfd:"):
        kind = "memfd images"
    elif v["path"] == "[stack]" or (not v["path"] and prev and prev["perms"] == "---p" and not prev["path"]
                                    and prev["end"] == v["start"] and prev["end"] - prev["start"] <= 65536):
        kind = "thread stacks"
    elif v["path"].startswith("["):
        kind = "other " + v["path"]
    elif v["path"]:
        kind = "other files"
    elif "x" in v["perms"]:
        kind = "JIT code"
    elif size >= GIB:
        kind = "1 GiB arenas (allocator)"
    else:
        kind = "other anonymous"
    totals[kind] = totals.get(kind, 0) + v["rss"]
for kind, kib in sorted(totals.items(), key=lambda kv: -kv[1]):
    if kib:
        print(f"#   {kind:<26} {kib / 1024:7.1f} MiB")
PY
}

alive
summary "$PID" agent
echo "# agent: resident memory at the end by mapping (smaps):"
smaps_kinds "$PID" "$CCFLEET"
if [ -n "$GPID" ]; then
    summary "$GPID" cc-metric-collector
    echo "# cc-metric-collector: $(grep -c . "$WORK/peer.log" || true) log lines; the last three:"
    tail -3 "$WORK/peer.log" | cut -c1-200 | sed "s/^/#   /"
fi
WARNINGS=$(grep -c -E "WARN|ERROR" "$WORK/agent.log" || true)
echo "# agent log: $WARNINGS warning or error lines; the last three:"
grep -E "WARN|ERROR" "$WORK/agent.log" | tail -3 | cut -c1-200 | sed "s/^/#   /"
