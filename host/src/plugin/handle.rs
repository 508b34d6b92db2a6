//! The controlling end of one supervised plugin: its status and its stop signal.

use std::sync::Arc;

use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::stats::PluginStats;
use crate::plugin::Failure;

/// Where a plugin is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PluginState {
    /// Being compiled or instantiated.
    Starting,
    /// Instantiated and serving.
    Running,
    /// Waiting to be restarted after a failure.
    Backoff,
    /// Its restart budget is spent; waiting for its file to change.
    Quarantined,
    /// Its component could not be loaded; waiting for its file to change.
    LoadFailed,
    /// Stopped for good.
    Stopped,
}

/// A plugin's current status.
#[derive(Debug, Clone, PartialEq)]
pub struct PluginStatus {
    /// Its state.
    pub state: PluginState,
    /// The current instantiation, counted from 1.
    pub generation: u64,
    /// Restarts used from the budget.
    pub restarts: u32,
    /// The SHA-256 of the running component, hex.
    pub hash: Option<String>,
    /// The last failure, if any.
    pub last_failure: Option<Failure>,
    /// Whether the running version has shown it works: a call of it returned (with or
    /// without an error of its own) since it was loaded or last failed. A plugin without a
    /// collect interval starts out proven (its `init` succeeding is all it may be asked for
    /// a while, and any returned call proves it again after a failure); one with an
    /// interval is proven by its first returned `collect`, so a version that traps on every
    /// collect never counts as running between its restarts.
    pub proven: bool,
}

/// Controls one supervised plugin. Dropping it stops the plugin.
#[derive(Debug)]
pub struct PluginHandle {
    name: Arc<str>,
    status: watch::Receiver<PluginStatus>,
    stop: watch::Sender<bool>,
    task: Option<JoinHandle<()>>,
    stats: Arc<PluginStats>,
}

impl PluginHandle {
    /// The plugin's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A receiver of the plugin's status.
    pub fn status(&self) -> watch::Receiver<PluginStatus> {
        self.status.clone()
    }

    /// The plugin's monitoring counters (calls, latency, restarts, points), which outlive
    /// its instances.
    pub fn stats(&self) -> Arc<PluginStats> {
        self.stats.clone()
    }

    /// Stops the plugin and waits for its task to finish (the store is dropped).
    pub async fn stop(mut self) {
        self.stop.send_replace(true);
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for PluginHandle {
    fn drop(&mut self) {
        self.stop.send_replace(true);
    }
}

impl PluginHandle {
    pub(crate) fn new(
        name: Arc<str>,
        status: watch::Receiver<PluginStatus>,
        stop: watch::Sender<bool>,
        task: JoinHandle<()>,
        stats: Arc<PluginStats>,
    ) -> PluginHandle {
        PluginHandle {
            name,
            status,
            stop,
            task: Some(task),
            stats,
        }
    }
}
