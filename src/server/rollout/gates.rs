//! A stage's gates: how the members a rollout has reached fare, and what that decides.
//!
//! A reached member is judged by its latest report ([`judge`]):
//! - a change that names plugins by SHA-256 runs on a member reporting each of them with
//!   that hash and `running`; it failed there when one of them reports that hash with a
//!   failing state (restarting, quarantined, download or load failed);
//! - any other change runs on a member that reports the revision it was served as applied
//!   with no plugin failing, and failed there when a plugin fails after applying it;
//! - a member still on the old version or revision is pending; one without a report (a
//!   Go agent, or one that has not polled since the server started) is unknown, never
//!   failed.
//!
//! Shares are taken over the reporting members ([`Counts::reporting`]).

use std::time::Duration;

use serde::Serialize;

use super::definition::{Definition, Stage};
use super::state::Status;
use crate::wire::{AgentReport, reported_hash};

/// How one member fares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Judgement {
    /// Runs the change.
    Running,
    /// Runs the change and fails with it.
    Failed,
    /// Reports, but does not run the change yet.
    Pending,
    /// Sends no report.
    Unknown,
}

/// Judges one reached member (see the module documentation); `expected` is the revision it
/// is served.
pub fn judge(
    definition: &Definition,
    report: Option<&AgentReport>,
    expected: Option<i64>,
) -> Judgement {
    let Some(report) = report else {
        return Judgement::Unknown;
    };
    if !definition.plugins.is_empty() {
        let mut all_running = true;
        for (name, sha) in &definition.plugins {
            let want = reported_hash(sha);
            match report.plugin(name) {
                Some(p) if p.sha256.as_deref() == Some(want.as_str()) => {
                    if p.health.is_failure() {
                        return Judgement::Failed;
                    }
                    if p.health != crate::wire::PluginHealth::Running {
                        all_running = false;
                    }
                }
                _ => all_running = false,
            }
        }
        return if all_running {
            Judgement::Running
        } else {
            Judgement::Pending
        };
    }
    if expected.is_some_and(|rev| rev == report.applied) {
        if report.plugins.iter().any(|p| p.health.is_failure()) {
            Judgement::Failed
        } else {
            Judgement::Running
        }
    } else {
        Judgement::Pending
    }
}

/// The plugin a member judged [`Judgement::Failed`] fails with: the first failing plugin
/// the change names (with the version it names), or for a change by revision the first
/// failing plugin of the report.
pub fn failing_plugin<'a>(
    definition: &Definition,
    report: &'a AgentReport,
) -> Option<&'a crate::wire::ReportedPlugin> {
    if definition.plugins.is_empty() {
        return report.plugins.iter().find(|p| p.health.is_failure());
    }
    definition.plugins.iter().find_map(|(name, sha)| {
        let want = reported_hash(sha);
        report
            .plugin(name)
            .filter(|p| p.sha256.as_deref() == Some(want.as_str()) && p.health.is_failure())
    })
}

/// How many failing members fail one way: a plugin state and the agent's reason.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Failing {
    /// The failing plugin's state (`refused`, `download-failed`, ...).
    pub health: &'static str,
    /// The agent's reason, when its report gives one (`beyond_ceiling/capabilities.run`).
    pub why: Option<String>,
    /// How many members fail this way.
    pub members: usize,
}

/// Counts failing members by how they fail, most first (then by state and reason), at
/// most [`MAX_FAILING_KINDS`] kinds.
pub fn tally_failing<'a>(
    failing: impl IntoIterator<Item = &'a crate::wire::ReportedPlugin>,
) -> Vec<Failing> {
    let mut by_kind: std::collections::BTreeMap<(&'static str, Option<String>), usize> =
        std::collections::BTreeMap::new();
    for p in failing {
        *by_kind
            .entry((p.health.as_str(), p.why.clone()))
            .or_default() += 1;
    }
    let mut out: Vec<Failing> = by_kind
        .into_iter()
        .map(|((health, why), members)| Failing {
            health,
            why,
            members,
        })
        .collect();
    out.sort_by_key(|f| std::cmp::Reverse(f.members));
    out.truncate(MAX_FAILING_KINDS);
    out
}

/// The most kinds of failure a rollout view lists.
pub const MAX_FAILING_KINDS: usize = 16;

/// The members of a stage (cumulative) by how they fare.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Counts {
    /// Live members the rollout has reached.
    pub members: usize,
    /// Those that send reports.
    pub reporting: usize,
    /// Those running the change.
    pub running: usize,
    /// Those failing with it.
    pub failed: usize,
    /// Those without a report.
    pub unknown: usize,
}

impl Counts {
    /// Counts one member.
    pub fn add(&mut self, judgement: Judgement) {
        self.members += 1;
        match judgement {
            Judgement::Running => {
                self.reporting += 1;
                self.running += 1;
            }
            Judgement::Failed => {
                self.reporting += 1;
                self.failed += 1;
            }
            Judgement::Pending => self.reporting += 1,
            Judgement::Unknown => self.unknown += 1,
        }
    }

    fn share(&self, n: usize) -> f64 {
        if self.reporting == 0 {
            0.0
        } else {
            n as f64 * 100.0 / self.reporting as f64
        }
    }
}

/// What a look at a stage decides.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Nothing yet.
    Wait,
    /// The stage passed.
    Pass(String),
    /// Stop here.
    Pause(String),
    /// Take the change back.
    RollBack(String),
}

/// Decides on a stage that has run for `elapsed`.
pub fn decide(stage: &Stage, counts: &Counts, elapsed: Duration, status: Status) -> Verdict {
    let failed = counts.share(counts.failed);
    let running = counts.share(counts.running);
    let summary = format!(
        "{} of {} reporting member(s) run the change ({running:.0} %), {} failed ({failed:.0} %), {} without a report",
        counts.running, counts.reporting, counts.failed, counts.unknown
    );
    if counts.reporting > 0 && failed > stage.rollback_failed {
        return Verdict::RollBack(format!(
            "{summary}: more than rollback-failed {} %",
            stage.rollback_failed
        ));
    }
    if status == Status::Paused {
        return Verdict::Wait;
    }
    if counts.reporting > 0 && failed > stage.max_failed {
        return Verdict::Pause(format!(
            "{summary}: more than max-failed {} %",
            stage.max_failed
        ));
    }
    if elapsed >= stage.min_time && counts.reporting > 0 && running >= stage.min_running {
        return Verdict::Pass(format!(
            "{summary}: at least min-running {} % after {:.1} s",
            stage.min_running,
            elapsed.as_secs_f64()
        ));
    }
    Verdict::Wait
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn stage() -> Stage {
        Stage {
            hosts: Vec::new(),
            share: 1000,
            min_time: Duration::from_secs(60),
            min_running: 90.0,
            max_failed: 5.0,
            rollback_failed: 10.0,
        }
    }

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    fn counts(running: usize, failed: usize, pending: usize, unknown: usize) -> Counts {
        let mut c = Counts::default();
        (0..running).for_each(|_| c.add(Judgement::Running));
        (0..failed).for_each(|_| c.add(Judgement::Failed));
        (0..pending).for_each(|_| c.add(Judgement::Pending));
        (0..unknown).for_each(|_| c.add(Judgement::Unknown));
        c
    }

    #[test]
    fn min_time_is_not_passed_a_moment_early() {
        let s = Stage {
            min_time: Duration::from_secs(5),
            ..stage()
        };
        assert_eq!(
            decide(
                &s,
                &counts(10, 0, 0, 0),
                Duration::from_millis(4_999),
                Status::Running
            ),
            Verdict::Wait
        );
        assert!(matches!(
            decide(
                &s,
                &counts(10, 0, 0, 0),
                Duration::from_secs(5),
                Status::Running
            ),
            Verdict::Pass(_)
        ));
    }

    #[test]
    fn a_stage_passes_after_its_time_with_enough_running() {
        let s = stage();
        assert_eq!(
            decide(&s, &counts(10, 0, 0, 3), secs(59), Status::Running),
            Verdict::Wait
        );
        assert!(matches!(
            decide(&s, &counts(10, 0, 0, 3), secs(60), Status::Running),
            Verdict::Pass(_)
        ));
        assert_eq!(
            decide(&s, &counts(8, 0, 2, 0), secs(600), Status::Running),
            Verdict::Wait
        );
        assert_eq!(
            decide(&s, &counts(0, 0, 0, 5), secs(600), Status::Running),
            Verdict::Wait,
            "members without reports never pass a stage"
        );
    }

    #[test]
    fn failures_pause_then_roll_back() {
        let s = stage();
        assert!(matches!(
            decide(&s, &counts(93, 7, 0, 0), secs(0), Status::Running),
            Verdict::Pause(_)
        ));
        assert!(matches!(
            decide(&s, &counts(8, 2, 0, 0), secs(0), Status::Running),
            Verdict::RollBack(_)
        ));
        assert!(matches!(
            decide(&s, &counts(8, 2, 0, 0), secs(0), Status::Paused),
            Verdict::RollBack(_)
        ));
        assert_eq!(
            decide(&s, &counts(100, 0, 0, 0), secs(600), Status::Paused),
            Verdict::Wait
        );
        assert_eq!(
            decide(&s, &counts(95, 5, 0, 50), secs(0), Status::Running),
            Verdict::Wait,
            "unknown members are never counted as failed"
        );
    }
}

#[cfg(test)]
mod judge_tests {
    use serde_json::json;

    use super::*;
    use crate::wire::{PluginHealth, ReportedPlugin};

    fn definition(change: serde_json::Value) -> Definition {
        let serde_json::Value::Object(layer) = json!({"type": "ccmc", "change": change,
                                                       "stages": [{"percent": 100}]})
        else {
            unreachable!()
        };
        Definition::parse("r", &layer).unwrap()
    }

    fn report(applied: i64, plugins: &[(&str, Option<&str>, PluginHealth)]) -> AgentReport {
        AgentReport {
            applied,
            plugins: plugins
                .iter()
                .map(|(n, s, h)| ReportedPlugin {
                    name: (*n).to_owned(),
                    sha256: s.map(str::to_owned),
                    health: *h,
                    why: None,
                })
                .collect(),
        }
    }

    #[test]
    fn a_configuration_change_runs_once_its_revision_is_applied_without_failures() {
        let d = definition(json!({"interval": "5s"}));
        assert_eq!(judge(&d, None, Some(7)), Judgement::Unknown);
        let old = report(6, &[("a", None, PluginHealth::Running)]);
        assert_eq!(judge(&d, Some(&old), Some(7)), Judgement::Pending);
        let applied = report(7, &[("a", None, PluginHealth::Running)]);
        assert_eq!(judge(&d, Some(&applied), Some(7)), Judgement::Running);
        let failing = report(7, &[("a", None, PluginHealth::Quarantined)]);
        assert_eq!(judge(&d, Some(&failing), Some(7)), Judgement::Failed);
    }

    #[test]
    fn a_plugin_change_runs_when_every_named_version_runs() {
        let sha = "ab".repeat(32);
        let d = definition(json!({"plugins": [{"name": "p", "sha256": sha}]}));
        let hash = &sha[..16];
        let old = report(1, &[("p", Some("0123456789abcdef"), PluginHealth::Running)]);
        assert_eq!(judge(&d, Some(&old), None), Judgement::Pending);
        let starting = report(1, &[("p", Some(hash), PluginHealth::Starting)]);
        assert_eq!(judge(&d, Some(&starting), None), Judgement::Pending);
        let running = report(1, &[("p", Some(hash), PluginHealth::Running)]);
        assert_eq!(judge(&d, Some(&running), None), Judgement::Running);
        for bad in [
            PluginHealth::Restarting,
            PluginHealth::Quarantined,
            PluginHealth::DownloadFailed,
            PluginHealth::LoadFailed,
        ] {
            let failed = report(1, &[("p", Some(hash), bad)]);
            assert_eq!(judge(&d, Some(&failed), None), Judgement::Failed, "{bad:?}");
        }
    }

    #[test]
    fn failing_members_are_counted_by_state_and_reason() {
        let sha = "ab".repeat(32);
        let d = definition(json!({"plugins": [{"name": "p", "sha256": sha}]}));
        let hash = &sha[..16];
        let refused = |why: Option<&str>| {
            let mut r = report(
                1,
                &[
                    ("other", None, PluginHealth::Quarantined),
                    ("p", Some(hash), PluginHealth::Refused),
                ],
            );
            r.plugins[1].why = why.map(str::to_owned);
            r
        };
        let ceiling = refused(Some("beyond_ceiling/capabilities.run"));
        // The plugin the change names, not another failing one of the member.
        assert_eq!(failing_plugin(&d, &ceiling).unwrap().name, "p");
        let unsigned = refused(Some("unsigned"));
        let bare = refused(None);
        let download = report(1, &[("p", Some(hash), PluginHealth::DownloadFailed)]);
        let members = [&ceiling, &ceiling, &unsigned, &bare, &download, &ceiling];
        let failing = tally_failing(members.iter().filter_map(|r| failing_plugin(&d, r)));
        let shown: Vec<(&str, Option<&str>, usize)> = failing
            .iter()
            .map(|f| (f.health, f.why.as_deref(), f.members))
            .collect();
        assert_eq!(
            shown,
            [
                ("refused", Some("beyond_ceiling/capabilities.run"), 3),
                ("download-failed", None, 1),
                ("refused", None, 1),
                ("refused", Some("unsigned"), 1),
            ]
        );
        // A change by revision: the first failing plugin of the report.
        let by_revision = definition(json!({"interval": "5s"}));
        assert_eq!(
            failing_plugin(&by_revision, &ceiling).unwrap().name,
            "other"
        );
        let healthy = report(1, &[("p", Some(hash), PluginHealth::Running)]);
        assert!(failing_plugin(&d, &healthy).is_none());
    }
}
