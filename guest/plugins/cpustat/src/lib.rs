//! Collector plugin: cc-metric-collector's `cpustat`, from [`ccfleet_collectors::cpustat`].
#![no_std]

ccfleet_collector_plugin::export_collector!(ccfleet_collectors::cpustat::Cpustat);
