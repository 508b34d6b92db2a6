//! The `wasm_signature` fuzz target: runs [`ccfleet_fuzz::wasm_signature`] on every input.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ccfleet_fuzz::wasm_signature(data));
