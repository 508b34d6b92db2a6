//! A rollout's progress as saved in the registry (`rollout.<name>`, JSON).

use serde::{Deserialize, Serialize};

/// Where a rollout is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Status {
    /// Its current stage runs; it advances when the stage's gates hold.
    Running,
    /// Stopped at its stage (its gates failed, or an operator paused it); reached members
    /// keep the change; `resume` continues.
    Paused,
    /// Every stage passed; every member the last stage reaches keeps the change.
    Completed,
    /// Failures exceeded the limit: no member is served the change any more.
    RolledBack,
    /// An operator took the change back from every member.
    Aborted,
}

impl Status {
    /// The name the API and logs use.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Running => "running",
            Status::Paused => "paused",
            Status::Completed => "completed",
            Status::RolledBack => "rolled-back",
            Status::Aborted => "aborted",
        }
    }

    /// Whether reached members are served the change.
    pub fn serves_change(self) -> bool {
        matches!(self, Status::Running | Status::Paused | Status::Completed)
    }
}

/// A rollout's saved progress.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct RolloutState {
    /// The definition's digest this progress belongs to: an edited definition starts anew.
    pub digest: i64,
    /// The current stage (index).
    pub stage: usize,
    /// Where it is.
    pub status: Status,
    /// Unix seconds the current stage started.
    pub stage_started_at: i64,
    /// Why the last decision was taken.
    pub reason: String,
    /// Unix seconds of the last decision.
    pub updated_at: i64,
    /// Counts decisions: a server takes over a saved state with a later epoch than its own.
    pub epoch: u64,
}

impl RolloutState {
    /// A new rollout at its first stage.
    pub fn start(digest: i64, now: i64) -> RolloutState {
        RolloutState {
            digest,
            stage: 0,
            status: Status::Running,
            stage_started_at: now,
            reason: String::new(),
            updated_at: now,
            epoch: 0,
        }
    }
}
