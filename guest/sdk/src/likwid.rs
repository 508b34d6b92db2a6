//! Hardware performance counters through the LIKWID library the agent loads for this
//! plugin (`capabilities.likwid`); the agent measures and evaluates the formulas. Needs an
//! agent of WIT 0.3.2 or later.

use alloc::string::String;
use alloc::vec::Vec;

pub use crate::bindings::cc::fleet::likwid::{
    AccessMode, EventSet, Hwthread, Metric, Round, Setup, Value,
};

/// The hardware threads; an error when LIKWID is not granted or not available on the
/// agent's host.
pub fn topology() -> Result<Vec<Hwthread>, String> {
    crate::bindings::cc::fleet::likwid::topology()
}

/// Measures one round of `setup`.
pub fn measure(setup: &Setup) -> Result<Round, String> {
    crate::bindings::cc::fleet::likwid::measure(setup)
}
