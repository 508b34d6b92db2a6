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
use tokio::time::{Interval, MissedTickBehavior};

use super::engine::{FileStamp, LoadedPlugin, Runtime};
use super::events::{EventKind, PluginEvent};
use super::feeds::Feeds;
use super::handle::{PluginHandle, PluginState, PluginStatus};
use super::instance::{CallResult, Instance};
use super::restart::{Decision, RestartPolicy};
use super::sink::SinkHandle;
use super::spec::PluginSpec;
use crate::plugin::Failure;

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
    PluginHandle::new(name, status, stop, task)
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
