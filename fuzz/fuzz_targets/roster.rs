//! The `roster` fuzz target: runs [`ccfleet_fuzz::roster`] on every input.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ccfleet_fuzz::roster(data));
