//! One tokio task per plugin, owning the plugin's only `Store`.
//!
//! The task loads the component, instantiates it from its `InstancePre`, calls `init`, replays
//! the latest configuration, roster and instance set, and then waits on those watch channels,
//! the collect interval, a file-change check and a stop signal. A trap, a deadline or a memory
//! overrun drops the store; the task restarts the plugin after a backoff while its restart
//! budget lasts (the budget is restored after a healthy period) and quarantines it otherwise,
//! until its file changes.
//!
//! Replaying is what makes restarts safe, and also what could make a bad snapshot fatal: a
//! plugin that traps on one roster would be replayed that roster after every restart until
//! its budget is spent. So a snapshot that ended two instances in a row while being
//! delivered is withheld from the plugin until a different one replaces it; the restart
//! that follows the withholding costs no budget. A plugin quarantined by a snapshot (its
//! budget spent before the second failure) gets one more try when that feed publishes a new
//! snapshot.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use ccfleet::untrusted::Untrusted;

use super::commands::CommandGrants;
use super::engine::{FileStamp, LoadedPlugin, Runtime};
use super::events::{EventKind, PluginEvent};
use super::feeds::Feeds;
use super::grid::GridTimer;
use super::handle::{PluginHandle, PluginState, PluginStatus};
use super::instance::{CallResult, Instance};
use super::logs::{LogGate, MAX_ERROR_MESSAGE};
use super::restart::{Decision, RestartPolicy};
use super::sink::SinkHandle;
use super::spec::PluginSpec;
use super::stats::{CallOutcome, PluginStats};
use crate::plugin::Failure;
use crate::plugin::types::{ConfigUpdate, Instance as DiscoveredInstance, Provider};

impl Runtime {
    /// Starts a supervised plugin: loads it, instantiates it, feeds it and restarts it on
    /// failure, until the returned handle is stopped or dropped.
    pub fn spawn(&self, spec: PluginSpec, feeds: Feeds, sink: SinkHandle) -> PluginHandle {
        spawn(self.clone(), spec, feeds, sink)
    }
}

fn spawn(runtime: Runtime, spec: PluginSpec, feeds: Feeds, sink: SinkHandle) -> PluginHandle {
    let name: Arc<str> = spec.display_name().into();
    let (status_tx, status) = watch::channel(PluginStatus {
        state: PluginState::Starting,
        generation: 0,
        restarts: 0,
        hash: None,
        last_failure: None,
        proven: spec.collect_interval.is_none(),
    });
    let (stop, stop_rx) = watch::channel(false);
    let logs = LogGate::new(&spec.limits);
    let stats = Arc::new(PluginStats::default());
    let sink = sink.counted(stats.clone());
    let supervisor = Supervisor {
        policy: RestartPolicy::new(&spec.limits),
        runtime,
        name: name.clone(),
        spec,
        feeds,
        sink,
        stop: stop_rx,
        status: status_tx,
        generation: 0,
        seen_stamp: None,
        logs,
        in_flight: None,
        crashed_on: None,
        withheld: Vec::new(),
        stats: stats.clone(),
        failing: Vec::new(),
        commands: Arc::new(CommandGrants::none(stats.commands().clone())),
        grants_shown: false,
    };
    let task = tokio::spawn(supervisor.run());
    PluginHandle::new(name, status, stop, task, stats)
}

/// A snapshot as delivered to a plugin, compared by content.
#[derive(Debug, Clone, PartialEq)]
enum Snapshot {
    Config(ConfigUpdate),
    Roster(Arc<Vec<Provider>>),
    Instances(Arc<Vec<DiscoveredInstance>>),
}

impl Snapshot {
    fn call(&self) -> &'static str {
        match self {
            Snapshot::Config(_) => "on-config",
            Snapshot::Roster(_) => "on-roster",
            Snapshot::Instances(_) => "on-instances",
        }
    }
}

enum Exit {
    Stop,
    Failed(Failure),
    Reload(LoadedPlugin),
}

/// How a wait for a file change ended.
enum Wake {
    Stop,
    Changed,
    Elapsed,
    /// The feed whose snapshot ended the plugin published a new one.
    Fed,
}

struct Supervisor {
    runtime: Runtime,
    name: Arc<str>,
    spec: PluginSpec,
    feeds: Feeds,
    sink: SinkHandle,
    stop: watch::Receiver<bool>,
    status: watch::Sender<PluginStatus>,
    policy: RestartPolicy,
    generation: u64,
    /// The file version last looked at, so a file that failed to load is retried only once
    /// it changes again.
    seen_stamp: Option<FileStamp>,
    /// The plugin's log budget, shared by all its instances.
    logs: LogGate,
    /// The snapshot being delivered right now.
    in_flight: Option<Snapshot>,
    /// The snapshot whose delivery ended the last instance, and how many instances in a row
    /// it has ended.
    crashed_on: Option<(Snapshot, u32)>,
    /// Snapshots not delivered again until replaced (at most one per feed).
    withheld: Vec<Snapshot>,
    /// Calls, their outcomes and latency, for the agent's metrics.
    stats: Arc<PluginStats>,
    /// The calls failing now with the error each last returned: a call that fails the same
    /// way round after round (a collector on a node without its hardware) is logged once,
    /// then again when its error changes, and its recovery is logged too.
    failing: Vec<(&'static str, String)>,
    /// The commands the plugin may run, opened whenever its file is (re)loaded and shared
    /// by the instances of that version.
    commands: Arc<CommandGrants>,
    /// Whether the plugin's grants were logged (once, at its first start).
    grants_shown: bool,
}

impl Supervisor {
    fn event(&self, kind: EventKind) {
        let _ = self.runtime.events().send(PluginEvent {
            plugin: self.name.clone(),
            generation: self.generation,
            kind,
        });
    }

    fn set_state(&self, state: PluginState, failure: Option<Failure>) {
        let restarts = self.policy.restarts();
        let generation = self.generation;
        self.status.send_modify(|s| {
            s.state = state;
            s.generation = generation;
            s.restarts = restarts;
            if failure.is_some() {
                s.last_failure = failure;
                s.proven = false;
            }
        });
    }

    fn stopping(&self) -> bool {
        *self.stop.borrow()
    }

    async fn run(mut self) {
        let mut loaded: Option<LoadedPlugin> = None;
        while !self.stopping() {
            let current = match loaded.take() {
                Some(current) => current,
                None => match self.load().await {
                    Some(current) => current,
                    None => break,
                },
            };
            self.generation += 1;
            let started = Instant::now();
            self.set_state(PluginState::Starting, None);
            let begun = Instant::now();
            let instance = Instance::start(
                &self.runtime,
                &current,
                &self.spec,
                self.name.clone(),
                self.generation,
                self.sink.clone(),
                self.logs.clone(),
                self.commands.clone(),
            )
            .await;
            // Instantiation and `init` count as the `init` call.
            let outcome = match &instance {
                Ok(_) => CallOutcome::Ok,
                Err(Failure::Init(_)) => CallOutcome::Error,
                Err(_) => CallOutcome::Failed,
            };
            self.stats.record_call("init", outcome, begun.elapsed());
            let exit = match instance {
                Ok(mut instance) => {
                    tracing::info!(
                        plugin = &*self.name,
                        generation = self.generation,
                        "plugin started"
                    );
                    if !std::mem::replace(&mut self.grants_shown, true) {
                        tracing::info!(
                            plugin = &*self.name,
                            "plugin grants: {}",
                            super::grants::summary(&self.spec)
                        );
                    }
                    // State first: whoever reacts to the event sees the state it announces.
                    self.set_state(PluginState::Running, None);
                    self.event(EventKind::Started);
                    self.serve(&mut instance, &current).await
                }
                Err(failure) => Exit::Failed(failure),
            };
            match exit {
                Exit::Stop => break,
                Exit::Reload(next) => {
                    tracing::info!(plugin = &*self.name, hash = %next.hash, "plugin file changed; reloading");
                    self.event(EventKind::Reloading);
                    self.policy.reset();
                    // A new version's failures are news.
                    self.failing.clear();
                    self.open_commands().await;
                    let proven = self.spec.collect_interval.is_none();
                    self.status.send_modify(|s| {
                        s.hash = Some(next.hash.clone());
                        s.proven = proven;
                    });
                    loaded = Some(next);
                }
                Exit::Failed(failure) => {
                    tracing::warn!(
                        plugin = &*self.name,
                        kind = failure.kind(),
                        "plugin failed: {failure}"
                    );
                    self.event(EventKind::Crashed {
                        failure: failure.clone(),
                    });
                    let decision = if self.blame_snapshot(&failure) {
                        // The cause is known and kept away: this restart is on the house.
                        Decision::Restart {
                            delay: self.spec.limits.restart_backoff,
                            restarts: self.policy.restarts(),
                        }
                    } else {
                        self.policy.on_failure(started, Instant::now())
                    };
                    match decision {
                        Decision::Restart { delay, restarts } => {
                            self.stats.restarted();
                            self.set_state(PluginState::Backoff, Some(failure));
                            self.event(EventKind::Restarting { delay, restarts });
                            match self.wait_for_change(Some(delay)).await {
                                Wake::Stop => break,
                                // A new file version gets a fresh load and a fresh budget.
                                Wake::Changed => self.policy.reset(),
                                Wake::Elapsed | Wake::Fed => loaded = Some(current),
                            }
                        }
                        Decision::Quarantine { restarts } => {
                            tracing::error!(
                                plugin = &*self.name,
                                restarts,
                                "plugin quarantined until its file changes"
                            );
                            self.stats.quarantined();
                            self.set_state(PluginState::Quarantined, Some(failure));
                            self.event(EventKind::Quarantined { restarts });
                            match self.wait_in_quarantine().await {
                                Wake::Stop => break,
                                Wake::Changed | Wake::Elapsed => self.policy.reset(),
                                // One more try with the new snapshot, still without budget:
                                // failing again quarantines it again.
                                Wake::Fed => loaded = Some(current),
                            }
                        }
                    }
                }
            }
        }
        self.set_state(PluginState::Stopped, None);
        self.event(EventKind::Stopped);
    }

    /// Loads the component, waiting for the file to change while it cannot be loaded.
    /// `None` means the plugin was stopped.
    async fn load(&mut self) -> Option<LoadedPlugin> {
        loop {
            self.seen_stamp = FileStamp::of(&self.spec.path);
            match self.runtime.load(&self.spec).await {
                Ok(loaded) => {
                    self.open_commands().await;
                    self.event(EventKind::Loaded {
                        hash: loaded.hash.clone(),
                        cached: loaded.cached,
                    });
                    self.status
                        .send_modify(|s| s.hash = Some(loaded.hash.clone()));
                    return Some(loaded);
                }
                Err(error) => {
                    tracing::error!(plugin = &*self.name, "cannot load plugin: {error}");
                    self.set_state(PluginState::LoadFailed, None);
                    self.event(EventKind::LoadFailed {
                        error: error.to_string(),
                    });
                    if let Wake::Stop = self.wait_for_change(None).await {
                        return None;
                    }
                }
            }
        }
    }

    /// Checks and opens the plugin's granted commands (`capabilities.run`), logging those
    /// that cannot be run; off the runtime's workers, as looking a user up may ask a
    /// directory service.
    async fn open_commands(&mut self) {
        let stats = self.stats.commands().clone();
        let run = &self.spec.capabilities.run;
        if run.is_empty() {
            self.commands = Arc::new(CommandGrants::none(stats));
            return;
        }
        let (run, counted) = (run.clone(), stats.clone());
        let opened =
            match tokio::task::spawn_blocking(move || CommandGrants::open(&run, counted)).await {
                Ok(opened) => opened,
                Err(e) => {
                    tracing::error!(plugin = &*self.name, "cannot open granted commands: {e}");
                    CommandGrants::none(stats)
                }
            };
        for (command, why) in opened.unusable() {
            tracing::error!(
                plugin = &*self.name,
                command,
                "granted command cannot be run: {why}"
            );
        }
        self.commands = Arc::new(opened);
    }

    /// Waits until the plugin file changes, the plugin is stopped, or `limit` passes.
    async fn wait_for_change(&mut self, limit: Option<Duration>) -> Wake {
        let deadline = limit.map(|l| tokio::time::Instant::now() + l);
        let mut check = watch_interval(self.runtime.options().watch_interval);
        loop {
            tokio::select! {
                _ = self.stop.changed() => return Wake::Stop,
                _ = sleep_until(deadline) => return Wake::Elapsed,
                _ = check.tick() => {
                    let stamp = FileStamp::of(&self.spec.path);
                    if stamp != self.seen_stamp {
                        return Wake::Changed;
                    }
                }
            }
        }
    }

    /// Waits in quarantine until the file changes or the plugin is stopped; when a snapshot
    /// ended the plugin, also until its feed publishes a new one, so a plugin is never
    /// quarantined for good by a snapshot that has since been replaced.
    async fn wait_in_quarantine(&mut self) -> Wake {
        let feed = self
            .crashed_on
            .as_ref()
            .map(|(snapshot, _)| snapshot.call());
        let mut check = watch_interval(self.runtime.options().watch_interval);
        loop {
            tokio::select! {
                _ = self.stop.changed() => return Wake::Stop,
                Ok(()) = self.feeds.config.changed(), if feed == Some("on-config") => return Wake::Fed,
                Ok(()) = self.feeds.roster.changed(), if feed == Some("on-roster") => return Wake::Fed,
                Ok(()) = self.feeds.instances.changed(), if feed == Some("on-instances") => {
                    return Wake::Fed;
                }
                _ = check.tick() => {
                    let stamp = FileStamp::of(&self.spec.path);
                    if stamp != self.seen_stamp {
                        return Wake::Changed;
                    }
                }
            }
        }
    }

    /// Turns a call result into the supervisor's view: plugin errors are logged and
    /// survived, failures end the instance.
    fn settle(
        &mut self,
        call: &'static str,
        begun: Instant,
        result: CallResult,
    ) -> Result<bool, Failure> {
        let outcome = match &result {
            Ok(Ok(())) => CallOutcome::Ok,
            Ok(Err(_)) => CallOutcome::Error,
            Err(_) => CallOutcome::Failed,
        };
        self.stats.record_call(call, outcome, begun.elapsed());
        let result = result?;
        // Survived: whatever was in flight did not end the instance.
        self.in_flight = None;
        // A call that returned, even with an error of its own (a collector without its
        // devices), shows the version runs; one that collects shows it by collecting:
        // answering a configuration or a roster is not enough.
        if call == "collect" || self.spec.collect_interval.is_none() {
            self.status
                .send_if_modified(|s| !std::mem::replace(&mut s.proven, true));
        }
        match result {
            Ok(()) => {
                if let Some(at) = self.failing.iter().position(|(c, _)| *c == call) {
                    self.failing.swap_remove(at);
                    tracing::info!(plugin = &*self.name, call, "plugin call succeeds again");
                }
                Ok(true)
            }
            Err(message) => {
                let known = match self.failing.iter_mut().find(|(c, _)| *c == call) {
                    Some((_, last)) if *last == message => true,
                    Some((_, last)) => {
                        last.clone_from(&message);
                        false
                    }
                    None => {
                        self.failing.push((call, message.clone()));
                        false
                    }
                };
                if known {
                    // Reported when it began; observers still get every failure.
                    self.event(EventKind::CallFailed { call, message });
                    return Ok(false);
                }
                // The message is capped already; the rate limit is the plugin's log budget.
                let admission = self.logs.admit();
                if admission.report_dropped > 0 {
                    tracing::warn!(
                        plugin = &*self.name,
                        dropped = admission.report_dropped,
                        "plugin log lines dropped over its rate limit"
                    );
                    self.event(EventKind::LogsDropped {
                        count: admission.report_dropped,
                    });
                }
                if admission.admit {
                    tracing::warn!(
                        plugin = &*self.name,
                        call,
                        "plugin call failed (logged again when the error changes): {}",
                        Untrusted(&message).capped(MAX_ERROR_MESSAGE + 32)
                    );
                }
                self.event(EventKind::CallFailed { call, message });
                Ok(false)
            }
        }
    }

    /// Whether `snapshot` is to be delivered; a replaced withheld snapshot is forgotten.
    fn may_deliver(&mut self, snapshot: &Snapshot) -> bool {
        let same_feed =
            |s: &Snapshot| std::mem::discriminant(s) == std::mem::discriminant(snapshot);
        match self.withheld.iter().position(same_feed) {
            Some(i) if self.withheld[i] == *snapshot => false,
            Some(i) => {
                self.withheld.remove(i);
                true
            }
            None => true,
        }
    }

    /// Records which snapshot was being delivered when the instance failed. Returns whether
    /// it is now withheld (it ended two instances in a row).
    fn blame_snapshot(&mut self, failure: &Failure) -> bool {
        let Some(snapshot) = self.in_flight.take() else {
            self.crashed_on = None;
            return false;
        };
        if failure.call() != Some(snapshot.call()) {
            self.crashed_on = None;
            return false;
        }
        let count = match &self.crashed_on {
            Some((previous, count)) if *previous == snapshot => count + 1,
            _ => 1,
        };
        if count < 2 {
            self.crashed_on = Some((snapshot, count));
            return false;
        }
        self.crashed_on = None;
        let call = snapshot.call();
        tracing::warn!(
            plugin = &*self.name,
            call,
            "a snapshot ended the plugin twice in a row; it is withheld until replaced"
        );
        self.event(EventKind::SnapshotWithheld { call });
        self.withheld
            .retain(|s| std::mem::discriminant(s) != std::mem::discriminant(&snapshot));
        self.withheld.push(snapshot);
        true
    }

    async fn deliver_config(&mut self, instance: &mut Instance) -> Result<(), Failure> {
        let update = self.feeds.config.borrow_and_update().clone();
        if let Some(update) = update {
            let snapshot = Snapshot::Config(update.clone());
            if !self.may_deliver(&snapshot) {
                return Ok(());
            }
            self.in_flight = Some(snapshot);
            let begun = Instant::now();
            let result = instance.on_config(&update).await;
            if self.settle("on-config", begun, result)? {
                self.event(EventKind::ConfigDelivered {
                    revision: update.revision,
                });
            }
        }
        Ok(())
    }

    async fn deliver_roster(&mut self, instance: &mut Instance) -> Result<(), Failure> {
        let roster = self.feeds.roster.borrow_and_update().clone();
        if let Some(roster) = roster {
            let snapshot = Snapshot::Roster(roster.clone());
            if !self.may_deliver(&snapshot) {
                return Ok(());
            }
            self.in_flight = Some(snapshot);
            let begun = Instant::now();
            let result = instance.on_roster(&roster).await;
            if self.settle("on-roster", begun, result)? {
                self.event(EventKind::RosterDelivered {
                    providers: roster.len(),
                });
            }
        }
        Ok(())
    }

    async fn deliver_instances(&mut self, instance: &mut Instance) -> Result<(), Failure> {
        let instances = self.feeds.instances.borrow_and_update().clone();
        if let Some(instances) = instances {
            let snapshot = Snapshot::Instances(instances.clone());
            if !self.may_deliver(&snapshot) {
                return Ok(());
            }
            self.in_flight = Some(snapshot);
            let begun = Instant::now();
            let result = instance.on_instances(&instances).await;
            if self.settle("on-instances", begun, result)? {
                self.event(EventKind::InstancesDelivered {
                    instances: instances.len(),
                });
            }
        }
        Ok(())
    }

    async fn serve(&mut self, instance: &mut Instance, loaded: &LoadedPlugin) -> Exit {
        match self.serve_inner(instance, loaded).await {
            Ok(exit) => exit,
            Err(failure) => Exit::Failed(failure),
        }
    }

    async fn serve_inner(
        &mut self,
        instance: &mut Instance,
        loaded: &LoadedPlugin,
    ) -> Result<Exit, Failure> {
        // Replay: a new instance starts from the latest snapshots, whatever it missed.
        self.deliver_config(instance).await?;
        self.deliver_roster(instance).await?;
        self.deliver_instances(instance).await?;

        let mut collect = self.spec.collect_interval.map(GridTimer::new);
        let mut check = watch_interval(self.runtime.options().watch_interval);
        let (mut config_open, mut roster_open, mut instances_open) = (true, true, true);
        loop {
            tokio::select! {
                biased;
                _ = self.stop.changed() => return Ok(Exit::Stop),
                changed = self.feeds.config.changed(), if config_open => match changed {
                    Ok(()) => self.deliver_config(instance).await?,
                    Err(_) => config_open = false,
                },
                changed = self.feeds.roster.changed(), if roster_open => match changed {
                    Ok(()) => self.deliver_roster(instance).await?,
                    Err(_) => roster_open = false,
                },
                changed = self.feeds.instances.changed(), if instances_open => match changed {
                    Ok(()) => self.deliver_instances(instance).await?,
                    Err(_) => instances_open = false,
                },
                _ = tick(&mut collect) => {
                    let begun = Instant::now();
                    let result = instance.collect(ccfleet::wire::now_ns()).await;
                    self.settle("collect", begun, result)?;
                }
                _ = check.tick() => {
                    let stamp = FileStamp::of(&self.spec.path);
                    if stamp == self.seen_stamp {
                        continue;
                    }
                    self.seen_stamp = stamp;
                    match self.runtime.load(&self.spec).await {
                        Ok(next) if next.hash != loaded.hash => {
                            self.event(EventKind::Loaded { hash: next.hash.clone(), cached: next.cached });
                            return Ok(Exit::Reload(next));
                        }
                        // Touched but unchanged: keep running.
                        Ok(_) => {}
                        Err(error) => {
                            tracing::error!(plugin = &*self.name, "cannot reload plugin, keeping the running version: {error}");
                            self.event(EventKind::ReloadFailed { error: error.to_string() });
                        }
                    }
                }
            }
        }
    }
}

fn watch_interval(period: Duration) -> GridTimer {
    GridTimer::new(period.max(Duration::from_millis(10)))
}

async fn tick(interval: &mut Option<GridTimer>) {
    match interval {
        Some(interval) => interval.tick().await,
        None => std::future::pending().await,
    }
}

async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}
