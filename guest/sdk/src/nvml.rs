//! NVIDIA GPUs through the NVML library the agent loads for this plugin
//! (`capabilities.nvml`). Needs an agent of WIT 0.3.1 or later.

use alloc::string::String;
use alloc::vec::Vec;

pub use crate::bindings::cc::fleet::nvml::{
    Clocks, Device, EccMode, Memory, MigDevice, Nvlink, PciLocation, Readings, RemappedRows,
    Utilization, Violations,
};

/// The GPUs, with their MIG devices when `mig` is true; an error when NVML is not granted
/// or not available on the agent's host.
pub fn devices(mig: bool) -> Result<Vec<Device>, String> {
    crate::bindings::cc::fleet::nvml::devices(mig)
}

/// Reads GPU `device` (its NVML index), or its MIG device `mig`.
pub fn read(device: u32, mig: Option<u32>) -> Result<Readings, String> {
    crate::bindings::cc::fleet::nvml::read(device, mig)
}
