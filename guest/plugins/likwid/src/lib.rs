//! Collector plugin: cc-metric-collector's `likwid`, from [`ccfleet_collectors::likwid`]. Its
//! entry in the agent configuration grants `capabilities.likwid` (the agent measures with
//! LIKWID for it) and `read-files` of `/proc/sys/kernel/hostname` (or its config gives
//! `hostname`).
#![no_std]

ccfleet_collector_plugin::export_counter_collector!(ccfleet_collectors::likwid::Likwid);
