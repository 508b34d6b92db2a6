//! Collector plugin: cc-metric-collector's `ibstat`, from [`ccfleet_collectors::ibstat`].
#![no_std]

ccfleet_collector_plugin::export_collector!(ccfleet_collectors::ibstat::Ibstat);
