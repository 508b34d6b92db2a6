//! The `decoder` fuzz target: runs [`ccfleet_fuzz::decoder`] on every input.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ccfleet_fuzz::decoder(data));
