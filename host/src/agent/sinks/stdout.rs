//! The `stdout` sink: line protocol on standard output.

use std::io::Write;
use std::sync::Arc;

use serde::Deserialize;
use tokio::sync::mpsc;

use super::counters::SinkCounters;
use crate::sink::Batch;

/// The keys of a `stdout` sink: none beside the shared ones.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
pub struct StdoutConfig {}

/// The most batches the stdout sink writes at once.
const BATCHES_PER_WRITE: usize = 64;

/// Writes what arrives until the queue closes.
pub(crate) async fn run(mut rx: mpsc::Receiver<Batch>, counters: Arc<SinkCounters>) {
    // The plugins of one collect round emit one after the other: what has arrived by the
    // time this task runs goes out in one write rather than one per plugin.
    let mut batches = Vec::new();
    let mut text = Vec::new();
    while rx.recv_many(&mut batches, BATCHES_PER_WRITE).await > 0 {
        text.clear();
        let mut points = 0;
        for batch in &batches {
            text.extend_from_slice(&batch.lines);
            points += batch.points;
        }
        let mut out = std::io::stdout().lock();
        match out.write_all(&text).and_then(|()| out.flush()) {
            Ok(()) => {
                SinkCounters::add(&counters.batches, batches.len());
                SinkCounters::add(&counters.sent, points);
                counters.delivered();
            }
            Err(error) => {
                tracing::warn!(%error, "cannot write metrics to stdout");
                counters.failed(format!("cannot write to standard output: {error}"));
                SinkCounters::add(&counters.errors, 1);
                SinkCounters::add(&counters.dropped_failed, points);
            }
        }
        batches.clear();
    }
}
