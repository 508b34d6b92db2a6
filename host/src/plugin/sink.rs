//! Where emitted metrics go: batches of line protocol, one per `emit` call, written to a NATS
//! subject (what cc-metric-store consumes) or to stdout.
//!
//! Plugins hand batches over without waiting: the channel is bounded and a full channel
//! refuses the batch (the plugin's `emit` fails), so a stalled NATS connection never blocks a
//! plugin's store.

use std::io::Write;
use std::sync::Arc;

use tokio::sync::mpsc;

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
    (SinkHandle { tx }, rx)
}

impl SinkHandle {
    /// Hands a batch over without waiting.
    pub fn try_send(&self, batch: Batch) -> Result<(), SinkError> {
        self.tx.try_send(batch).map_err(|e| match e {
            mpsc::error::TrySendError::Full(_) => SinkError::Full,
            mpsc::error::TrySendError::Closed(_) => SinkError::Closed,
        })
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
pub async fn run(mut rx: BatchReceiver, target: Target) {
    while let Some(batch) = rx.recv().await {
        match &target {
            Target::Nats { client, subject } => {
                if let Err(error) = client.publish(subject.clone(), batch.lines).await {
                    tracing::warn!(plugin = %batch.plugin, %error, "cannot publish metrics to NATS");
                }
            }
            Target::Stdout => {
                let mut out = std::io::stdout().lock();
                if let Err(error) = out.write_all(&batch.lines).and_then(|()| out.flush()) {
                    tracing::warn!(%error, "cannot write metrics to stdout");
                }
            }
        }
    }
    if let Target::Nats { client, .. } = &target
        && let Err(error) = client.flush().await
    {
        tracing::warn!(%error, "cannot flush metrics to NATS");
    }
}
