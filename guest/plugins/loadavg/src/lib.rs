//! Collector plugin: cc-metric-collector's `loadavg`, from [`ccfleet_collectors::loadavg`].
#![no_std]

ccfleet_collector_plugin::export_collector!(ccfleet_collectors::loadavg::Loadavg);
