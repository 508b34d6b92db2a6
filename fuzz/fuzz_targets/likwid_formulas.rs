//! The `likwid_formulas` fuzz target: event sets and formulas as text through the LIKWID
//! grant's check and evaluation ([`ccfleet_host::plugin::native::likwid_fuzz`]); an accepted
//! plan gives finite values only.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Some(value) = ccfleet_host::plugin::native::likwid_fuzz::check_fuzz_input(data) {
        panic!("a metric value that is not finite: {value}");
    }
});
