//! Collector plugin: cc-metric-collector's `rapl`, from [`ccfleet_collectors::rapl`].
#![no_std]

ccfleet_collector_plugin::export_collector!(ccfleet_collectors::rapl::Rapl);
