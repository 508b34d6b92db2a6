//! One tokio task per plugin, owning the plugin's only `Store`.
//!
//! The task loads the component, instantiates it from its `InstancePre`, calls `init`, replays
//! the latest configuration, roster and instance set, and then waits on those watch channels,
//! the collect interval, a file-change check and a stop signal. A trap, a deadline or a memory
//! overrun drops the store; the task restarts the plugin after a backoff while its restart
//! budget lasts (the budget is restored after a healthy period) and quarantines it otherwise,
//! until its file changes.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::{Interval, MissedTickBehavior};
use wasmtime::Store;

use crate::Failure;
use crate::bindings::FleetPlugin;
use crate::events::{EventKind, PluginEvent};
use crate::runtime::{FileStamp, LoadedPlugin, Runtime};
use crate::sink::SinkHandle;
use crate::spec::{Limits, PluginSpec};
use crate::state::{HostState, MemoryLimitExceeded};
use crate::types::{ConfigUpdate, Instance as DiscoveredInstance, Provider};

/// Extra wall-clock time allowed past the CPU deadline before the call's future is dropped:
/// epoch interruption normally ends the call first; the timeout catches calls blocked in the
/// host.
const TIMEOUT_GRACE: Duration = Duration::from_millis(250);

/// The receiving side of the latest-value channels a plugin is fed from.
#[derive(Debug, Clone)]
pub struct Feeds {
    /// The latest service configuration.
    pub config: watch::Receiver<Option<ConfigUpdate>>,
    /// The latest roster of peers.
    pub roster: watch::Receiver<Option<Arc<Vec<Provider>>>>,
    /// The latest set of discovered instances.
    pub instances: watch::Receiver<Option<Arc<Vec<DiscoveredInstance>>>>,
}

/// The sending side of [`Feeds`]: publishing replaces the previous value, never queues.
#[derive(Debug)]
pub struct FeedSenders {
    /// The latest service configuration.
    pub config: watch::Sender<Option<ConfigUpdate>>,
    /// The latest roster of peers.
    pub roster: watch::Sender<Option<Arc<Vec<Provider>>>>,
    /// The latest set of discovered instances.
    pub instances: watch::Sender<Option<Arc<Vec<DiscoveredInstance>>>>,
}

impl FeedSenders {
    /// Empty channels.
    pub fn new() -> FeedSenders {
        FeedSenders {
            config: watch::Sender::new(None),
            roster: watch::Sender::new(None),
            instances: watch::Sender::new(None),
        }
    }

    /// A new set of receivers, for one more plugin.
    pub fn subscribe(&self) -> Feeds {
        Feeds {
            config: self.config.subscribe(),
            roster: self.roster.subscribe(),
            instances: self.instances.subscribe(),
        }
    }

    /// Publishes a configuration snapshot.
    pub fn set_config(&self, update: ConfigUpdate) {
        self.config.send_replace(Some(update));
    }

    /// Publishes a roster.
    pub fn set_roster(&self, providers: Vec<Provider>) {
        self.roster.send_replace(Some(Arc::new(providers)));
    }

    /// Publishes an instance set.
    pub fn set_instances(&self, instances: Vec<DiscoveredInstance>) {
        self.instances.send_replace(Some(Arc::new(instances)));
    }
}

impl Default for FeedSenders {
    fn default() -> Self {
        FeedSenders::new()
    }
}

/// Where a plugin is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PluginState {
    /// Being compiled or instantiated.
    Starting,
    /// Instantiated and serving.
    Running,
    /// Waiting to be restarted after a failure.
    Backoff,
    /// Its restart budget is spent; waiting for its file to change.
    Quarantined,
    /// Its component could not be loaded; waiting for its file to change.
    LoadFailed,
    /// Stopped for good.
    Stopped,
}

/// A plugin's current status.
#[derive(Debug, Clone, PartialEq)]
pub struct PluginStatus {
    /// Its state.
    pub state: PluginState,
    /// The current instantiation, counted from 1.
    pub generation: u64,
    /// Restarts used from the budget.
    pub restarts: u32,
    /// The SHA-256 of the running component, hex.
    pub hash: Option<String>,
    /// The last failure, if any.
    pub last_failure: Option<Failure>,
}

/// Controls one supervised plugin. Dropping it stops the plugin.
#[derive(Debug)]
pub struct PluginHandle {
    name: Arc<str>,
    status: watch::Receiver<PluginStatus>,
    stop: watch::Sender<bool>,
    task: Option<JoinHandle<()>>,
}

impl PluginHandle {
    /// The plugin's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A receiver of the plugin's status.
    pub fn status(&self) -> watch::Receiver<PluginStatus> {
        self.status.clone()
    }

    /// Stops the plugin and waits for its task to finish (the store is dropped).
    pub async fn stop(mut self) {
        self.stop.send_replace(true);
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for PluginHandle {
    fn drop(&mut self) {
        self.stop.send_replace(true);
    }
}

pub(crate) fn spawn(
    runtime: Runtime,
    spec: PluginSpec,
    feeds: Feeds,
    sink: SinkHandle,
) -> PluginHandle {
    let name: Arc<str> = spec.display_name().into();
    let (status_tx, status) = watch::channel(PluginStatus {
        state: PluginState::Starting,
        generation: 0,
        restarts: 0,
        hash: None,
        last_failure: None,
    });
    let (stop, stop_rx) = watch::channel(false);
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
    };
    let task = tokio::spawn(supervisor.run());
    PluginHandle {
        name,
        status,
        stop,
        task: Some(task),
    }
}

/// A running instance of a plugin: its store and the bindings to its exports.
pub struct Instance {
    store: Store<HostState>,
    bindings: FleetPlugin,
    timeout: Duration,
}

/// The result of one call: `Err` is a failure that killed the store; the inner `Err` is the
/// plugin's own error, which it survives.
pub type CallResult = Result<Result<(), String>, Failure>;

/// Runs `$body` (a call into the plugin) under the CPU deadline and the wall-clock timeout.
macro_rules! guarded {
    ($inst:expr, $call:literal, |$guest:ident, $store:ident| $body:expr) => {{
        let inst: &mut Instance = $inst;
        let limit = inst.timeout;
        inst.store.data_mut().deadline = Instant::now() + limit;
        inst.store.set_epoch_deadline(1);
        let $guest = inst.bindings.cc_fleet_plugin();
        let $store = &mut inst.store;
        let outcome = tokio::time::timeout(limit + TIMEOUT_GRACE, $body).await;
        classify($call, limit, outcome)
    }};
}

fn classify(
    call: &'static str,
    limit: Duration,
    outcome: Result<wasmtime::Result<Result<(), String>>, tokio::time::error::Elapsed>,
) -> CallResult {
    match outcome {
        Ok(Ok(result)) => Ok(result),
        Ok(Err(error)) => Err(failure_of(call, limit, &error)),
        Err(_) => Err(Failure::Deadline { call, limit }),
    }
}

fn failure_of(call: &'static str, limit: Duration, error: &wasmtime::Error) -> Failure {
    if let Some(exceeded) = error.downcast_ref::<MemoryLimitExceeded>() {
        return Failure::MemoryLimit {
            call,
            limit: exceeded.limit,
            requested: exceeded.requested,
        };
    }
    match error.downcast_ref::<wasmtime::Trap>() {
        Some(wasmtime::Trap::Interrupt) => Failure::Deadline { call, limit },
        Some(trap) => Failure::Trap {
            call,
            message: trap.to_string(),
        },
        None => Failure::Trap {
            call,
            message: error.to_string(),
        },
    }
}

impl Instance {
    /// Creates a store, instantiates the plugin from its `InstancePre` and calls `init`.
    pub(crate) async fn start(
        runtime: &Runtime,
        loaded: &LoadedPlugin,
        spec: &PluginSpec,
        plugin: Arc<str>,
        generation: u64,
        sink: SinkHandle,
    ) -> Result<Instance, Failure> {
        let mut store = runtime
            .new_store(spec, plugin, generation, sink)
            .map_err(|e| Failure::Setup(e.to_string()))?;
        let limit = spec.limits.call_timeout;
        store.data_mut().deadline = Instant::now() + limit;
        let outcome = tokio::time::timeout(
            limit + TIMEOUT_GRACE,
            loaded.pre.instantiate_async(&mut store),
        )
        .await;
        let bindings = match outcome {
            Ok(Ok(bindings)) => bindings,
            Ok(Err(error)) => return Err(failure_of("instantiate", limit, &error)),
            Err(_) => {
                return Err(Failure::Deadline {
                    call: "instantiate",
                    limit,
                });
            }
        };
        let mut instance = Instance {
            store,
            bindings,
            timeout: limit,
        };
        let config = spec.config.to_string();
        match guarded!(&mut instance, "init", |guest, store| guest
            .call_init(store, &config))
        {
            Ok(Ok(())) => Ok(instance),
            Ok(Err(message)) => Err(Failure::Init(message)),
            Err(failure) => Err(failure),
        }
    }

    /// Calls `on-config`.
    pub async fn on_config(&mut self, update: &ConfigUpdate) -> CallResult {
        guarded!(self, "on-config", |guest, store| guest
            .call_on_config(store, update))
    }

    /// Calls `on-roster`.
    pub async fn on_roster(&mut self, providers: &[Provider]) -> CallResult {
        guarded!(self, "on-roster", |guest, store| guest
            .call_on_roster(store, providers))
    }

    /// Calls `on-instances`.
    pub async fn on_instances(&mut self, instances: &[DiscoveredInstance]) -> CallResult {
        guarded!(self, "on-instances", |guest, store| guest
            .call_on_instances(store, instances))
    }

    /// Calls `collect`.
    pub async fn collect(&mut self, now_ns: i64) -> CallResult {
        guarded!(self, "collect", |guest, store| guest
            .call_collect(store, now_ns))
    }
}

/// What the restart policy decided after a failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Decision {
    Restart { delay: Duration, restarts: u32 },
    Quarantine { restarts: u32 },
}

/// Exponential backoff with a restart budget that a healthy period restores.
#[derive(Debug, Clone)]
pub(crate) struct RestartPolicy {
    budget: u32,
    base: Duration,
    max: Duration,
    healthy: Duration,
    restarts: u32,
}

impl RestartPolicy {
    pub fn new(limits: &Limits) -> Self {
        RestartPolicy {
            budget: limits.restart_budget,
            base: limits.restart_backoff,
            max: limits.max_restart_backoff.max(limits.restart_backoff),
            healthy: limits.healthy_period,
            restarts: 0,
        }
    }

    /// Decides about an instance that started at `started` and failed at `now`.
    pub fn on_failure(&mut self, started: Instant, now: Instant) -> Decision {
        if now.saturating_duration_since(started) >= self.healthy {
            self.restarts = 0;
        }
        if self.restarts >= self.budget {
            return Decision::Quarantine {
                restarts: self.restarts,
            };
        }
        let factor = 1u32.checked_shl(self.restarts).unwrap_or(u32::MAX);
        let delay = self.base.saturating_mul(factor).min(self.max);
        self.restarts += 1;
        Decision::Restart {
            delay,
            restarts: self.restarts,
        }
    }

    pub fn reset(&mut self) {
        self.restarts = 0;
    }

    pub fn restarts(&self) -> u32 {
        self.restarts
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
            let exit = match Instance::start(
                &self.runtime,
                &current,
                &self.spec,
                self.name.clone(),
                self.generation,
                self.sink.clone(),
            )
            .await
            {
                Ok(mut instance) => {
                    tracing::info!(
                        plugin = &*self.name,
                        generation = self.generation,
                        "plugin started"
                    );
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
                    self.status
                        .send_modify(|s| s.hash = Some(next.hash.clone()));
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
                    match self.policy.on_failure(started, Instant::now()) {
                        Decision::Restart { delay, restarts } => {
                            self.set_state(PluginState::Backoff, Some(failure));
                            self.event(EventKind::Restarting { delay, restarts });
                            match self.wait_for_change(Some(delay)).await {
                                Wake::Stop => break,
                                // A new file version gets a fresh load and a fresh budget.
                                Wake::Changed => self.policy.reset(),
                                Wake::Elapsed => loaded = Some(current),
                            }
                        }
                        Decision::Quarantine { restarts } => {
                            tracing::error!(
                                plugin = &*self.name,
                                restarts,
                                "plugin quarantined until its file changes"
                            );
                            self.set_state(PluginState::Quarantined, Some(failure));
                            self.event(EventKind::Quarantined { restarts });
                            match self.wait_for_change(None).await {
                                Wake::Stop => break,
                                Wake::Changed | Wake::Elapsed => self.policy.reset(),
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

    /// Turns a call result into the supervisor's view: plugin errors are logged and
    /// survived, failures end the instance.
    fn settle(&self, call: &'static str, result: CallResult) -> Result<bool, Failure> {
        match result? {
            Ok(()) => Ok(true),
            Err(message) => {
                tracing::warn!(plugin = &*self.name, call, "plugin call failed: {message}");
                self.event(EventKind::CallFailed { call, message });
                Ok(false)
            }
        }
    }

    async fn deliver_config(&mut self, instance: &mut Instance) -> Result<(), Failure> {
        let update = self.feeds.config.borrow_and_update().clone();
        if let Some(update) = update {
            let result = instance.on_config(&update).await;
            if self.settle("on-config", result)? {
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
            let result = instance.on_roster(&roster).await;
            if self.settle("on-roster", result)? {
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
            let result = instance.on_instances(&instances).await;
            if self.settle("on-instances", result)? {
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

        let mut collect = self.spec.collect_interval.map(|period| {
            let mut interval =
                tokio::time::interval_at(tokio::time::Instant::now() + period, period);
            interval.set_missed_tick_behavior(MissedTickBehavior::Delay);
            interval
        });
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
                    let result = instance.collect(ccfleet::wire::now_ns()).await;
                    self.settle("collect", result)?;
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

fn watch_interval(period: Duration) -> Interval {
    let period = period.max(Duration::from_millis(10));
    let mut interval = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    interval.set_missed_tick_behavior(MissedTickBehavior::Delay);
    interval
}

async fn tick(interval: &mut Option<Interval>) {
    match interval {
        Some(interval) => {
            interval.tick().await;
        }
        None => std::future::pending().await,
    }
}

async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(budget: u32) -> RestartPolicy {
        RestartPolicy::new(&Limits {
            restart_budget: budget,
            restart_backoff: Duration::from_millis(100),
            max_restart_backoff: Duration::from_millis(350),
            healthy_period: Duration::from_secs(60),
            ..Limits::default()
        })
    }

    #[test]
    fn backoff_doubles_up_to_the_cap_then_quarantines() {
        let mut p = policy(4);
        let t0 = Instant::now();
        let delays: Vec<_> = (0..5).map(|_| p.on_failure(t0, t0)).collect();
        let ms = |m| Duration::from_millis(m);
        assert_eq!(
            delays,
            vec![
                Decision::Restart {
                    delay: ms(100),
                    restarts: 1
                },
                Decision::Restart {
                    delay: ms(200),
                    restarts: 2
                },
                Decision::Restart {
                    delay: ms(350),
                    restarts: 3
                },
                Decision::Restart {
                    delay: ms(350),
                    restarts: 4
                },
                Decision::Quarantine { restarts: 4 },
            ]
        );
    }

    #[test]
    fn a_healthy_period_restores_the_budget() {
        let mut p = policy(1);
        let t0 = Instant::now();
        assert!(matches!(
            p.on_failure(t0, t0),
            Decision::Restart { restarts: 1, .. }
        ));
        // Failing again right away spends nothing more: quarantine.
        assert!(matches!(p.on_failure(t0, t0), Decision::Quarantine { .. }));
        // An instance that ran for the healthy period starts over with a full budget.
        let later = t0 + Duration::from_secs(61);
        assert_eq!(
            p.on_failure(t0, later),
            Decision::Restart {
                delay: Duration::from_millis(100),
                restarts: 1
            }
        );
    }

    #[test]
    fn a_zero_budget_quarantines_at_once() {
        let mut p = policy(0);
        let t0 = Instant::now();
        assert_eq!(p.on_failure(t0, t0), Decision::Quarantine { restarts: 0 });
    }
}
