//! Where emitted metrics go: batches of line protocol, one per `emit` call, handed to the
//! program that runs the plugins (the agent writes them to its configured sinks, such as a
//! NATS subject cc-metric-store consumes).
//!
//! Plugins hand batches over without waiting: the channel is bounded and a full channel
//! refuses the batch (the plugin's `emit` fails), so a stalled NATS connection never blocks a
//! plugin's store.

use std::sync::Arc;

use tokio::sync::mpsc;

use super::stats::PluginStats;

/// One `emit` call's worth of line protocol.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Batch {
    /// The plugin that emitted it.
    pub plugin: Arc<str>,
    /// Newline-terminated line-protocol lines.
    pub lines: bytes::Bytes,
    /// The number of points (lines).
    pub points: usize,
}

/// The plugins' end of the sink channel.
#[derive(Debug, Clone)]
pub struct SinkHandle {
    tx: mpsc::Sender<Batch>,
    /// The counters of the plugin this handle was given to (set by its supervisor).
    stats: Option<Arc<PluginStats>>,
}

/// The receiving end, drained by the program that runs the plugins.
pub type BatchReceiver = mpsc::Receiver<Batch>;

/// Why a batch was not accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SinkError {
    /// The channel is full: the output is slower than the plugins.
    #[error("the metric sink is full; batch dropped")]
    Full,
    /// The sink has shut down.
    #[error("the metric sink is closed")]
    Closed,
}

/// A sink channel holding at most `capacity` batches.
pub fn channel(capacity: usize) -> (SinkHandle, BatchReceiver) {
    let (tx, rx) = mpsc::channel(capacity.max(1));
    (SinkHandle { tx, stats: None }, rx)
}

impl SinkHandle {
    /// Hands a batch over without waiting.
    pub fn try_send(&self, batch: Batch) -> Result<(), SinkError> {
        let points = batch.points;
        let result = self.tx.try_send(batch).map_err(|e| match e {
            mpsc::error::TrySendError::Full(_) => SinkError::Full,
            mpsc::error::TrySendError::Closed(_) => SinkError::Closed,
        });
        if let Some(stats) = &self.stats {
            match result {
                Ok(()) => stats.emitted(points),
                Err(SinkError::Full) => stats.sink_full(points),
                Err(SinkError::Closed) => stats.sink_closed(points),
            }
        }
        result
    }

    /// Batches waiting in the channel for the output.
    pub fn queued(&self) -> usize {
        self.tx.max_capacity() - self.tx.capacity()
    }

    /// This handle, counting what it is handed in `stats`.
    pub(crate) fn counted(mut self, stats: Arc<PluginStats>) -> SinkHandle {
        self.stats = Some(stats);
        self
    }

    /// Counts `points` the plugin tried to emit that were refused before reaching the sink.
    pub(crate) fn count_refused(&self, points: usize) {
        if let Some(stats) = &self.stats {
            stats.refused(points);
        }
    }
}
