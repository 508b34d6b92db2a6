//! Collector plugin: cc-metric-collector's `nfs4stat`, from [`ccfleet_collectors::nfsstat`].
#![no_std]

ccfleet_collector_plugin::export_collector!(ccfleet_collectors::nfsstat::Nfs4stat);
