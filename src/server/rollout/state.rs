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
    /// Unix milliseconds the current stage started. A stage's `min-time` is measured from
    /// here: from whole seconds, a stage started at 12.9 s had "run" 5 s at 17.0 s, after
    /// 4.1 s of real time. Absent from progress saved by servers that kept whole seconds
    /// only, which is then measured from [`RolloutState::stage_started_at`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stage_started_ms: Option<i64>,
    /// Why the last decision was taken.
    pub reason: String,
    /// Unix seconds of the last decision.
    pub updated_at: i64,
    /// Counts decisions: a server takes over a saved state with a later epoch than its own.
    pub epoch: u64,
}

impl RolloutState {
    /// A new rollout at its first stage, `now_ms` in Unix milliseconds.
    pub fn start(digest: i64, now_ms: i64) -> RolloutState {
        let now = now_ms.div_euclid(1000);
        RolloutState {
            digest,
            stage: 0,
            status: Status::Running,
            stage_started_at: now,
            stage_started_ms: Some(now_ms),
            reason: String::new(),
            updated_at: now,
            epoch: 0,
        }
    }

    /// The same progress with its current stage starting at `now_ms` (Unix milliseconds).
    pub fn stage_starting(self, stage: usize, now_ms: i64) -> RolloutState {
        RolloutState {
            stage,
            stage_started_at: now_ms.div_euclid(1000),
            stage_started_ms: Some(now_ms),
            ..self
        }
    }

    /// How long the current stage has run at `now_ms` (Unix milliseconds); zero for a
    /// start in the future (a clock stepped back).
    pub fn stage_elapsed(&self, now_ms: i64) -> std::time::Duration {
        let started = self
            .stage_started_ms
            .unwrap_or_else(|| self.stage_started_at.saturating_mul(1000));
        std::time::Duration::from_millis(u64::try_from(now_ms.saturating_sub(started)).unwrap_or(0))
    }
}

/// The time now in Unix milliseconds.
pub fn unix_millis() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stage_has_run_for_the_milliseconds_since_its_start() {
        // Started at 12.9 s: at 17.0 s it has run 4.1 s, not the 5 s whole seconds give.
        let state = RolloutState::start(1, 12_900);
        assert_eq!(
            state.stage_elapsed(17_000),
            std::time::Duration::from_millis(4_100)
        );
        let resumed = state.stage_starting(1, 20_999);
        assert_eq!(resumed.stage, 1);
        assert_eq!(resumed.stage_started_at, 20);
        assert_eq!(
            resumed.stage_elapsed(25_998),
            std::time::Duration::from_millis(4_999)
        );
        assert_eq!(resumed.stage_elapsed(10_000), std::time::Duration::ZERO);
    }

    #[test]
    fn progress_saved_in_whole_seconds_is_still_read() {
        let old = r#"{"digest":1,"stage":0,"status":"running","stage-started-at":10,
                      "reason":"","updated-at":10,"epoch":3}"#;
        let state: RolloutState = serde_json::from_str(old).unwrap();
        assert_eq!(state.stage_started_ms, None);
        assert_eq!(
            state.stage_elapsed(15_000),
            std::time::Duration::from_secs(5)
        );
    }
}
