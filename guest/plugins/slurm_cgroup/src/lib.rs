//! Collector plugin: cc-metric-collector's `slurm_cgroup`, from [`ccfleet_collectors::slurm_cgroup`].
#![no_std]

ccfleet_collector_plugin::export_collector!(ccfleet_collectors::slurm_cgroup::SlurmCgroup);
