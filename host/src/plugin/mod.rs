//! The plugin runtime: a wasmtime component-model host for fleet plugins.
//!
//! Plugins are WebAssembly components targeting the `cc:fleet` WIT world (`wit/`). Reading
//! order, from the bottom up (each layer uses only the ones before it):
//!
//! - [`spec`] and [`capabilities`]: how a plugin is declared, what it may reach; [`commands`]
//!   runs the commands a plugin is granted; [`native`] loads the native libraries plugins
//!   are granted ([`nvml`] reads NVIDIA GPUs, [`native::rocm_smi`] AMD GPUs,
//!   [`native::likwid`] measures performance counters);
//! - `limits`, [`logs`], `emit`, [`files`], `state`: the data of one plugin's `Store` and
//!   the `cc:fleet/host` and `cc:fleet/files` imports; [`sink`] is where emitted line
//!   protocol goes; [`held`] keeps the kernel files a plugin reads every round open;
//! - [`engine`]: the shared [`Runtime`] (engine, epoch ticker, linkers, compile cache) that
//!   loads a component into a [`LoadedPlugin`] and creates stores; it knows nothing of
//!   supervision;
//! - [`instance`]: one instantiation, every call guarded by a CPU deadline;
//! - [`restart`], [`feeds`], [`handle`], [`supervisor`]: one tokio task per plugin owning
//!   its only store, fed the latest snapshots, restarting it within its budget, collecting
//!   on the process-wide [`grid`].
//!
//! [`events`] reports what happens to plugins to whoever listens; [`stats`] counts it.
//!
//! ```no_run
//! use ccfleet_host::plugin::{FeedSenders, PluginSpec, Runtime, RuntimeOptions, sink};
//!
//! # async fn run() -> Result<(), ccfleet_host::HostError> {
//! let runtime = Runtime::new(RuntimeOptions::default())?;
//! let feeds = FeedSenders::new();
//! let (sink, mut batches) = sink::channel(64);
//! let mut spec = PluginSpec::new("guest/target/components/roster-logger.wasm");
//! spec.collect_interval = Some(std::time::Duration::from_secs(10));
//! let handle = runtime.spawn(spec, feeds.subscribe(), sink);
//! feeds.set_roster(Vec::new());
//! while let Some(batch) = batches.recv().await {
//!     print!("{}", String::from_utf8_lossy(&batch.lines));
//! }
//! handle.stop().await;
//! # Ok(())
//! # }
//! ```

mod bindings;
mod cache;
pub mod capabilities;
pub mod ceiling;
pub mod commands;
pub mod componentize;
mod emit;
pub mod engine;
pub mod error;
pub mod events;
pub mod feeds;
pub mod files;
pub mod grants;
pub mod grid;
pub mod handle;
pub mod held;
pub mod instance;
pub mod libraries;
mod limits;
pub mod logs;
pub mod mounts;
pub mod native;
pub use native::nvml;
pub mod restart;
pub mod secrets;
pub mod signature;
pub mod sink;
pub mod spec;
mod state;
pub mod stats;
pub mod supervisor;

pub use capabilities::Capabilities;
pub use engine::{LoadedPlugin, Runtime, RuntimeOptions, default_cache_dir};
pub use error::{Failure, HostError};
pub use events::{EventKind, PluginEvent};
pub use feeds::{FeedSenders, Feeds};
pub use handle::{PluginHandle, PluginState, PluginStatus};
pub use instance::{CallResult, Instance};
pub use spec::{Limits, PluginSpec};
pub use stats::{PluginStats, StatsSnapshot};

/// The snapshot types plugins receive, as generated from the WIT package.
pub mod types {
    pub use super::bindings::cc::fleet::types::{
        ConfigUpdate, FieldValue, Instance, Level, Point, Provider, Source,
    };
}
