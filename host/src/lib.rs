//! The ccfleet agent, in three layers: the `ccfleet` binary's `cli` (one file per
//! subcommand, in `src/cli/`) uses [`agent`] (the fleet client, service discovery and the
//! plugins of one host wired together), which uses [`plugin`] (the wasmtime runtime that
//! loads, feeds and supervises WebAssembly plugins). Nothing points the other way.
#![warn(missing_docs)]

pub mod agent;
pub mod plugin;

pub use plugin::{
    Capabilities, EventKind, Failure, FeedSenders, Feeds, HostError, Limits, LoadedPlugin,
    PluginEvent, PluginHandle, PluginSpec, PluginState, PluginStatus, Runtime, RuntimeOptions,
};
pub use plugin::{componentize, error, events, sink, spec, types};
