//! Collector plugin: cc-metric-collector's `cpufreq_cpuinfo`, from
//! [`ccfleet_collectors::cpufreq_cpuinfo`].
#![no_std]

ccfleet_collector_plugin::export_collector!(ccfleet_collectors::cpufreq_cpuinfo::CpufreqCpuinfo);
