//! The `heartbeats` fuzz target: runs [`ccfleet_fuzz::heartbeats`] on every input.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ccfleet_fuzz::heartbeats(data));
