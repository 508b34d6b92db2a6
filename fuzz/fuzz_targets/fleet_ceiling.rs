//! The `fleet_ceiling` fuzz target: a node's ceiling and a fleet plugin entry (one JSON text
//! each, separated by the first newline) through the agent's admission check; an admitted
//! entry must not run with anything wider than the ceiling
//! ([`ccfleet_host::agent::widening`]).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Some(wider) = ccfleet_host::agent::widening::check_fuzz_input(data) {
        panic!("an admitted entry is wider than the ceiling: {wider}");
    }
});
