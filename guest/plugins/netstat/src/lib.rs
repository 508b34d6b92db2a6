//! Collector plugin: cc-metric-collector's `netstat`, from [`ccfleet_collectors::netstat`].
#![no_std]

ccfleet_collector_plugin::export_collector!(ccfleet_collectors::netstat::Netstat);
