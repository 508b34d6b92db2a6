//! Collector plugin: cc-metric-collector's `nvidia`, from [`ccfleet_collectors::nvidia`]. Its
//! entry in the agent configuration grants `capabilities.nvml` (the agent reads NVML for it)
//! and `read-files` of `/proc/sys/kernel/hostname` (or its config gives `hostname`).
#![no_std]

ccfleet_collector_plugin::export_gpu_collector!(ccfleet_collectors::nvidia::Nvidia);
