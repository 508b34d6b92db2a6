//! Whether the configuration tree's rescans work, for `/healthz`.
//!
//! A rescan that fails keeps the previous generation in place, and one that hangs (a file
//! system that stopped answering) keeps it forever: in both cases the server answers with a
//! configuration that is no longer what the tree says, which an operator must learn from the
//! health check, not only from a counter or a log line.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::untrusted::Untrusted;

/// A rescan running longer than this is reported as stuck.
pub(crate) const STUCK_AFTER: Duration = Duration::from_secs(30);
/// How much of a rescan's error `/healthz` quotes.
const ERROR_CAP: usize = 300;

/// The state of the configuration tree's rescans.
#[derive(Debug, Default)]
pub(crate) struct RescanStatus(Mutex<Inner>);

#[derive(Debug, Default)]
struct Inner {
    /// When the running rescan started.
    running_since: Option<Instant>,
    /// The error of the latest finished rescan, if it failed.
    failed: Option<String>,
}

impl RescanStatus {
    fn inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A rescan starts.
    pub(crate) fn started(&self) {
        self.inner().running_since = Some(Instant::now());
    }

    /// The rescan finished: `error` when it failed and the previous generation stays.
    pub(crate) fn finished(&self, error: Option<String>) {
        let mut inner = self.inner();
        inner.running_since = None;
        inner.failed = error.map(|e| Untrusted(&e).capped(ERROR_CAP).to_string());
    }

    /// What is wrong with the rescans at `now`, if anything.
    pub(crate) fn problem(&self, now: Instant) -> Option<String> {
        let inner = self.inner();
        if let Some(since) = inner.running_since {
            let running = now.saturating_duration_since(since);
            if running >= STUCK_AFTER {
                return Some(format!(
                    "a rescan has been running for {} s (stuck reading the tree?); serving the previous generation",
                    running.as_secs()
                ));
            }
        }
        inner.failed.as_ref().map(|error| {
            format!("the latest rescan failed, serving the previous generation: {error}")
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_rescan_is_reported_until_one_succeeds() {
        let status = RescanStatus::default();
        assert_eq!(status.problem(Instant::now()), None);
        status.started();
        status.finished(Some("fritz/ccmc/a.json: not a regular file".into()));
        let problem = status.problem(Instant::now()).unwrap();
        assert!(problem.contains("latest rescan failed"), "{problem}");
        assert!(problem.contains("not a regular file"), "{problem}");
        status.started();
        status.finished(None);
        assert_eq!(status.problem(Instant::now()), None);
    }

    #[test]
    fn a_rescan_running_too_long_is_reported_as_stuck() {
        let status = RescanStatus::default();
        status.started();
        assert_eq!(status.problem(Instant::now()), None);
        let later = Instant::now() + STUCK_AFTER + Duration::from_secs(5);
        let problem = status.problem(later).unwrap();
        assert!(problem.contains("stuck"), "{problem}");
    }

    #[test]
    fn an_error_is_escaped_and_capped() {
        let status = RescanStatus::default();
        status.finished(Some(format!("bad\n{}", "x".repeat(5000))));
        let problem = status.problem(Instant::now()).unwrap();
        assert!(!problem.contains('\n'));
        assert!(problem.len() < 1000, "{}", problem.len());
    }
}
