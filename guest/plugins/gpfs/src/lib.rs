//! Collector plugin: cc-metric-collector's `gpfs`, from [`ccfleet_collectors::gpfs`] (which
//! says which commands the plugin's `capabilities.run` must grant).
#![no_std]

ccfleet_collector_plugin::export_command_collector!(ccfleet_collectors::gpfs::Gpfs);
