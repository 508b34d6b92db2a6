//! The `hostlist` fuzz target: runs [`ccfleet_fuzz::hostlist`] on every input.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ccfleet_fuzz::hostlist(data));
