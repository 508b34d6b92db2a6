//! The ccfleet agent: a wasmtime component-model host for fleet plugins.
//!
//! Plugins are WebAssembly components targeting the `cc:fleet` WIT world (`wit/`). The
//! [`Runtime`] owns the engine, the linkers and the compile cache; each plugin runs in its
//! own tokio task owning its own `Store` ([`supervisor`]), fed the latest configuration,
//! roster and instance snapshots through watch channels ([`Feeds`]). Emitted points become
//! line protocol and go to a [`sink`]. The [`agent`] wires this to the fleet client and
//! service discovery.
#![warn(missing_docs)]

pub mod agent;
mod bindings;
mod cache;
pub mod componentize;
pub mod error;
pub mod events;
pub mod runtime;
pub mod sink;
pub mod spec;
mod state;
pub mod supervisor;

pub use error::{Failure, HostError};
pub use events::{EventKind, PluginEvent};
pub use runtime::{LoadedPlugin, Runtime, RuntimeOptions};
pub use spec::{Capabilities, Limits, PluginSpec};
pub use supervisor::{FeedSenders, Feeds, PluginHandle, PluginState, PluginStatus};

/// The snapshot types plugins receive, as generated from the WIT package.
pub mod types {
    pub use crate::bindings::cc::fleet::types::{
        ConfigUpdate, FieldValue, Instance, Level, Point, Provider, Source,
    };
}
