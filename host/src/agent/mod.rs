//! The agent: what a ClusterCockpit service runs. It joins the fleet with the fleet client,
//! runs service discovery, and hands every configuration, roster and instance set to its
//! plugins, whose metrics go to NATS (or stdout).

pub mod config;
mod fleet_entry;
mod health;
pub mod import_ccmc;
mod loops;
mod observe;
mod report;
mod rollout;
pub mod router;
pub mod self_metrics;
pub mod sinks;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use ccfleet::duration::GoDuration;

use ccfleet::client::{self, Client, Options, Update};
use ccfleet::discovery::{self, Cached, Discoverer, FleetRosters, Merged};
use ccfleet::wire;
use tokio::sync::{broadcast, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

pub use config::{
    AgentConfig, ConnectionReporter, DEFAULT_SHUTDOWN_TIMEOUT, MetricsConfig, NatsConfig, SinkKind,
};

use crate::sink;
use crate::types::{ConfigUpdate, Instance, Provider, Source};
use crate::{FeedSenders, HostError, PluginEvent, PluginHandle, Runtime, RuntimeOptions};
use observe::{ConfigState, Observed, ObservedPlugin};

/// How long the first registration and configuration pull may take before the agent goes on
/// with the cached (or local) configuration.
const BOOTSTRAP_TIMEOUT: Duration = Duration::from_secs(10);
/// How long deregistration may take at shutdown (at most half the shutdown bound, so the
/// plugins and the metric flush get their share).
const CLOSE_TIMEOUT: Duration = Duration::from_secs(5);
/// How much longer than `shutdown-timeout` [`run`] lets the process live after the first
/// signal before exiting regardless (the runtime's own teardown included).
const EXIT_GRACE: Duration = Duration::from_secs(2);
/// Batches buffered between the plugins and the metric output.
const SINK_CAPACITY: usize = 1024;

/// Why the agent could not start or stop cleanly.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// The configuration file could not be read.
    #[error("cannot read agent configuration {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The configuration is invalid.
    #[error("{0}")]
    Config(String),
    /// The fleet section is invalid.
    #[error("invalid fleet section: {0}")]
    Fleet(#[from] client::ConfigError),
    /// The fleet client failed.
    #[error("fleet client: {0}")]
    Client(#[from] client::Error),
    /// Bootstrapping failed for a reason other than cc-backend being unreachable.
    #[error("cannot join the fleet: {0}")]
    Bootstrap(Box<client::BootstrapError>),
    /// Service discovery could not be set up.
    #[error("service discovery: {0}")]
    Discovery(#[from] discovery::DiscoveryError),
    /// NATS could not be set up.
    #[error("NATS: {0}")]
    Nats(String),
    /// The plugin host could not be set up.
    #[error(transparent)]
    Host(#[from] HostError),
    /// Shutdown did not finish within the bound; what was left was abandoned.
    #[error("shutdown did not finish within {}; abandoned {what}", GoDuration(*after))]
    ShutdownTimeout {
        /// The bound (`shutdown-timeout`).
        after: Duration,
        /// The step that was still running.
        what: &'static str,
    },
}

/// Converts a fleet client update into the plugins' snapshot type.
pub fn config_update(update: &Update) -> ConfigUpdate {
    ConfigUpdate {
        config: update.config.clone(),
        revision: update.revision.clone(),
        source: match update.source {
            client::Source::None => Source::None,
            client::Source::Fleet => Source::Fleet,
            client::Source::Cache => Source::Cache,
        },
    }
}

/// Converts a roster entry into the plugins' type.
pub fn provider(p: &wire::Provider) -> Provider {
    Provider {
        service_type: p.service_type.code().to_owned(),
        hostname: p.hostname.clone(),
        state: p.state.clone(),
        meta: p.meta.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
    }
}

/// Converts a discovered instance into the plugins' type.
pub fn instance(i: &discovery::Instance) -> Instance {
    Instance {
        workload_id: i.workload_id.clone(),
        node_id: i.node_id.clone(),
        ip_address: i.ip_address.clone(),
        port: i.port,
        backend: i.backend.clone(),
    }
}

/// An agent that is configured but not started: subscribe to its events first, so nothing
/// of the start is missed.
pub struct Agent {
    config: AgentConfig,
    runtime: Runtime,
}

/// A started agent.
pub struct RunningAgent {
    client: Client,
    runtime: Runtime,
    initial: Update,
    nats: Option<async_nats::Client>,
    nats_link: Option<ConnectionReporter>,
    shutdown_timeout: Duration,
    plugins: Vec<PluginHandle>,
    run: JoinHandle<Result<(), client::Error>>,
    forwarders: Vec<JoinHandle<()>>,
    discovery: Option<Arc<Cached>>,
    rollout: Option<(watch::Sender<bool>, JoinHandle<()>)>,
    sinks: Vec<sinks::SinkInfo>,
    sink: Option<JoinHandle<()>>,
    observer: Option<(SocketAddr, JoinHandle<()>)>,
}

impl Agent {
    /// Checks the configuration and sets up the plugin runtime; no network I/O.
    pub fn new(config: AgentConfig) -> Result<Agent, AgentError> {
        let cache_dir = config
            .plugin_cache_dir
            .clone()
            .or_else(crate::plugin::default_cache_dir);
        let mut secret_files = config.secret_files(
            std::env::var_os(ccfleet::client::config::ENV_TOKEN_FILE),
            cache_dir.as_deref(),
        );
        secret_files.extend(config::env_secret_files(|name| std::env::var_os(name)));
        if let Some(serde_json::Value::String(cached)) = config.fleet.get("cache-path")
            && !cached.is_empty()
        {
            // The cached fleet configuration: what the fleet sent, kept for the agent alone.
            secret_files.push(PathBuf::from(cached));
        }
        let state_dirs = cache_dir
            .iter()
            .cloned()
            .chain(fleet_plugin_dir(&config))
            .collect();
        let runtime = Runtime::new(RuntimeOptions {
            secret_files,
            state_dirs,
            cache_dir,
            watch_interval: config.plugin_watch_interval,
            ..RuntimeOptions::default()
        })?;
        Ok(Agent { config, runtime })
    }

    /// Events of all plugins of this agent.
    pub fn subscribe(&self) -> broadcast::Receiver<PluginEvent> {
        self.runtime.subscribe()
    }

    /// Connects NATS, joins the fleet (falling back to the cached or local configuration when
    /// cc-backend is unreachable), starts discovery and the plugins, and runs the client.
    pub async fn start(self) -> Result<RunningAgent, AgentError> {
        let Agent { config, runtime } = self;
        let fleet = client::Config::from_value(config.fleet.clone())?;
        let cluster = fleet.cluster.clone();
        let fleet_urls: Vec<String> = std::iter::once(fleet.url.clone())
            .chain(fleet.failover_urls.iter().cloned())
            .collect();
        let poll_interval = fleet.config_poll_interval;
        // Bound first: a wrong address fails the start before anything else is set up.
        let listener = match &config.metrics_addr {
            Some(addr) => Some(tokio::net::TcpListener::bind(addr).await.map_err(|e| {
                AgentError::Config(format!("metrics-addr {addr}: cannot listen: {e}"))
            })?),
            None => None,
        };

        let (nats, nats_link) = match &config.nats {
            Some(section) => {
                let (client, link) = config::connect_nats(section).await?;
                (Some(client), Some(link))
            }
            None => (None, None),
        };
        let mut options = Options::new(fleet, config.service_type);
        options.meta = config.meta.clone();
        if let Some(nats) = &nats {
            let nats = nats.clone();
            options.nats = Some(Arc::new(move || Some(nats.clone())));
        }
        let client = Client::new(options)?;

        let initial = match client.bootstrap(BOOTSTRAP_TIMEOUT).await {
            Ok(update) => {
                tracing::info!(revision = %update.revision, "joined the fleet");
                update
            }
            Err(error) if error.is_unreachable() => {
                let server = client.current_server().to_owned();
                let reason = error.to_string();
                let fallback = error.into_fallback();
                match fallback.source {
                    client::Source::Cache => tracing::warn!(
                        revision = %fallback.revision,
                        %server,
                        error = %reason,
                        "cc-backend is unreachable; running from the cached configuration and retrying"
                    ),
                    _ => tracing::warn!(
                        %server,
                        error = %reason,
                        "cc-backend is unreachable and nothing is cached; running from the local configuration and retrying"
                    ),
                }
                fallback
            }
            Err(error) => return Err(AgentError::Bootstrap(Box::new(error))),
        };

        let feeds = Arc::new(FeedSenders::new());
        feeds.set_config(config_update(&initial));
        let mut forwarders = Vec::new();
        let loops = Arc::new(loops::Loops::default());

        let (config_state, config_seen) = watch::channel(ConfigState {
            revision: initial.revision.clone(),
            source: initial.source,
        });
        let mut configs = client.configs();
        let to_plugins = feeds.clone();
        let alive = loops.track("configuration forwarder");
        forwarders.push(tokio::spawn(async move {
            let _alive = alive;
            while let Some(update) = configs.recv().await {
                tracing::info!(revision = %update.revision, "configuration changed");
                to_plugins.set_config(config_update(&update));
                config_state.send_replace(ConfigState {
                    revision: update.revision.clone(),
                    source: update.source,
                });
            }
        }));

        // Rosters go to the plugins and, as instances, into discovery.
        let (roster_tx, roster_rx) = watch::channel(Vec::new());
        let mut rosters = client.rosters();
        let to_plugins = feeds.clone();
        forwarders.push(tokio::spawn(async move {
            while let Some(roster) = rosters.recv().await {
                to_plugins.set_roster(roster.iter().map(provider).collect());
                roster_tx.send_replace(roster);
            }
        }));

        // Rosters only arrive over NATS, and not at all for some service types (cc-backend
        // publishes none for ccb). Alone, the fleet source waits for its first roster so an
        // empty placeholder is not read as an empty fleet; merged with a configured provider
        // it starts empty, so that provider's instances are not held back behind a roster
        // that may never come.
        let fleet_rosters: Arc<dyn Discoverer> = if config.discovery.is_some() {
            Arc::new(FleetRosters::new(roster_rx, default_port(&config)))
        } else {
            Arc::new(FleetRosters::awaiting_first(
                roster_rx,
                default_port(&config),
            ))
        };
        let lister: Arc<dyn Discoverer> = match &config.discovery {
            Some(section) => Arc::new(Merged::new(
                discovery::provider::new(section)?,
                fleet_rosters,
            )),
            None => fleet_rosters,
        };
        let cached = Arc::new(Cached::with_timing(
            lister,
            config.discovery_refresh_interval,
            config.discovery_refresh_interval,
        ));
        cached.start().await;
        let mut snapshots = cached.subscribe();
        let to_plugins = feeds.clone();
        forwarders.push(tokio::spawn(async move {
            let mut last: Option<Vec<Instance>> = None;
            loop {
                let current = snapshots
                    .borrow_and_update()
                    .instances
                    .as_ref()
                    .map(|list| list.iter().map(instance).collect::<Vec<_>>());
                if let Some(current) = current
                    && last.as_ref() != Some(&current)
                {
                    to_plugins.set_instances(current.clone());
                    last = Some(current);
                }
                if snapshots.changed().await.is_err() {
                    return;
                }
            }
        }));

        let (sink_handle, batches) = sink::channel(SINK_CAPACITY);
        // A router that changes nothing is left out, so batches pass undecoded.
        let router = match &config.router {
            Some(c) => Some(router::Router::new(c, client.hostname()).map_err(AgentError::Config)?)
                .filter(router::Router::is_active),
            None => None,
        };
        let router_stats = router.as_ref().map(router::Router::stats);
        let sink_configs = sinks::effective(&config.sinks, &config.metrics, nats.is_some())?;
        let sinks::Sinks {
            info: sink_info,
            task: sink_task,
        } = sinks::start(
            batches,
            &sink_configs,
            nats.as_ref(),
            &cluster,
            config.sinks.is_empty(),
            loops.track("metric output"),
            router,
            &sinks::meta_tags::of_plugins(&config.plugins),
        )?;

        let plugins: Vec<PluginHandle> = config
            .plugins
            .iter()
            .map(|spec| runtime.spawn(spec.clone(), feeds.subscribe(), sink_handle.clone()))
            .collect();
        let observed_plugins = Arc::new(std::sync::RwLock::new(
            plugins
                .iter()
                .map(|p| ObservedPlugin {
                    name: p.name().into(),
                    status: p.status(),
                    stats: p.stats(),
                })
                .collect::<Vec<_>>(),
        ));
        let rollouts = Arc::new(rollout::RolloutCounts::default());
        let assignments = Arc::new(loops::Assignments::default());
        let rollout = match fleet_plugin_dir(&config) {
            Some(dir) => {
                let token = client::Config::from_value(config.fleet.clone())?.resolve_token()?;
                let ceiling = config.fleet_ceiling.clone().unwrap_or_default();
                let fetcher =
                    rollout::Fetcher::new(&fleet_urls, &token, dir, ceiling.max_stored_bytes())
                        .map_err(AgentError::Config)?;
                let (stop, stopped) = watch::channel(false);
                let signing = config.plugin_public_keys.clone();
                if signing.is_empty() {
                    tracing::info!(
                        "plugin signatures are not enforced: no plugin-public-keys; fleet plugins run signed or not"
                    );
                } else {
                    tracing::info!(
                        keys = signing.0.len(),
                        "plugin signatures are enforced: a fleet plugin runs only when signed by one of the plugin-public-keys"
                    );
                }
                let task = rollout::Rollout {
                    runtime: runtime.clone(),
                    feeds: feeds.clone(),
                    sink: sink_handle.clone(),
                    fetcher,
                    local: plugins.iter().map(|p| p.name().to_owned()).collect(),
                    observed: observed_plugins.clone(),
                    counts: rollouts.clone(),
                    assignments: assignments.clone(),
                    retry_interval: poll_interval,
                    ceiling,
                    signing,
                }
                .spawn(
                    initial.config.clone(),
                    client.configs(),
                    stopped,
                    loops.track("fleet plugin rollout"),
                );
                Some((stop, task))
            }
            None => {
                tracing::warn!(
                    "no fleet-plugin-dir and no user cache directory: plugins named by the fleet are not run"
                );
                None
            }
        };
        forwarders.push(report::spawn(
            client.clone(),
            observed_plugins.clone(),
            rollout.is_some().then(|| assignments.clone()),
            config_seen.clone(),
        ));
        if let Some(section) = &config.self_metrics {
            let sources = self_metrics::Sources {
                plugins: observed_plugins.clone(),
                sinks: sink_info.clone(),
                queue: sink_handle.clone(),
            };
            let cluster = (!cluster.is_empty()).then(|| cluster.clone());
            // A forwarder: stopped before the metric flush, which waits for every sender.
            forwarders.push(self_metrics::spawn(
                section.clone(),
                sources,
                sink_handle.clone(),
                client.hostname().to_owned(),
                cluster,
            ));
        }
        drop(sink_handle);

        let observer = match listener {
            Some(listener) => {
                let addr = listener.local_addr().map_err(|e| {
                    AgentError::Config(format!("metrics-addr: cannot read the bound address: {e}"))
                })?;
                let observed = Observed {
                    plugins: observed_plugins,
                    rollouts,
                    sinks: sink_info.clone(),
                    client: client.clone(),
                    nats: nats.clone(),
                    config: config_seen,
                    loops: loops.clone(),
                    assignments: rollout.is_some().then(|| assignments.clone()),
                    router: router_stats,
                };
                tracing::info!(%addr, "serving /metrics, /healthz and /readyz");
                Some((addr, observe::serve(listener, Arc::new(observed))))
            }
            None => None,
        };

        let runner = client.clone();
        let alive = loops.track("fleet client");
        let run = tokio::spawn(async move {
            let _alive = alive;
            runner.run().await
        });
        Ok(RunningAgent {
            client,
            runtime,
            initial,
            nats,
            nats_link,
            shutdown_timeout: config.shutdown_timeout,
            plugins,
            run,
            forwarders,
            discovery: Some(cached),
            rollout,
            sinks: sink_info,
            sink: Some(sink_task),
            observer,
        })
    }
}

/// Where plugins named by the fleet are kept: `fleet-plugin-dir`, else `fleet-plugins`
/// beside the compile cache.
fn fleet_plugin_dir(config: &AgentConfig) -> Option<PathBuf> {
    config.fleet_plugin_dir.clone().or_else(|| {
        config
            .plugin_cache_dir
            .clone()
            .or_else(crate::plugin::default_cache_dir)
            .map(|dir| dir.with_file_name("fleet-plugins"))
    })
}

fn default_port(config: &AgentConfig) -> u16 {
    config
        .discovery
        .as_ref()
        .map(|d| d.port)
        .unwrap_or(ccfleet::discovery::provider::Config::new("").port)
}

impl RunningAgent {
    /// The fleet client.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The plugin runtime (subscribe to events here).
    pub fn runtime(&self) -> &Runtime {
        &self.runtime
    }

    /// The configuration the agent started with.
    pub fn initial(&self) -> &Update {
        &self.initial
    }

    /// The NATS connection, if configured.
    pub fn nats(&self) -> Option<&async_nats::Client> {
        self.nats.as_ref()
    }

    /// The supervised plugins.
    pub fn plugins(&self) -> &[PluginHandle] {
        &self.plugins
    }

    /// The metric sinks and their counters (which outlive the agent).
    pub fn sinks(&self) -> &[sinks::SinkInfo] {
        &self.sinks
    }

    /// The address `/metrics`, `/healthz` and `/readyz` are served on (`None` without
    /// `metrics-addr`).
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.observer.as_ref().map(|(addr, _)| *addr)
    }

    /// Whether the NATS connection is up (`None` without a NATS section).
    pub fn nats_connected(&self) -> Option<bool> {
        self.nats
            .as_ref()
            .map(|client| client.connection_state() == async_nats::connection::State::Connected)
    }

    /// The NATS server's address as logs show it, without credentials (`None` without a NATS
    /// section).
    pub fn nats_address(&self) -> Option<&str> {
        self.nats_link.as_ref().map(ConnectionReporter::address)
    }

    /// Stops the client (deregistering), discovery and the plugins, and flushes the metrics,
    /// all within the configured `shutdown-timeout` whatever cc-backend, NATS or the plugins
    /// do: what has not finished by then is abandoned and reported as
    /// [`AgentError::ShutdownTimeout`].
    pub async fn shutdown(mut self) -> Result<(), AgentError> {
        let bound = self.shutdown_timeout;
        let deadline = Instant::now() + bound;
        // The client's own bound covers stopping its loop and deregistering.
        let closed = self.client.close(CLOSE_TIMEOUT.min(bound / 2)).await;
        if let Err(error) = &closed {
            tracing::warn!(%error, "leaving the fleet without deregistering");
        }
        let mut step = "the fleet client";
        let steps = async {
            let run = (&mut self.run).await;
            step = "the plugins";
            for plugin in std::mem::take(&mut self.plugins) {
                plugin.stop().await;
            }
            if let Some((stop, task)) = self.rollout.take() {
                stop.send_replace(true);
                let _ = task.await;
            }
            step = "service discovery";
            if let Some(cached) = self.discovery.take() {
                cached.stop().await;
            }
            for task in &self.forwarders {
                task.abort();
            }
            step = "the metric flush";
            if let Some(sink) = self.sink.take() {
                let disconnected = self.nats_connected() == Some(false);
                if disconnected {
                    // A flush waits for a connection that may never come back.
                    tracing::warn!("NATS is not connected: metrics not yet published are dropped");
                    sink.abort();
                } else {
                    let _ = sink.await;
                }
            }
            run
        };
        // A statement of its own, so the steps' borrows end before the arms.
        let outcome = tokio::time::timeout_at(deadline, steps).await;
        let run = match outcome {
            Ok(run) => run,
            Err(_) => {
                if let Some(sink) = self.sink.take() {
                    sink.abort();
                }
                // Dropping the rest (plugins, discovery, the run loop) stops it.
                tracing::warn!(
                    bound = %GoDuration(bound),
                    "shutdown did not finish in time; abandoning {step}"
                );
                return Err(AgentError::ShutdownTimeout {
                    after: bound,
                    what: step,
                });
            }
        };
        if let Some((_, observer)) = self.observer.take() {
            // Waited for, so its listener is closed when shutdown returns: an agent started
            // again at once finds its metrics address free.
            observer.abort();
            let _ = observer.await;
        }
        closed?;
        match run {
            // The run task had not started when the client was closed: nothing ran.
            Ok(Err(client::Error::Closed)) => {}
            Ok(result) => result?,
            Err(join) => tracing::error!("the fleet client task failed: {join}"),
        }
        Ok(())
    }
}

impl Drop for RunningAgent {
    fn drop(&mut self) {
        for task in &self.forwarders {
            task.abort();
        }
        if let Some((_, task)) = &self.rollout {
            task.abort();
        }
        if let Some(sink) = &self.sink {
            sink.abort();
        }
        if let Some((_, observer)) = &self.observer {
            observer.abort();
        }
        self.run.abort();
    }
}

/// Runs the agent until SIGINT or SIGTERM, then shuts it down within `shutdown-timeout`.
///
/// This is the process's signal handling: a second signal during shutdown exits the process
/// at once (status 128 + the signal's number), and should shutdown (or the runtime's
/// teardown after it) hang anyway, the process exits `shutdown-timeout` plus two seconds
/// after the first signal. A signal during start-up exits without starting.
pub async fn run(config: AgentConfig) -> Result<(), AgentError> {
    let bound = config.shutdown_timeout;
    // Listening from the start: a signal that arrives while starting is not lost.
    let mut signals = Signals::new();
    let agent = Agent::new(config)?;
    let agent = tokio::select! {
        agent = agent.start() => agent?,
        signal = signals.recv() => {
            tracing::info!(signal = signal.name, "signal received while starting; exiting");
            return Ok(());
        }
    };
    let signal = signals.recv().await;
    tracing::info!(
        signal = signal.name,
        bound = %GoDuration(bound),
        "shutting down (a second signal exits at once)"
    );
    tokio::spawn(async move {
        let signal = signals.recv().await;
        tracing::warn!(
            signal = signal.name,
            "second signal: exiting without finishing the shutdown"
        );
        std::process::exit(128 + signal.number);
    });
    // A thread of its own, so neither a stalled runtime nor a blocking task can keep the
    // process alive.
    std::thread::spawn(move || {
        std::thread::sleep(bound + EXIT_GRACE);
        tracing::error!(
            bound = %GoDuration(bound),
            "shutdown overran its bound; exiting"
        );
        std::process::exit(1);
    });
    agent.shutdown().await
}

/// A signal that stops the agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StopSignal {
    /// `SIGTERM` or `SIGINT`.
    pub name: &'static str,
    /// The signal's number (15 or 2).
    pub number: i32,
}

const SIGTERM: StopSignal = StopSignal {
    name: "SIGTERM",
    number: 15,
};
const SIGINT: StopSignal = StopSignal {
    name: "SIGINT",
    number: 2,
};

/// SIGTERM and SIGINT, listened to from creation on: every signal after [`Signals::new`] is
/// seen by a [`Signals::recv`], the first and any later one.
pub struct Signals {
    #[cfg(unix)]
    term: Option<tokio::signal::unix::Signal>,
    #[cfg(unix)]
    int: Option<tokio::signal::unix::Signal>,
}

impl Signals {
    /// Starts listening (within a tokio runtime).
    pub fn new() -> Signals {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            let listen = |kind: SignalKind, name: &str| match signal(kind) {
                Ok(stream) => Some(stream),
                Err(error) => {
                    tracing::warn!(%error, "cannot watch {name}; it will not stop this process");
                    None
                }
            };
            Signals {
                term: listen(SignalKind::terminate(), "SIGTERM"),
                int: listen(SignalKind::interrupt(), "SIGINT"),
            }
        }
        #[cfg(not(unix))]
        {
            Signals {}
        }
    }

    /// Waits for the next SIGTERM or SIGINT.
    pub async fn recv(&mut self) -> StopSignal {
        #[cfg(unix)]
        {
            async fn next(stream: &mut Option<tokio::signal::unix::Signal>) {
                match stream {
                    Some(stream) => {
                        if stream.recv().await.is_none() {
                            std::future::pending::<()>().await;
                        }
                    }
                    None => std::future::pending::<()>().await,
                }
            }
            tokio::select! {
                () = next(&mut self.term) => SIGTERM,
                () = next(&mut self.int) => SIGINT,
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
            SIGINT
        }
    }
}

impl Default for Signals {
    fn default() -> Signals {
        Signals::new()
    }
}

/// Resolves on SIGINT (Ctrl-C) or SIGTERM.
pub async fn wait_for_signal() {
    Signals::new().recv().await;
}
