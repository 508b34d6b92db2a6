//! The `unescape` fuzz target: runs [`ccfleet_fuzz::unescape`] on every input.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ccfleet_fuzz::unescape(data));
