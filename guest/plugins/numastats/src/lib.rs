//! Collector plugin: cc-metric-collector's `numastats`, from [`ccfleet_collectors::numastats`].
#![no_std]

ccfleet_collector_plugin::export_collector!(ccfleet_collectors::numastats::Numastats);
