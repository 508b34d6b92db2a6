//! The `round_trip` fuzz target: runs [`ccfleet_fuzz::round_trip`] on every input.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ccfleet_fuzz::round_trip(data));
