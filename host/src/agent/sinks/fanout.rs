//! The fan-out from the plugins' channel to every sink's own bounded queue: never waits, so
//! a stalled sink delays nothing but itself.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;

use super::counters::SinkCounters;
use super::meta_tags;
use crate::agent::router::Router;
use crate::sink::{Batch, BatchReceiver};

/// A sink's receiving end.
pub(crate) struct Queue {
    pub tx: mpsc::Sender<Batch>,
    pub counters: Arc<SinkCounters>,
    /// The tags this sink does not write (meta keys its `meta_as_tags` leaves out).
    pub strip: Option<Arc<Vec<Vec<u8>>>>,
}

/// Copies every batch into every sink's queue without waiting.
pub(crate) async fn fan_out(mut batches: BatchReceiver, queues: Vec<Queue>) {
    while let Some(batch) = batches.recv().await {
        deliver(&queues, batch);
    }
}

fn unix_nanos() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

/// [`fan_out`] with the router applied to each batch first; a timer ends the aggregates'
/// intervals when no batch does.
pub(crate) async fn fan_out_routed(
    mut batches: BatchReceiver,
    queues: Vec<Queue>,
    mut router: Router,
) {
    let period = Duration::from_nanos(router.interval_ns().clamp(1_000_000, 1_000_000_000) as u64);
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let plugin: Arc<str> = Arc::from("router");
    loop {
        let (routed, from) = tokio::select! {
            batch = batches.recv() => {
                let Some(batch) = batch else { return };
                (router.route(&batch.lines, unix_nanos()), batch.plugin)
            }
            _ = tick.tick() => (router.flush(unix_nanos()), plugin.clone()),
        };
        if routed.points > 0 {
            deliver(
                &queues,
                Batch {
                    plugin: from,
                    lines: bytes::Bytes::from(routed.lines),
                    points: routed.points,
                },
            );
        }
    }
}

fn deliver(queues: &[Queue], batch: Batch) {
    for queue in queues {
        let points = batch.points;
        let copy = match &queue.strip {
            Some(keys) => match meta_tags::strip(&batch.lines, keys) {
                (lines, true) => Batch {
                    plugin: batch.plugin.clone(),
                    lines: lines.into(),
                    points,
                },
                (_, false) => batch.clone(),
            },
            None => batch.clone(),
        };
        match queue.tx.try_send(copy) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(_)) => {
                SinkCounters::add(&queue.counters.dropped_queue_full, points)
            }
            Err(mpsc::error::TrySendError::Closed(_)) => {
                SinkCounters::add(&queue.counters.dropped_failed, points)
            }
        }
    }
}
