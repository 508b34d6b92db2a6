//! The counters of one plugin's runs, by how they ended.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::outcome::RunResult;

/// A plugin's command counters, which outlive its instances.
#[derive(Debug, Default)]
pub struct CommandStats {
    runs: [AtomicU64; RunResult::ALL.len()],
    nanos: AtomicU64,
}

/// A copy of a plugin's command counters.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct CommandSnapshot {
    /// Run requests per result of [`RunResult::ALL`], in that order.
    pub runs: Vec<u64>,
    /// Time spent running commands, in seconds.
    pub seconds: f64,
}

impl CommandSnapshot {
    /// The requests that ended with `result`.
    pub fn count(&self, result: RunResult) -> u64 {
        self.runs.get(result.index()).copied().unwrap_or(0)
    }
}

impl CommandStats {
    /// Counts one run request.
    pub fn record(&self, result: RunResult, took: Duration) {
        self.runs[result.index()].fetch_add(1, Ordering::Relaxed);
        self.nanos.fetch_add(
            u64::try_from(took.as_nanos()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
    }

    /// The counters now.
    pub fn snapshot(&self) -> CommandSnapshot {
        CommandSnapshot {
            runs: self
                .runs
                .iter()
                .map(|c| c.load(Ordering::Relaxed))
                .collect(),
            seconds: self.nanos.load(Ordering::Relaxed) as f64 / 1e9,
        }
    }
}
