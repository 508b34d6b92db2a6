//! The outcome of the latest store write: what health checks report, and the
//! once-per-burst log of failed writes.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::RegistryError;

/// How long the outcome of a write speaks for the store in health checks; after that
/// they probe it with a write of their own.
pub const PROBE_INTERVAL: Duration = Duration::from_secs(2);

/// A run of failed writes: logged when it starts and when it ends, counted in between.
pub(super) struct Failure {
    pub(super) message: String,
    pub(super) since: Instant,
    pub(super) failed: u64,
}

/// The outcome of the latest write, for health checks and the once-per-burst error log.
#[derive(Default)]
pub(super) struct WriteHealth {
    pub(super) latest: Mutex<LatestWrite>,
}

#[derive(Default)]
pub(super) struct LatestWrite {
    pub(super) at: Option<Instant>,
    pub(super) failure: Option<Failure>,
}

impl WriteHealth {
    pub(super) fn record<R>(&self, result: Result<R, RegistryError>) -> Result<R, RegistryError> {
        let mut latest = self.latest.lock().unwrap_or_else(|e| e.into_inner());
        latest.at = Some(Instant::now());
        let failure = &mut latest.failure;
        match (&result, failure.as_mut()) {
            (Ok(_), None) => {}
            (Ok(_), Some(burst)) => {
                tracing::warn!(
                    "fleet registry: writes succeed again after {} failed write(s) in {}",
                    burst.failed,
                    crate::duration::format(Duration::from_secs(burst.since.elapsed().as_secs()))
                );
                *failure = None;
            }
            (Err(e), None) => {
                tracing::error!(
                    "fleet registry: a write failed, nothing of it was acknowledged: {e} \
                     (further failures are counted until a write succeeds)"
                );
                *failure = Some(Failure {
                    message: e.to_string(),
                    since: Instant::now(),
                    failed: 1,
                });
            }
            (Err(e), Some(burst)) => {
                burst.failed += 1;
                burst.message = e.to_string();
            }
        }
        result
    }

    /// The latest outcome, unless it is older than `max_age` (or there is none).
    pub(super) fn fresh(&self, max_age: Duration) -> Option<Result<(), String>> {
        let latest = self.latest.lock().unwrap_or_else(|e| e.into_inner());
        latest.at.filter(|at| at.elapsed() < max_age)?;
        Some(match &latest.failure {
            None => Ok(()),
            Some(burst) => Err(burst.message.clone()),
        })
    }
}
