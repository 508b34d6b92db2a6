//! Collector plugin: cc-metric-collector's `diskstat`, from [`ccfleet_collectors::diskstat`].
#![no_std]

ccfleet_collector_plugin::export_collector!(ccfleet_collectors::diskstat::Diskstat);
