//! The `nats` sink: each batch published as it comes to one subject, over the agent's NATS
//! connection.

use std::sync::Arc;

use serde::Deserialize;
use tokio::sync::mpsc;

use super::counters::SinkCounters;
use crate::sink::Batch;

/// The keys of a `nats` sink.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct NatsConfig {
    /// The subject (default `cc.metric`, or `cc.metric.<cluster>` with a cluster).
    #[serde(default)]
    pub subject: Option<String>,
}

impl NatsConfig {
    /// The subject published to.
    pub fn subject(&self, fleet_cluster: &str) -> String {
        self.subject.clone().unwrap_or_else(|| {
            if fleet_cluster.is_empty() {
                "cc.metric".to_owned()
            } else {
                format!("cc.metric.{fleet_cluster}")
            }
        })
    }
}

/// Publishes what arrives until the queue closes, then flushes the connection.
pub(crate) async fn run(
    mut rx: mpsc::Receiver<Batch>,
    client: async_nats::Client,
    subject: String,
    counters: Arc<SinkCounters>,
) {
    while let Some(batch) = rx.recv().await {
        match client.publish(subject.clone(), batch.lines.clone()).await {
            Ok(()) => {
                SinkCounters::add(&counters.batches, 1);
                SinkCounters::add(&counters.sent, batch.points);
                counters.delivered();
            }
            Err(error) => {
                // NATS errors may quote the server URL with its credentials.
                let error = ccfleet::nats::scrub(&error, &[]);
                tracing::warn!(plugin = %batch.plugin, %error, "cannot publish metrics to NATS");
                counters.failed(format!("cannot publish to NATS: {error}"));
                SinkCounters::add(&counters.errors, 1);
                SinkCounters::add(&counters.dropped_failed, batch.points);
            }
        }
    }
    if let Err(error) = client.flush().await {
        let error = ccfleet::nats::scrub(&error, &[]);
        tracing::warn!(%error, "cannot flush metrics to NATS");
    }
}
