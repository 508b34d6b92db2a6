//! Counters of one plugin for monitoring: calls and their latency, restarts, quarantines,
//! points emitted and dropped, granted commands run.
//!
//! Unlike [`events`](super::events), which are lossy, these counters count everything: they
//! are plain atomics, updated by the plugin's supervisor and its emit path and read at any
//! time through [`PluginHandle::stats`](super::PluginHandle::stats).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::commands::{CommandSnapshot, CommandStats};

/// The exported functions whose calls are counted, in the order of `PluginStats::calls`.
pub const CALLS: [&str; 5] = ["init", "on-config", "on-roster", "on-instances", "collect"];

/// Upper bounds (in seconds) of the latency histogram's buckets; a last bucket takes the rest.
pub const LATENCY_BUCKETS: [f64; 14] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0,
];

/// How a call ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallOutcome {
    /// It returned `ok`.
    Ok,
    /// It returned the plugin's own error; the plugin keeps running.
    Error,
    /// It trapped, overran its deadline or its memory: the instance was dropped.
    Failed,
}

/// The counters of one exported function.
#[derive(Debug, Default)]
pub struct CallStats {
    ok: AtomicU64,
    error: AtomicU64,
    failed: AtomicU64,
    nanos: AtomicU64,
    /// Per bucket of [`LATENCY_BUCKETS`] plus one for slower calls; not cumulative.
    buckets: [AtomicU64; LATENCY_BUCKETS.len() + 1],
}

/// A copy of one function's counters.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct CallSnapshot {
    /// Calls that returned `ok`.
    pub ok: u64,
    /// Calls that returned the plugin's error.
    pub error: u64,
    /// Calls that killed the instance.
    pub failed: u64,
    /// Total time spent in calls, in seconds.
    pub seconds: f64,
    /// Calls per latency bucket ([`LATENCY_BUCKETS`], then the rest); not cumulative.
    pub buckets: Vec<u64>,
}

impl CallSnapshot {
    /// All calls, whatever their outcome.
    pub fn count(&self) -> u64 {
        self.ok + self.error + self.failed
    }
}

/// The monitoring counters of one plugin (across all its instances).
#[derive(Debug, Default)]
pub struct PluginStats {
    calls: [CallStats; CALLS.len()],
    restarts: AtomicU64,
    quarantines: AtomicU64,
    points_emitted: AtomicU64,
    points_refused: AtomicU64,
    points_sink_full: AtomicU64,
    points_sink_closed: AtomicU64,
    /// Shared with the plugin's command runner, which counts its runs there.
    commands: Arc<CommandStats>,
}

/// A copy of a plugin's counters.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct StatsSnapshot {
    /// Per function of [`CALLS`], in that order.
    pub calls: Vec<CallSnapshot>,
    /// Restarts after failures, ever (the status' `restarts` is the budget used).
    pub restarts: u64,
    /// Times the restart budget was spent.
    pub quarantines: u64,
    /// Points handed to the sink.
    pub points_emitted: u64,
    /// Points of `emit` calls refused as malformed or over the plugin's limits.
    pub points_refused: u64,
    /// Points dropped because the sink was full.
    pub points_sink_full: u64,
    /// Points dropped because the sink had shut down.
    pub points_sink_closed: u64,
    /// Granted commands run, by result.
    pub commands: CommandSnapshot,
}

fn get(c: &AtomicU64) -> u64 {
    c.load(Ordering::Relaxed)
}

fn add(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

impl PluginStats {
    /// Counts one call of `call` (a name of [`CALLS`]; others are ignored).
    pub fn record_call(&self, call: &str, outcome: CallOutcome, took: Duration) {
        let Some(index) = CALLS.iter().position(|c| *c == call) else {
            return;
        };
        let stats = &self.calls[index];
        add(
            match outcome {
                CallOutcome::Ok => &stats.ok,
                CallOutcome::Error => &stats.error,
                CallOutcome::Failed => &stats.failed,
            },
            1,
        );
        add(
            &stats.nanos,
            u64::try_from(took.as_nanos()).unwrap_or(u64::MAX),
        );
        let seconds = took.as_secs_f64();
        let bucket = LATENCY_BUCKETS
            .iter()
            .position(|bound| seconds <= *bound)
            .unwrap_or(LATENCY_BUCKETS.len());
        add(&stats.buckets[bucket], 1);
    }

    pub(crate) fn restarted(&self) {
        add(&self.restarts, 1);
    }

    pub(crate) fn quarantined(&self) {
        add(&self.quarantines, 1);
    }

    pub(crate) fn emitted(&self, points: usize) {
        add(&self.points_emitted, points as u64);
    }

    pub(crate) fn refused(&self, points: usize) {
        add(&self.points_refused, points as u64);
    }

    pub(crate) fn sink_full(&self, points: usize) {
        add(&self.points_sink_full, points as u64);
    }

    pub(crate) fn sink_closed(&self, points: usize) {
        add(&self.points_sink_closed, points as u64);
    }

    /// The counters of the plugin's granted commands.
    pub fn commands(&self) -> &Arc<CommandStats> {
        &self.commands
    }

    /// The counters now (each read on its own: a snapshot taken during a call may count its
    /// outcome but not yet its latency).
    pub fn snapshot(&self) -> StatsSnapshot {
        StatsSnapshot {
            calls: self
                .calls
                .iter()
                .map(|c| CallSnapshot {
                    ok: get(&c.ok),
                    error: get(&c.error),
                    failed: get(&c.failed),
                    seconds: get(&c.nanos) as f64 / 1e9,
                    buckets: c.buckets.iter().map(get).collect(),
                })
                .collect(),
            restarts: get(&self.restarts),
            quarantines: get(&self.quarantines),
            points_emitted: get(&self.points_emitted),
            points_refused: get(&self.points_refused),
            points_sink_full: get(&self.points_sink_full),
            points_sink_closed: get(&self.points_sink_closed),
            commands: self.commands.snapshot(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_lands_in_its_outcome_and_latency_bucket() {
        let stats = PluginStats::default();
        stats.record_call("collect", CallOutcome::Ok, Duration::from_micros(700));
        stats.record_call("collect", CallOutcome::Error, Duration::from_secs(7));
        stats.record_call("init", CallOutcome::Failed, Duration::ZERO);
        stats.record_call("not-a-call", CallOutcome::Ok, Duration::ZERO);
        let snap = stats.snapshot();
        let collect = &snap.calls[4];
        assert_eq!((collect.ok, collect.error, collect.failed), (1, 1, 0));
        assert_eq!(collect.buckets[3], 1, "0.7 ms is at most 1 ms");
        assert_eq!(
            collect.buckets[LATENCY_BUCKETS.len()],
            1,
            "7 s is beyond 5 s"
        );
        assert!((collect.seconds - 7.0007).abs() < 1e-9);
        assert_eq!(snap.calls[0].failed, 1);
        assert_eq!(snap.calls[0].buckets[0], 1);
        assert_eq!(snap.calls.iter().map(CallSnapshot::count).sum::<u64>(), 3);
    }
}
