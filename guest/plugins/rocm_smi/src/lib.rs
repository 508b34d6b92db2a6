//! Collector plugin: cc-metric-collector's `rocm_smi`, from [`ccfleet_collectors::rocm_smi`].
//! Its entry in the agent configuration grants `capabilities.rocm-smi` (the agent reads ROCm
//! SMI for it) and `read-files` of `/proc/sys/kernel/hostname` (or its config gives
//! `hostname`).
#![no_std]

ccfleet_collector_plugin::export_amd_gpu_collector!(ccfleet_collectors::rocm_smi::RocmSmi);
