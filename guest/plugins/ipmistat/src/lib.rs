//! Collector plugin: cc-metric-collector's `ipmistat`, from [`ccfleet_collectors::ipmistat`] (which
//! says which commands the plugin's `capabilities.run` must grant).
#![no_std]

ccfleet_collector_plugin::export_command_collector!(ccfleet_collectors::ipmistat::Ipmistat);
