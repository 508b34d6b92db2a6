//! What happens to plugins, as a stream of events for observers (the demo narrative, tests,
//! diagnostics). Events are broadcast and lossy: a slow observer misses events, it never
//! slows a plugin down. State that must not be lost travels in watch channels instead.

use std::sync::Arc;
use std::time::Duration;

use crate::plugin::Failure;
use crate::plugin::types::Level;

/// One event of one plugin.
#[derive(Debug, Clone, PartialEq)]
pub struct PluginEvent {
    /// The plugin's name.
    pub plugin: Arc<str>,
    /// The instantiation the event belongs to, counted from 1; 0 before the first one.
    pub generation: u64,
    /// What happened.
    pub kind: EventKind,
}

/// What happened to a plugin.
#[derive(Debug, Clone, PartialEq)]
pub enum EventKind {
    /// The component was compiled (or taken from the compile cache) and type-checked.
    Loaded {
        /// The SHA-256 of the component file, hex.
        hash: String,
        /// Whether the compiled code came from the on-disk cache.
        cached: bool,
    },
    /// The component could not be loaded; the plugin waits for its file to change.
    LoadFailed {
        /// The error.
        error: String,
    },
    /// A new instance was created and `init` succeeded.
    Started,
    /// A configuration snapshot was delivered.
    ConfigDelivered {
        /// Its revision.
        revision: String,
    },
    /// A roster was delivered.
    RosterDelivered {
        /// The number of providers in it.
        providers: usize,
    },
    /// An instance set was delivered.
    InstancesDelivered {
        /// The number of instances in it.
        instances: usize,
    },
    /// The plugin logged a message (within its rate limit).
    Log {
        /// Its severity.
        level: Level,
        /// The message, cut at `logs::MAX_LOG_MESSAGE` bytes.
        message: String,
    },
    /// Log lines of the plugin (or its logged call errors) were dropped over its rate limit.
    LogsDropped {
        /// How many since the last report.
        count: u64,
    },
    /// The plugin emitted points that were handed to the sink.
    Emitted {
        /// The number of points.
        points: usize,
        /// The line-protocol bytes they became.
        bytes: usize,
    },
    /// An `emit` was refused (too large, malformed, or the sink is full).
    EmitRefused {
        /// Why.
        reason: String,
    },
    /// An exported function returned an error; the plugin keeps running.
    CallFailed {
        /// The function.
        call: &'static str,
        /// The plugin's error message, cut at `logs::MAX_ERROR_MESSAGE` bytes.
        message: String,
    },
    /// A snapshot ended two instances in a row while being delivered; it is not delivered
    /// again until the feed replaces it.
    SnapshotWithheld {
        /// The function it was delivered to.
        call: &'static str,
    },
    /// The instance failed and its store was dropped.
    Crashed {
        /// Why.
        failure: Failure,
    },
    /// The plugin will be restarted after a delay.
    Restarting {
        /// The delay.
        delay: Duration,
        /// Restarts used from the budget so far, including this one.
        restarts: u32,
    },
    /// The restart budget is spent; the plugin stays down until its file changes.
    Quarantined {
        /// The restarts it had.
        restarts: u32,
    },
    /// The component file changed; the new version replaces the running one.
    Reloading,
    /// The component file changed but the new version could not be loaded; the old one keeps
    /// running.
    ReloadFailed {
        /// The error.
        error: String,
    },
    /// The plugin was stopped.
    Stopped,
}

/// The sending side shared by all plugins of a runtime.
pub type EventSender = tokio::sync::broadcast::Sender<PluginEvent>;
