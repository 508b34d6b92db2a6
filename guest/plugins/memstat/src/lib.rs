//! Collector plugin: cc-metric-collector's `memstat`, from [`ccfleet_collectors::memstat`].
#![no_std]

ccfleet_collector_plugin::export_collector!(ccfleet_collectors::memstat::Memstat);
