//! Collector plugin: cc-metric-collector's `iostat`, from [`ccfleet_collectors::iostat`].
#![no_std]

ccfleet_collector_plugin::export_collector!(ccfleet_collectors::iostat::Iostat);
