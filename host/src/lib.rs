//! The ccfleet agent, in three layers: the `ccfleet` binary's `cli` (one file per
//! subcommand, in `src/cli/`) uses [`agent`] (the fleet client, service discovery and the
//! plugins of one host wired together), which uses [`plugin`] (the wasmtime runtime that
//! loads, feeds and supervises WebAssembly plugins). Nothing points the other way.
//!
//! # Hosting plugins in another service
//!
//! The agent is one user of [`plugin::Runtime`]; another Rust service can run the same
//! plugins: load them with their limits and grants, feed them, and read what they emit.
//!
//! ```no_run
//! use std::time::Duration;
//!
//! use ccfleet_host::plugin::{FeedSenders, PluginSpec, Runtime, RuntimeOptions, sink};
//!
//! # async fn run() -> Result<(), ccfleet_host::HostError> {
//! // One runtime per process: the wasmtime engine, its epoch ticker and the compile cache.
//! let runtime = Runtime::new(RuntimeOptions::default())?;
//! // What every plugin is fed: the fleet configuration, rosters and discovered instances.
//! let feeds = FeedSenders::new();
//! // Where the plugins' line protocol goes, in batches.
//! let (sink, mut batches) = sink::channel(64);
//!
//! let mut spec = PluginSpec::new("plugins/loadavg.wasm");
//! spec.collect_interval = Some(Duration::from_secs(10));
//! // The plugin reads only the files it is granted.
//! spec.capabilities.read_files = vec!["/proc/loadavg".into(), "/proc/sys/kernel/hostname".into()];
//! let handle = runtime.spawn(spec, feeds.subscribe(), sink);
//!
//! feeds.set_roster(Vec::new());
//! if let Some(batch) = batches.recv().await {
//!     print!("{}", String::from_utf8_lossy(&batch.lines));
//! }
//! handle.stop().await;
//! # Ok(())
//! # }
//! ```
#![warn(missing_docs)]

/// The Rust examples of the book's pages that use this crate, compiled as doc tests so they
/// stay true; `host/tests/docs_snippets.rs` checks that every such page is listed.
#[cfg(doctest)]
#[doc = include_str!("../../docs/src/architecture/embedding.md")]
pub struct BookDoctests;

pub mod agent;
#[cfg(test)]
mod fuzz_inputs;
pub mod plugin;

pub use plugin::{
    Capabilities, EventKind, Failure, FeedSenders, Feeds, HostError, Limits, LoadedPlugin,
    PluginEvent, PluginHandle, PluginSpec, PluginState, PluginStatus, Runtime, RuntimeOptions,
};
pub use plugin::{componentize, error, events, sink, spec, types};
