//! Collector plugin: cc-metric-collector's `tempstat`, from [`ccfleet_collectors::tempstat`].
#![no_std]

ccfleet_collector_plugin::export_collector!(ccfleet_collectors::tempstat::Tempstat);
