//! Collector plugin: cc-metric-collector's `nfsiostat`, from [`ccfleet_collectors::nfsiostat`].
#![no_std]

ccfleet_collector_plugin::export_collector!(ccfleet_collectors::nfsiostat::Nfsiostat);
