//! Where emitted metrics go: batches of line protocol, one per `emit` call, written to a NATS
//! subject (what cc-metric-store consumes) or to stdout.
//!
//! Plugins hand batches over without waiting: the channel is bounded and a full channel
//! refuses the batch (the plugin's `emit` fails), so a stalled NATS connection never blocks a
//! plugin's store.

use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

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

/// The receiving end, drained by [`run`] (or read directly by an embedding program).
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

/// Counters of [`run_counted`]: what the output took and what it lost.
#[derive(Debug, Default)]
pub struct SinkStats {
    /// Batches written (published to NATS or written to stdout).
    pub batches: AtomicU64,
    /// Points in the batches written.
    pub points: AtomicU64,
    /// Batches that could not be written.
    pub errors: AtomicU64,
    /// Points in the batches that could not be written.
    pub points_lost: AtomicU64,
}

impl SinkStats {
    fn count(&self, batch: &Batch, ok: bool) {
        let (batches, points) = if ok {
            (&self.batches, &self.points)
        } else {
            (&self.errors, &self.points_lost)
        };
        batches.fetch_add(1, Ordering::Relaxed);
        points.fetch_add(batch.points as u64, Ordering::Relaxed);
    }
}

/// Where [`run`] writes batches.
#[derive(Debug, Clone)]
pub enum Target {
    /// Publish each batch to a NATS subject.
    Nats {
        /// The connection (it reconnects by itself).
        client: async_nats::Client,
        /// The subject, e.g. `cc.metric.fritz`.
        subject: String,
    },
    /// Write each batch to standard output.
    Stdout,
}

/// Drains `rx` into `target` until every [`SinkHandle`] is dropped.
pub async fn run(rx: BatchReceiver, target: Target) {
    run_counted(rx, target, Arc::default()).await;
}

/// [`run`], counting what is written and what is lost in `stats`.
pub async fn run_counted(mut rx: BatchReceiver, target: Target, stats: Arc<SinkStats>) {
    while let Some(batch) = rx.recv().await {
        let ok = match &target {
            Target::Nats { client, subject } => {
                match client.publish(subject.clone(), batch.lines.clone()).await {
                    Ok(()) => true,
                    Err(error) => {
                        let error = ccfleet::nats::scrub(&error, &[]);
                        tracing::warn!(plugin = %batch.plugin, %error, "cannot publish metrics to NATS");
                        false
                    }
                }
            }
            Target::Stdout => {
                let mut out = std::io::stdout().lock();
                match out.write_all(&batch.lines).and_then(|()| out.flush()) {
                    Ok(()) => true,
                    Err(error) => {
                        tracing::warn!(%error, "cannot write metrics to stdout");
                        false
                    }
                }
            }
        };
        stats.count(&batch, ok);
    }
    if let Target::Nats { client, .. } = &target
        && let Err(error) = client.flush().await
    {
        let error = ccfleet::nats::scrub(&error, &[]);
        tracing::warn!(%error, "cannot flush metrics to NATS");
    }
}
