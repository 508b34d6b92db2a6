//! What the agent tells the fleet server it runs ([`ccfleet::wire::AgentReport`]): per
//! plugin its name, the SHA-256 the fleet named for it (none for a plugin configured by
//! path) and how it fares, and the configuration revision its plugins run with. The
//! client sends it with every configuration poll; the server's staged rollouts judge
//! their stages by it.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use ccfleet::client::Client;
use ccfleet::wire::{AgentReport, PluginHealth, ReportedPlugin};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::loops::{AssignmentStage, Assignments};
use super::observe::{ConfigState, ObservedPlugin};
use crate::plugin::grid::GridTimer;
use crate::plugin::{PluginState, PluginStatus};

/// How often the report is brought up to date (it is sent with the next poll).
const REFRESH: Duration = Duration::from_secs(1);

/// How a plugin fares, as the fleet hears it: a version that has not yet shown it works
/// ([`crate::plugin::PluginStatus::proven`]) is still starting, or restarting when it failed
/// before, however briefly it runs between its restarts.
fn health(status: &PluginStatus) -> PluginHealth {
    match status.state {
        PluginState::Starting => PluginHealth::Starting,
        PluginState::Running if status.proven => PluginHealth::Running,
        PluginState::Running if status.last_failure.is_some() && status.restarts > 0 => {
            PluginHealth::Restarting
        }
        PluginState::Running => PluginHealth::Starting,
        PluginState::Backoff => PluginHealth::Restarting,
        PluginState::Quarantined => PluginHealth::Quarantined,
        PluginState::LoadFailed => PluginHealth::LoadFailed,
        PluginState::Stopped => PluginHealth::Stopped,
    }
}

/// The report as of now.
pub(crate) fn build(
    plugins: &RwLock<Vec<ObservedPlugin>>,
    assignments: Option<&Assignments>,
    config: &ConfigState,
) -> AgentReport {
    let assigned = assignments
        .map(|a| a.lock().unwrap_or_else(|e| e.into_inner()).clone())
        .unwrap_or_default();
    let mut report = AgentReport {
        applied: config.revision.trim().parse().unwrap_or(0),
        plugins: Vec::new(),
    };
    let observed = plugins.read().unwrap_or_else(|e| e.into_inner());
    for plugin in observed.iter() {
        let name = plugin.name.to_string();
        let assignment = assigned.get(&name);
        // A version the fleet named that does not run is what the fleet wants to hear of,
        // not the older version still running in its place.
        if assignment.is_some_and(|a| a.problem.is_some()) {
            continue;
        }
        report.plugins.push(ReportedPlugin {
            sha256: assignment.map(|a| a.sha256.clone()),
            health: health(&plugin.status.borrow()),
            name,
            why: None,
        });
    }
    for (name, assignment) in &assigned {
        if assignment.problem.is_some() {
            report.plugins.push(ReportedPlugin {
                name: name.clone(),
                sha256: Some(assignment.sha256.clone()),
                health: if assignment.refusal.is_some() {
                    PluginHealth::Refused
                } else {
                    assigned_health(assignment.stage)
                },
                why: assignment.refusal.clone(),
            });
        }
    }
    report
}

/// How a version the fleet names but that does not run fares, as the fleet hears it.
fn assigned_health(stage: AssignmentStage) -> PluginHealth {
    match stage {
        AssignmentStage::Pending => PluginHealth::Starting,
        AssignmentStage::Running => PluginHealth::Running,
        AssignmentStage::DownloadFailed => PluginHealth::DownloadFailed,
        AssignmentStage::StartFailed => PluginHealth::LoadFailed,
    }
}

/// Keeps the client's report up to date (a forwarder: aborted when the agent stops).
pub(crate) fn spawn(
    client: Client,
    plugins: Arc<RwLock<Vec<ObservedPlugin>>>,
    assignments: Option<Arc<Assignments>>,
    config: watch::Receiver<ConfigState>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut last = None;
        // On the plugins' grid: the refresh falls due with their collects and costs the agent
        // no wake-up of its own.
        let mut ticker = GridTimer::new(REFRESH);
        loop {
            let report = build(&plugins, assignments.as_deref(), &config.borrow());
            if last.as_ref() != Some(&report) {
                client.set_report(&report);
                last = Some(report);
            }
            ticker.tick().await;
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plugin::Failure;

    fn status(state: PluginState, proven: bool, restarts: u32, failed: bool) -> PluginStatus {
        PluginStatus {
            state,
            generation: 1,
            restarts,
            hash: None,
            last_failure: failed.then(|| Failure::Trap {
                call: "collect",
                message: "unreachable".to_owned(),
            }),
            proven,
        }
    }

    fn assigned(stage: AssignmentStage, problem: Option<&str>) -> PluginHealth {
        let assignments: Assignments = Default::default();
        assignments.lock().unwrap().insert(
            "load".to_owned(),
            super::super::loops::Assignment {
                sha256: "ab".repeat(32),
                stage,
                problem: problem.map(str::to_owned),
                refusal: None,
            },
        );
        let config = ConfigState::default();
        let report = build(&RwLock::new(Vec::new()), Some(&assignments), &config);
        assert_eq!(report.plugins.len(), 1, "{report:?}");
        assert_eq!(report.plugins[0].sha256.as_deref(), Some(&*"ab".repeat(32)));
        report.plugins[0].health
    }

    #[test]
    fn a_refused_version_is_reported_with_the_nodes_reason() {
        let assignments: Assignments = Default::default();
        assignments.lock().unwrap().insert(
            "ipmi".to_owned(),
            super::super::loops::Assignment {
                sha256: "cd".repeat(32),
                stage: AssignmentStage::StartFailed,
                problem: Some("refused: capabilities.run.pwn is beyond".to_owned()),
                refusal: Some("beyond_ceiling/capabilities.run".to_owned()),
            },
        );
        let report = build(
            &RwLock::new(Vec::new()),
            Some(&assignments),
            &ConfigState::default(),
        );
        assert_eq!(report.plugins[0].health, PluginHealth::Refused);
        assert_eq!(
            report.plugins[0].why.as_deref(),
            Some("beyond_ceiling/capabilities.run")
        );
        assert!(
            report
                .to_string()
                .ends_with("; why=ipmi:beyond_ceiling/capabilities.run"),
            "{report}"
        );
    }

    #[test]
    fn a_version_being_downloaded_is_starting_not_failed() {
        assert_eq!(
            assigned(
                AssignmentStage::Pending,
                Some("being downloaded and started")
            ),
            PluginHealth::Starting
        );
        assert_eq!(
            assigned(
                AssignmentStage::DownloadFailed,
                Some("download failed: 503")
            ),
            PluginHealth::DownloadFailed
        );
        assert_eq!(
            assigned(AssignmentStage::StartFailed, Some("it does not start")),
            PluginHealth::LoadFailed
        );
    }

    #[test]
    fn a_version_runs_for_the_fleet_only_once_a_call_of_it_returned() {
        use PluginState::*;
        let cases = [
            (status(Running, true, 0, false), PluginHealth::Running),
            (status(Running, true, 2, true), PluginHealth::Running),
            // Loaded, its first collect still to come.
            (status(Running, false, 0, false), PluginHealth::Starting),
            // Up again between two traps: still failing as far as a rollout is concerned.
            (status(Running, false, 1, true), PluginHealth::Restarting),
            // A new version after an old one's failure: its own record is clean.
            (status(Running, false, 0, true), PluginHealth::Starting),
            (status(Backoff, false, 1, true), PluginHealth::Restarting),
            (
                status(Quarantined, false, 5, true),
                PluginHealth::Quarantined,
            ),
        ];
        for (status, expected) in cases {
            assert_eq!(health(&status), expected, "{status:?}");
        }
    }
}
