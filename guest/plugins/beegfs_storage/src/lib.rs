//! Collector plugin: cc-metric-collector's `beegfs_storage`, from [`ccfleet_collectors::beegfs`] (which
//! says which commands the plugin's `capabilities.run` must grant).
#![no_std]

ccfleet_collector_plugin::export_command_collector!(ccfleet_collectors::beegfs::BeegfsStorage);
