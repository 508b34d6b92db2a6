//! Collector plugin: cc-metric-collector's `customcmd`, from [`ccfleet_collectors::customcmd`] (which
//! says which commands the plugin's `capabilities.run` must grant).
#![no_std]

ccfleet_collector_plugin::export_command_collector!(ccfleet_collectors::customcmd::Customcmd);
