//! Staged, health-gated rollouts of configuration changes (a plugin's new SHA-256 or any
//! other key), defined in the configuration tree (`rollouts/<name>.json`, see
//! [`definition`]).
//!
//! - A rollout's change reaches its stages one after another: the configuration served to
//!   a member the rollout has reached is the tree's with the change merged last; every
//!   other member is served the tree as it is.
//! - Agents report what they run with each configuration poll ([`crate::wire::AgentReport`]);
//!   the server keeps the latest report per member, in memory (soft state: after a restart
//!   it is back within one poll interval, and a stage's `min-time` covers that). Servers
//!   sharing a JetStream registry pass the reports that changed on to each other over NATS
//!   ([`share`]), so the lease holder judges every member, whichever server it polls.
//! - One task per server (`spawn`) looks at every rollout each second. On the server
//!   that leads (the only one with a registry of its own, or the lease holder of a shared
//!   one) it checks, every `fleet.rollout-interval` (default 5 s), the current stage's
//!   gates ([`gates`]) and advances, pauses or rolls back; every decision is logged once
//!   with its reason, counted, and saved in the registry (SQLite or the JetStream
//!   bucket), so a restarted server or the next lease holder continues where it was. The other servers read the saved progress each tick
//!   and serve accordingly.
//! - Operators read and steer rollouts through `GET /api/fleet/rollouts` and `POST
//!   /api/fleet/rollouts/{name}/{pause,resume,abort}` (`api`), which `ccfleet rollout`
//!   uses.

pub(crate) mod api;
pub mod definition;
pub mod gates;
#[cfg(feature = "schema")]
pub mod schema;
pub mod share;
pub mod state;

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::configtree::ConfigTree;
use super::leader;
use super::registry::{self, Registry, Service, State};
use crate::wire::AgentReport;
pub use definition::Definition;
pub use gates::Counts;
pub use state::{RolloutState, Status};

/// How often rollouts are looked at.
pub const TICK: Duration = Duration::from_secs(1);
/// Reports kept at most (one per member): a flood of made-up members cannot grow the
/// server without bound.
pub const MAX_REPORTS: usize = 1_000_000;

/// The key of a member's report: its cluster, type and host name (never its instance id).
fn member_key(cluster: &str, service: &Service) -> String {
    format!(
        "{cluster}|{}|{}",
        service.service_type.code(),
        service.hostname
    )
}

/// Unix milliseconds now.
fn unix_millis() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// Counters for `/metrics`.
#[derive(Debug, Default)]
pub struct RolloutCounters {
    /// Stages passed.
    pub advances: AtomicU64,
    /// Rollouts paused (by their gates or an operator).
    pub pauses: AtomicU64,
    /// Rollouts rolled back by their gates.
    pub rollbacks: AtomicU64,
    /// Rollouts completed.
    pub completions: AtomicU64,
    /// Rollouts aborted by an operator.
    pub aborts: AtomicU64,
    /// Reports refused as malformed.
    pub bad_reports: AtomicU64,
    /// Reports published for the other servers of a shared registry.
    pub reports_shared: AtomicU64,
    /// Reports taken over from the other servers.
    pub reports_received: AtomicU64,
    /// Shared reports (or whole messages) from other servers refused as malformed.
    pub bad_shared_reports: AtomicU64,
}

/// A member's latest report, as kept.
struct Kept {
    report: Arc<AgentReport>,
    /// Unix milliseconds a server received this report (a change of it).
    at: i64,
    /// When this server last published it or took it over from another server (`None`:
    /// never shared).
    shared: Option<Instant>,
    /// Whether an agent sent it to this server (rather than another server passing it on).
    here: bool,
}

/// The rollouts a server knows, their progress and the agents' reports.
#[derive(Default)]
pub struct Rollouts {
    definitions: RwLock<Vec<Arc<Definition>>>,
    states: RwLock<HashMap<String, RolloutState>>,
    reports: Mutex<HashMap<String, Kept>>,
    /// Whether reports are shared with other servers ([`share`]).
    sharing: AtomicBool,
    /// Reports to publish: member key to (received at, report text); the latest per member.
    outbox: Mutex<HashMap<String, (i64, String)>>,
    /// Definitions the last refresh refused, with why (the previous version stays).
    problems: Mutex<Vec<String>>,
    /// The counters.
    pub counters: RolloutCounters,
}

impl Rollouts {
    /// Empty.
    pub fn new() -> Rollouts {
        Rollouts::default()
    }

    /// The current definitions.
    pub fn definitions(&self) -> Vec<Arc<Definition>> {
        self.definitions
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// A rollout's progress.
    pub fn state(&self, name: &str) -> Option<RolloutState> {
        self.states
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(name)
            .cloned()
    }

    fn set_state(&self, name: &str, state: RolloutState) {
        self.states
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(name.to_owned(), state);
    }

    /// What the last refresh refused.
    pub fn problems(&self) -> Vec<String> {
        self.problems
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Re-reads the definitions from the tree (`rollouts/*.json`). A definition that does not
    /// parse, names a plugin `known` does not hold, or overlaps another rollout is refused
    /// and its previous version (if any) kept; returns the refusals.
    pub fn refresh(&self, tree: &ConfigTree, known: &dyn Fn(&str) -> bool) -> Vec<String> {
        let previous = self.definitions();
        let mut next: Vec<Arc<Definition>> = Vec::new();
        let mut problems = Vec::new();
        for (name, layer) in tree.rollout_layers() {
            let parsed = Definition::parse(&name, &layer).and_then(|d| {
                match d.plugins.iter().find(|(_, sha)| !known(sha)) {
                    Some((plugin, sha)) => Err(format!(
                        "plugin {plugin:?} names sha256 {sha}, which fleet.plugin-dir does not hold"
                    )),
                    None => Ok(d),
                }
            });
            let parsed = parsed.and_then(|d| {
                match next.iter().find(|o| {
                    o.service_type == d.service_type
                        && (o.cluster.is_none() || d.cluster.is_none() || o.cluster == d.cluster)
                }) {
                    Some(other) => Err(format!(
                        "it covers members rollout {:?} covers too; one rollout per type and cluster at a time",
                        other.name
                    )),
                    None => Ok(d),
                }
            });
            match parsed {
                Ok(d) => next.push(Arc::new(d)),
                Err(e) => {
                    problems.push(format!("rollouts/{name}.json: {e}"));
                    if let Some(old) = previous.iter().find(|d| d.name == name) {
                        next.push(old.clone());
                    }
                }
            }
        }
        let old_problems = std::mem::replace(
            &mut *self.problems.lock().unwrap_or_else(|e| e.into_inner()),
            problems.clone(),
        );
        for p in problems.iter().filter(|p| !old_problems.contains(p)) {
            tracing::error!("fleet: rollout refused, the previous version (if any) stays: {p}");
        }
        *self.definitions.write().unwrap_or_else(|e| e.into_inner()) = next;
        problems
    }

    /// Records a member's report (from its configuration poll); with a shared registry a
    /// changed report (or one nobody shared for [`share::REFRESH`]) is queued for the other
    /// servers.
    pub fn record_report(&self, service: &Service, report: AgentReport) {
        let key = member_key(&service.cluster, service);
        let sharing = self.sharing.load(Ordering::Relaxed);
        let now = Instant::now();
        let mut reports = self.reports.lock().unwrap_or_else(|e| e.into_inner());
        let full = reports.len() >= MAX_REPORTS;
        let fresh = |report| Kept {
            report: Arc::new(report),
            at: unix_millis(),
            shared: None,
            here: true,
        };
        let kept = match reports.entry(key.clone()) {
            Entry::Occupied(entry) => {
                let kept = entry.into_mut();
                if *kept.report == report {
                    kept.here = true;
                    // Unchanged, what nearly every poll sends: shared already (or no one
                    // to share with).
                    if !sharing || kept.shared.is_some_and(|t| now - t < share::REFRESH) {
                        return;
                    }
                } else {
                    *kept = fresh(report);
                }
                kept
            }
            Entry::Vacant(_) if full => return,
            Entry::Vacant(entry) => entry.insert(fresh(report)),
        };
        if sharing {
            kept.shared = Some(now);
            let text = kept.report.to_string();
            let at = kept.at;
            drop(reports);
            self.outbox
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(key, (at, text));
        }
    }

    /// Takes over reports other servers received; an older change than the one kept is
    /// ignored.
    pub(crate) fn record_shared(&self, shared: Vec<(String, i64, AgentReport)>) {
        let now = Instant::now();
        let mut taken = 0u64;
        let mut reports = self.reports.lock().unwrap_or_else(|e| e.into_inner());
        for (key, at, report) in shared {
            let full = reports.len() >= MAX_REPORTS;
            match reports.get_mut(&key) {
                Some(kept) if kept.at > at => {}
                Some(kept) => {
                    if *kept.report != report {
                        kept.report = Arc::new(report);
                        kept.here = false;
                    }
                    kept.at = at;
                    kept.shared = Some(now);
                    taken += 1;
                }
                None if full => {}
                None => {
                    reports.insert(
                        key,
                        Kept {
                            report: Arc::new(report),
                            at,
                            shared: Some(now),
                            here: false,
                        },
                    );
                    taken += 1;
                }
            }
        }
        drop(reports);
        self.counters
            .reports_received
            .fetch_add(taken, Ordering::Relaxed);
    }

    /// Queues every report agents sent to this server (a server that started asks for
    /// them); returns how many.
    pub(crate) fn queue_received_here(&self) -> usize {
        let now = Instant::now();
        let mut queued = Vec::new();
        {
            let mut reports = self.reports.lock().unwrap_or_else(|e| e.into_inner());
            for (key, kept) in reports.iter_mut().filter(|(_, k)| k.here) {
                kept.shared = Some(now);
                queued.push((key.clone(), (kept.at, kept.report.to_string())));
            }
        }
        let n = queued.len();
        self.outbox
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend(queued);
        n
    }

    /// From now on, reports are queued for the other servers.
    pub(crate) fn start_sharing(&self) {
        self.sharing.store(true, Ordering::Relaxed);
    }

    /// The latest report of a member.
    pub fn report(&self, service: &Service) -> Option<Arc<AgentReport>> {
        self.reports
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&member_key(&service.cluster, service))
            .map(|k| k.report.clone())
    }

    /// The rollout whose change a member is served now, if any.
    pub fn overlay(&self, service: &Service) -> Option<Arc<Definition>> {
        let definitions = self.definitions.read().unwrap_or_else(|e| e.into_inner());
        let states = self.states.read().unwrap_or_else(|e| e.into_inner());
        definitions
            .iter()
            .find(|d| {
                d.covers(service.service_type, &service.cluster)
                    && states
                        .get(&d.name)
                        .filter(|s| s.digest == d.digest)
                        .is_some_and(|s| {
                            s.status.serves_change()
                                && d.reaches(s.stage, &service.cluster, &service.hostname)
                        })
            })
            .cloned()
    }
}

/// The revision of a member's configuration with `definition`'s change (if any) merged in.
fn revision_with(
    tree: &ConfigTree,
    service: &Service,
    definition: Option<&Definition>,
) -> Option<i64> {
    let key = definition.map(Definition::overlay_key);
    tree.resolve_with(
        service.scope,
        &service.cluster,
        service.service_type,
        &service.hostname,
        key.as_deref().zip(definition.map(|d| &d.change)),
    )
    .map(|r| r.revision)
}

/// The state document's name in the registry.
fn state_key(name: &str) -> String {
    format!("rollout.{name}")
}

async fn load_state(registry: &Registry, name: &str) -> Option<RolloutState> {
    match registry.get_state(&state_key(name)).await {
        Ok(Some(bytes)) => match serde_json::from_slice(&bytes) {
            Ok(state) => Some(state),
            Err(e) => {
                tracing::error!(
                    "fleet: rollout {name}: its saved progress does not parse ({e}); it starts again"
                );
                None
            }
        },
        Ok(None) => None,
        Err(e) => {
            tracing::warn!("fleet: rollout {name}: cannot read its saved progress: {e}");
            None
        }
    }
}

async fn save_state(registry: &Registry, name: &str, state: &RolloutState) -> bool {
    let bytes = serde_json::to_vec(state).expect("a rollout state serializes");
    match registry.put_state(&state_key(name), bytes).await {
        Ok(()) => true,
        Err(e) => {
            tracing::error!(
                "fleet: rollout {name}: cannot save its progress ({e}); the decision is retried"
            );
            false
        }
    }
}

/// Changes a rollout's state: saved first, then taken over, logged once and counted.
pub(crate) async fn decide(
    rollouts: &Rollouts,
    registry: &Registry,
    definition: &Definition,
    mut next: RolloutState,
    reason: String,
) -> bool {
    let previous = rollouts.state(&definition.name);
    next.epoch = previous.as_ref().map_or(0, |p| p.epoch) + 1;
    next.reason = reason.clone();
    next.updated_at = registry::unix_seconds();
    if !save_state(registry, &definition.name, &next).await {
        return false;
    }
    let c = &rollouts.counters;
    let what = match next.status {
        Status::Running if previous.as_ref().is_some_and(|p| p.stage < next.stage) => {
            c.advances.fetch_add(1, Ordering::Relaxed);
            format!("advanced to stage {}", next.stage)
        }
        Status::Running => format!("runs stage {}", next.stage),
        Status::Paused => {
            c.pauses.fetch_add(1, Ordering::Relaxed);
            format!("paused at stage {}", next.stage)
        }
        Status::Completed => {
            c.completions.fetch_add(1, Ordering::Relaxed);
            "completed".to_owned()
        }
        Status::RolledBack => {
            c.rollbacks.fetch_add(1, Ordering::Relaxed);
            format!("rolled back at stage {}", next.stage)
        }
        Status::Aborted => {
            c.aborts.fetch_add(1, Ordering::Relaxed);
            format!("aborted at stage {}", next.stage)
        }
    };
    match next.status {
        Status::RolledBack | Status::Paused => {
            tracing::warn!("fleet: rollout {} {what}: {reason}", definition.name)
        }
        _ => tracing::info!("fleet: rollout {} {what}: {reason}", definition.name),
    }
    rollouts.set_state(&definition.name, next);
    true
}

/// Counts of a rollout's current stage, from the live members and their reports.
pub fn counts(
    rollouts: &Rollouts,
    registry: &Registry,
    tree: &ConfigTree,
    definition: &Definition,
    state: &RolloutState,
) -> Counts {
    tally(rollouts, registry, tree, definition, state, |_| {})
}

/// [`counts`], and the failing members by how they fail ([`gates::tally_failing`]).
pub fn counts_and_failing(
    rollouts: &Rollouts,
    registry: &Registry,
    tree: &ConfigTree,
    definition: &Definition,
    state: &RolloutState,
) -> (Counts, Vec<gates::Failing>) {
    let mut failing = Vec::new();
    let counts = tally(rollouts, registry, tree, definition, state, |report| {
        if let Some(plugin) = gates::failing_plugin(definition, report) {
            failing.push(plugin.clone());
        }
    });
    (counts, gates::tally_failing(&failing))
}

/// Judges every reached member, handing the report of each failed one to `on_failed`.
fn tally(
    rollouts: &Rollouts,
    registry: &Registry,
    tree: &ConfigTree,
    definition: &Definition,
    state: &RolloutState,
    mut on_failed: impl FnMut(&AgentReport),
) -> Counts {
    let mut counts = Counts::default();
    for service in registry.active() {
        if service.state == State::Deregistered
            || !definition.covers(service.service_type, &service.cluster)
            || !definition.reaches(state.stage, &service.cluster, &service.hostname)
        {
            continue;
        }
        // A reached member is served the change; only a change naming no plugin version is
        // judged by the revision (resolving every member's configuration costs the most).
        let expected = if definition.plugins.is_empty() {
            revision_with(tree, &service, Some(definition))
        } else {
            None
        };
        let report = rollouts.report(&service);
        let judgement = gates::judge(definition, report.as_deref(), expected);
        if judgement == gates::Judgement::Failed
            && let Some(report) = report.as_deref()
        {
            on_failed(report);
        }
        counts.add(judgement);
    }
    counts
}

/// One look at one rollout by the leading server.
async fn step(
    rollouts: &Rollouts,
    registry: &Registry,
    tree: &ConfigTree,
    definition: &Definition,
) {
    // An operator's decision taken through another server is saved with a later epoch.
    follow(rollouts, registry, definition).await;
    let now = state::unix_millis();
    let state = match rollouts.state(&definition.name) {
        Some(s) if s.digest == definition.digest => s,
        _ => {
            let stored = load_state(registry, &definition.name).await;
            match stored.filter(|s| s.digest == definition.digest) {
                Some(s) => {
                    tracing::info!(
                        "fleet: rollout {} continues at stage {} ({})",
                        definition.name,
                        s.stage,
                        s.status.as_str()
                    );
                    rollouts.set_state(&definition.name, s);
                    return;
                }
                None => {
                    let fresh = RolloutState::start(definition.digest, now);
                    decide(
                        rollouts,
                        registry,
                        definition,
                        fresh,
                        format!(
                            "a new rollout of {} stage(s) for type {}{}",
                            definition.stages.len(),
                            definition.service_type.code(),
                            definition
                                .cluster
                                .as_deref()
                                .map(|c| format!(" in cluster {c}"))
                                .unwrap_or_default()
                        ),
                    )
                    .await;
                    return;
                }
            }
        }
    };
    if !matches!(state.status, Status::Running | Status::Paused) {
        return;
    }
    let counts = counts(rollouts, registry, tree, definition, &state);
    let stage = &definition.stages[state.stage];
    match gates::decide(stage, &counts, state.stage_elapsed(now), state.status) {
        gates::Verdict::Wait => {}
        gates::Verdict::RollBack(reason) => {
            let next = RolloutState {
                status: Status::RolledBack,
                ..state
            };
            decide(rollouts, registry, definition, next, reason).await;
        }
        gates::Verdict::Pause(reason) => {
            let next = RolloutState {
                status: Status::Paused,
                ..state
            };
            decide(rollouts, registry, definition, next, reason).await;
        }
        gates::Verdict::Pass(reason) => {
            let next = if state.stage + 1 == definition.stages.len() {
                RolloutState {
                    status: Status::Completed,
                    ..state
                }
            } else {
                let stage = state.stage + 1;
                state.stage_starting(stage, now)
            };
            decide(rollouts, registry, definition, next, reason).await;
        }
    }
}

/// One look at one rollout by a server that does not lead: take over saved progress.
async fn follow(rollouts: &Rollouts, registry: &Registry, definition: &Definition) {
    let Some(stored) = load_state(registry, &definition.name).await else {
        return;
    };
    let newer = rollouts
        .state(&definition.name)
        .is_none_or(|s| s.digest != stored.digest || s.epoch < stored.epoch);
    if newer && stored.digest == definition.digest {
        rollouts.set_state(&definition.name, stored);
    }
}

/// Looks at every rollout each [`TICK`]; see the module documentation.
pub(crate) fn spawn(
    rollouts: Arc<Rollouts>,
    registry: Registry,
    tree: Arc<ConfigTree>,
    known: Arc<dyn Fn(&str) -> bool + Send + Sync>,
    gate: leader::Gate,
    judge_every: Duration,
    mut shutdown: watch::Receiver<bool>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut ticker = tokio::time::interval(TICK);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut judged: Option<tokio::time::Instant> = None;
        loop {
            tokio::select! {
                _ = super::stopped(&mut shutdown) => return,
                _ = ticker.tick() => {
                    // A plugin unknown to the index rescans `plugin-dir`: file system work.
                    let (r, t, k) = (rollouts.clone(), tree.clone(), known.clone());
                    if tokio::task::spawn_blocking(move || r.refresh(&t, &*k)).await.is_err() {
                        continue;
                    }
                    // Judging looks at every covered member: every `judge_every`, while
                    // decisions saved by other servers are taken over every tick.
                    let judge = gate.is_leader()
                        && judged.is_none_or(|at| at.elapsed() + TICK / 2 >= judge_every);
                    if judge {
                        judged = Some(tokio::time::Instant::now());
                    }
                    for definition in rollouts.definitions() {
                        if judge {
                            step(&rollouts, &registry, &tree, &definition).await;
                        } else {
                            follow(&rollouts, &registry, &definition).await;
                        }
                    }
                }
            }
        }
    })
}

impl Rollouts {
    /// The rollouts' lines of `/metrics` (Prometheus text format).
    pub fn render_metrics(&self) -> String {
        use std::fmt::Write as _;
        let c = &self.counters;
        let mut out = String::new();
        for (name, help, value) in [
            (
                "ccfleet_rollout_stage_advances_total",
                "Stages of staged rollouts passed.",
                &c.advances,
            ),
            (
                "ccfleet_rollout_pauses_total",
                "Staged rollouts paused (by their gates or an operator).",
                &c.pauses,
            ),
            (
                "ccfleet_rollout_rollbacks_total",
                "Staged rollouts rolled back by their gates.",
                &c.rollbacks,
            ),
            (
                "ccfleet_rollout_completions_total",
                "Staged rollouts completed.",
                &c.completions,
            ),
            (
                "ccfleet_rollout_aborts_total",
                "Staged rollouts aborted by an operator.",
                &c.aborts,
            ),
            (
                "ccfleet_agent_reports_refused_total",
                "Agent reports refused as malformed.",
                &c.bad_reports,
            ),
            (
                "ccfleet_rollout_reports_shared_total",
                "Agent reports published for the other servers of a shared registry.",
                &c.reports_shared,
            ),
            (
                "ccfleet_rollout_reports_received_total",
                "Agent reports taken over from the other servers of a shared registry.",
                &c.reports_received,
            ),
            (
                "ccfleet_rollout_shared_reports_refused_total",
                "Shared agent reports (or messages) from other servers refused as malformed.",
                &c.bad_shared_reports,
            ),
        ] {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}",
                value.load(Ordering::Relaxed)
            );
        }
        let _ = writeln!(
            out,
            "# HELP ccfleet_rollout_stage The current stage of each staged rollout (from 0), by status.\n# TYPE ccfleet_rollout_stage gauge"
        );
        for d in self.definitions() {
            if let Some(s) = self.state(&d.name).filter(|s| s.digest == d.digest) {
                let _ = writeln!(
                    out,
                    "ccfleet_rollout_stage{{rollout=\"{}\",status=\"{}\"}} {}",
                    d.name,
                    s.status.as_str(),
                    s.stage
                );
            }
        }
        let _ = writeln!(
            out,
            "# HELP ccfleet_rollouts_refused Rollout definitions refused at the last look.\n# TYPE ccfleet_rollouts_refused gauge\nccfleet_rollouts_refused {}",
            self.problems().len()
        );
        out
    }
}
