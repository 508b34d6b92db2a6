//! Collector plugin: cc-metric-collector's `cpufreq`, from [`ccfleet_collectors::cpufreq`].
#![no_std]

ccfleet_collector_plugin::export_collector!(ccfleet_collectors::cpufreq::Cpufreq);
