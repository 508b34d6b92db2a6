//! Collector plugin: cc-metric-collector's `smartmon`, from [`ccfleet_collectors::smartmon`] (which
//! says which commands the plugin's `capabilities.run` must grant).
#![no_std]

ccfleet_collector_plugin::export_command_collector!(ccfleet_collectors::smartmon::Smartmon);
