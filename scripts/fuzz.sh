#!/usr/bin/env bash
# Coverage-guided fuzzing of the codec (cargo-fuzz, libFuzzer): builds every target in
# fuzz/fuzz_targets and runs each for SECONDS (default 60), two at a time, starting from the
# checked-in seeds (fuzz/seeds/<target>) and the inputs that once failed
# (fuzz/regressions/<target>). New corpus entries go to fuzz/corpus/<target> (not checked in).
# A failing input is left in fuzz/artifacts/<target>/ and the script exits non-zero.
#
#   scripts/fuzz.sh [SECONDS] [TARGET...]
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
seconds=${1:-60}
shift || true
targets=("$@")
if ((${#targets[@]} == 0)); then
    targets=(decoder heartbeats roster round_trip unescape emit_check collectors hostlist wasm_signature fleet_ceiling likwid_formulas)
fi

if ! command -v cargo-fuzz >/dev/null; then
    cargo install cargo-fuzz --locked
fi
# cargo-fuzz passes nightly-only flags (sanitizers, coverage instrumentation); the stable
# compiler accepts them when told it is bootstrapping itself.
export RUSTC_BOOTSTRAP=1

cargo fuzz build
run() {
    local target=$1
    mkdir -p "fuzz/corpus/$target"
    local dirs=("fuzz/corpus/$target" "fuzz/seeds/$target")
    [[ -d "fuzz/regressions/$target" ]] && dirs+=("fuzz/regressions/$target")
    cargo fuzz run "$target" "${dirs[@]}" -- -max_total_time="$seconds" -timeout=10 \
        -rss_limit_mb=2048 -print_final_stats=1 >"fuzz/$target.log" 2>&1
    local status=$?
    tail -n 12 "fuzz/$target.log" | grep -E "^(#|stat::|==|Done)" || true
    return $status
}

failed=0
pids=()
for target in "${targets[@]}"; do
    run "$target" &
    pids+=($!)
    if ((${#pids[@]} == 2)); then
        wait "${pids[0]}" || failed=1
        wait "${pids[1]}" || failed=1
        pids=()
    fi
done
for pid in "${pids[@]}"; do
    wait "$pid" || failed=1
done
if ((failed)); then
    echo "fuzzing found a failing input: see fuzz/<target>.log and fuzz/artifacts/" >&2
    exit 1
fi
