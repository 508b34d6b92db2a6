//! Collector plugin: cc-metric-collector's `schedstat`, from [`ccfleet_collectors::schedstat`].
#![no_std]

ccfleet_collector_plugin::export_collector!(ccfleet_collectors::schedstat::Schedstat);
