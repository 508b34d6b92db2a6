//! What the agent's liveness and readiness are judged on, kept where the loops, the sinks
//! and the rollout record it: a token per long-running loop, and what the fleet named for
//! each plugin. A leaf below `health`, `observe`, `sinks` and `rollout`, so that the parts
//! that record and the parts that report do not import each other.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, Weak};

/// Proof that a loop runs: the loop's task holds it and drops it when the task ends, by
/// returning, panicking or being aborted.
#[derive(Debug)]
pub(crate) struct LoopToken(#[allow(dead_code)] Arc<()>);

/// The agent's long-running loops, by name.
#[derive(Debug, Default)]
pub(crate) struct Loops {
    loops: Mutex<Vec<(&'static str, Weak<()>)>>,
}

impl Loops {
    /// A token for the loop `name`, to be moved into its task.
    pub(crate) fn track(&self, name: &'static str) -> LoopToken {
        let token = Arc::new(());
        self.loops
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((name, Arc::downgrade(&token)));
        LoopToken(token)
    }

    /// Every loop with whether it still runs.
    pub(crate) fn states(&self) -> Vec<(&'static str, bool)> {
        self.loops
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(name, token)| (*name, token.strong_count() > 0))
            .collect()
    }
}

/// What the fleet named for one plugin and whether it runs, as the rollout last saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Assignment {
    /// The SHA-256 the fleet names.
    pub sha256: String,
    /// Where that version is on its way to running.
    pub stage: AssignmentStage,
    /// Why that version does not run (`None` once it runs).
    pub problem: Option<String>,
    /// Why this node refuses to run it (the `result` it counts, with the grant beyond the
    /// ceiling: `beyond_ceiling/capabilities.run`, `unsigned`, ...); `None` when it is not
    /// refused.
    pub refusal: Option<String>,
}

/// Where a version the fleet names is on its way to running. The fleet hears of each
/// differently: a version being fetched or started is still starting, and only a download
/// that failed (and has not since been retried successfully) is `download-failed`; a staged
/// rollout counts that as a failure of the version, so a healthy version reported failed
/// while it downloads would pause or roll back its own rollout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AssignmentStage {
    /// Being downloaded, compiled or started.
    Pending,
    /// Runs.
    Running,
    /// Its download failed; it is tried again at the next configuration poll.
    DownloadFailed,
    /// It was fetched but does not start (compile, link, instantiate or `init` failed).
    StartFailed,
}

/// The fleet's plugins by name, kept by the rollout.
pub(crate) type Assignments = Mutex<BTreeMap<String, Assignment>>;
