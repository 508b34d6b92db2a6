//! AMD GPUs through the ROCm SMI library the agent loads for this plugin
//! (`capabilities.rocm-smi`). Needs an agent of WIT 0.3.3 or later.

use alloc::string::String;
use alloc::vec::Vec;

pub use crate::bindings::cc::fleet::rocm_smi::{Device, GpuMetrics, PciAddress};

/// The GPUs; an error when ROCm SMI is not granted or not available on the agent's host.
pub fn devices() -> Result<Vec<Device>, String> {
    crate::bindings::cc::fleet::rocm_smi::devices()
}

/// Reads the metrics table of GPU `device` (its ROCm SMI index).
pub fn read(device: u32) -> Result<GpuMetrics, String> {
    crate::bindings::cc::fleet::rocm_smi::read(device)
}
