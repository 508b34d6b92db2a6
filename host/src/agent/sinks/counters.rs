//! The per-sink counters `/metrics` and the health report show.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use super::kind::SinkType;

/// Counters of one sink, shown on the agent's `/metrics`.
#[derive(Debug, Default)]
pub struct SinkCounters {
    /// Writes (publishes, requests, stdout writes) that succeeded.
    pub batches: AtomicU64,
    /// Points written.
    pub sent: AtomicU64,
    /// Writes that failed (each failed attempt, retried or not).
    pub errors: AtomicU64,
    /// Failed requests that are retried later.
    pub retried: AtomicU64,
    /// Points dropped because the sink's queue was full (the sink fell behind).
    pub dropped_queue_full: AtomicU64,
    /// Points dropped from a full retry buffer (oldest first).
    pub dropped_retry_buffer: AtomicU64,
    /// Points the receiver refused (a 4xx other than 429), or would refuse and were left out
    /// of the request (the `http` sink's non-numeric values): not retried.
    pub dropped_rejected: AtomicU64,
    /// Points whose write failed with no retry left (NATS or stdout errors, shutdown).
    pub dropped_failed: AtomicU64,
    /// Why the latest write failed; `None` once a write succeeds (and before the first).
    failing: std::sync::Mutex<Option<String>>,
}

impl SinkCounters {
    pub(super) fn add(counter: &AtomicU64, n: usize) {
        counter.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// Records a write that went through: the sink delivers.
    pub(super) fn delivered(&self) {
        let mut failing = self.failing.lock().unwrap_or_else(|e| e.into_inner());
        if failing.is_some() {
            *failing = None;
        }
    }

    /// Records a write that failed for `why`: the sink does not deliver until one succeeds.
    pub(super) fn failed(&self, why: impl Into<String>) {
        *self.failing.lock().unwrap_or_else(|e| e.into_inner()) = Some(why.into());
    }

    /// Why the sink's latest write failed; `None` while it delivers (or has not written).
    pub fn delivery_failure(&self) -> Option<String> {
        self.failing
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Every dropped point, whatever the reason.
    pub fn dropped(&self) -> u64 {
        [
            &self.dropped_queue_full,
            &self.dropped_retry_buffer,
            &self.dropped_rejected,
            &self.dropped_failed,
        ]
        .iter()
        .map(|c| c.load(Ordering::Relaxed))
        .sum()
    }
}

/// One configured sink as `/metrics` names it.
#[derive(Debug, Clone)]
pub struct SinkInfo {
    /// The key in `sinks` (or `nats`/`stdout` for the legacy `metrics` section).
    pub name: String,
    /// Its kind.
    pub kind: SinkType,
    /// Its counters.
    pub counters: Arc<SinkCounters>,
}
