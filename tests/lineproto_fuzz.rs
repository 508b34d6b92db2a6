//! Replays the fuzz targets' seed corpus and every input that once failed a target
//! (`fuzz/seeds/<target>/`, `fuzz/regressions/<target>/`) through the same checks, so the
//! ordinary test suite keeps them fixed without cargo-fuzz.

#[path = "../fuzz/src/lib.rs"]
mod checks;

use std::path::Path;

fn replay(target: &str, check: fn(&[u8])) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    let mut replayed = 0;
    for dir in ["seeds", "regressions"] {
        let Ok(entries) = std::fs::read_dir(root.join(dir).join(target)) else {
            continue;
        };
        for entry in entries {
            let path = entry.unwrap().path();
            let data = std::fs::read(&path).unwrap();
            let outcome = std::panic::catch_unwind(|| check(&data));
            assert!(outcome.is_ok(), "{target} fails on {}", path.display());
            replayed += 1;
        }
    }
    assert!(replayed > 0, "no inputs for {target}");
}

#[test]
fn the_decoder_passes_its_fuzz_checks_on_every_seed_and_past_failure() {
    replay("decoder", checks::decoder);
}

#[test]
fn heartbeat_decoding_passes_its_fuzz_checks_on_every_seed_and_past_failure() {
    replay("heartbeats", checks::heartbeats);
}

#[test]
fn roster_decoding_passes_its_fuzz_checks_on_every_seed_and_past_failure() {
    replay("roster", checks::roster);
}

#[test]
fn encode_decode_round_trips_pass_their_fuzz_checks_on_every_seed_and_past_failure() {
    replay("round_trip", checks::round_trip);
}

#[test]
fn every_unescaping_implementation_passes_its_fuzz_checks_on_every_seed() {
    replay("unescape", checks::unescape);
}

#[test]
fn the_emit_check_passes_its_fuzz_checks_on_every_seed_and_past_failure() {
    replay("emit_check", checks::emit_check);
}

#[test]
fn host_lists_pass_their_fuzz_checks_on_every_seed_and_past_failure() {
    replay("hostlist", checks::hostlist);
}

#[test]
fn plugin_signature_sections_pass_their_fuzz_checks_on_every_seed() {
    replay("wasm_signature", checks::wasm_signature);
}
