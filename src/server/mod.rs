//! A cc-backend-compatible fleet service.
//!
//! Members register over REST, pull their merged configuration from an authored config
//! tree (with ETags), heartbeat over NATS or REST and deregister; the server keeps them in a
//! SQLite registry, marks silent ones stale and publishes discovery rosters over NATS.
//! The behaviour follows cc-backend's fleet service (its REST routes, status codes and
//! error bodies, its configuration tree and its NATS subjects), so cc-lib's Go client and
//! ccfleet's client work against either.
//!
//! ```no_run
//! # async fn demo() -> Result<(), ccfleet::server::ServerError> {
//! let config = ccfleet::server::ServerConfig::from_json(
//!     r#"{"addr": "127.0.0.1:0", "disable-authentication": true}"#,
//! )?;
//! let server = ccfleet::server::start(config).await?;
//! println!("fleet API at {}", server.base_url());
//! server.shutdown().await
//! # }
//! ```

pub mod allowlist;
mod api;
mod api_error;
mod app;
pub mod auth;
pub mod config;
pub mod configtree;
pub mod duplicates;
mod error;
mod health;
mod heartbeat_stream;
mod heartbeats;
mod http;
mod layer;
pub mod leader;
pub mod metrics;
pub mod names;
pub mod plugins;
pub mod registry;
mod rescan;
pub mod rollout;
pub mod roster;
mod slow_consumer;
pub mod status;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;

pub use config::{
    FleetConfig, HeartbeatStreamConfig, HttpLimits, NatsConfig, RegistryConfig, ServerConfig,
};
pub use error::{AuthError, RegistryError, RegistryErrorKind, ServerError, TreeError};
pub use heartbeats::QUEUE_GROUP;
pub use metrics::HeartbeatStats;

use allowlist::{Allowlist, TrustedProxies};
use configtree::{ConfigTree, Reload};
use metrics::Metrics;
use registry::Registry;
use roster::RosterNotify;

/// How long shutdown waits for in-flight HTTP requests and NATS flushes.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);
/// How long start-up waits for NATS before carrying on without it.
const INITIAL_CONNECT_WAIT: Duration = Duration::from_secs(2);

/// A running server; dropping it stops the background work without flushing, prefer
/// [`RunningServer::shutdown`].
pub struct RunningServer {
    local_addr: SocketAddr,
    shutdown: watch::Sender<bool>,
    http: Option<JoinHandle<std::io::Result<()>>>,
    consumer: Option<JoinHandle<()>>,
    tasks: Vec<JoinHandle<()>>,
    nats: Option<async_nats::Client>,
    tree: Option<Arc<ConfigTree>>,
    registry: Registry,
    metrics: Arc<Metrics>,
    duplicates: Arc<duplicates::Duplicates>,
    gate: leader::Gate,
    /// Held while the server runs on a SQLite file: one server per file.
    db_lock: Option<registry::DatabaseLock>,
}

impl std::fmt::Debug for RunningServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunningServer")
            .field("local_addr", &self.local_addr)
            .finish_non_exhaustive()
    }
}

/// Resolves once shutdown is requested (or the server handle is gone).
pub(crate) async fn stopped(shutdown: &mut watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|stop| *stop).await;
}

async fn blocking<R: Send + 'static>(
    f: impl FnOnce() -> R + Send + 'static,
) -> Result<R, ServerError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ServerError::Task(e.to_string()))
}

/// Messages the JetStream registry's own NATS connection buffers per subscription (its
/// bucket watch and the last-seen digests): async-nats's default. The watch is a
/// flow-controlled JetStream consumer, so a burst of changes waits there instead of
/// overflowing the small buffer `fleet.heartbeat-pending-messages` gives the heartbeat
/// subscription (an overflowing watch falls behind while its consumer is recreated).
const REGISTRY_SUBSCRIPTION_CAPACITY: usize = 65_536;

/// The JetStream registry's connection: its own, so that the heartbeat subscription's
/// bound and overload never reach the bucket watch.
async fn connect_registry_nats(config: &NatsConfig) -> Result<async_nats::Client, ServerError> {
    connect(
        config,
        ("ccfleet-server-registry", "registry"),
        REGISTRY_SUBSCRIPTION_CAPACITY,
        |_| {},
    )
    .await
}

/// The fleet connection: heartbeats, rosters and the heartbeat stream.
async fn connect_nats(
    config: &NatsConfig,
    subscription_capacity: usize,
    metrics: Arc<Metrics>,
    roster: RosterNotify,
) -> Result<async_nats::Client, ServerError> {
    connect(
        config,
        ("ccfleet-server", "fleet"),
        subscription_capacity,
        move |event| match event {
            async_nats::Event::SlowConsumer(_) => {
                Metrics::add(&metrics.heartbeats_dropped, 1);
                metrics.slow_consumer.dropped();
            }
            // Core NATS kept nothing for consumers while we were away: send current
            // rosters now instead of at the next interval.
            async_nats::Event::Connected => roster.notify_all(),
            _ => {}
        },
    )
    .await
}

/// Connects as `name` (the connection name nats-server shows) and logs its events as
/// `connection = role`; `on_event` sees every connection event before it is reported.
async fn connect(
    config: &NatsConfig,
    (name, role): (&str, &'static str),
    subscription_capacity: usize,
    on_event: impl Fn(&async_nats::Event) + Send + Sync + 'static,
) -> Result<async_nats::Client, ServerError> {
    // An outage is logged once (and its end once), not on every reconnect attempt.
    let reporter = crate::nats::ConnectionReporter::named(&config.address, role);
    let on_event = Arc::new(on_event);
    let options = config
        .connect_options(name)
        .await
        .map_err(|e| ServerError::nats(config, "", &e))?
        .subscription_capacity(subscription_capacity)
        .event_callback(move |event| {
            on_event(&event);
            let reporter = reporter.clone();
            async move { reporter.on_event(event).await }
        });
    // The error text is scrubbed already.
    config.connect(options).await.map_err(ServerError::Nats)
}

fn spawn_sweeper(
    registry: Registry,
    metrics_notify: RosterNotify,
    stale_after: Duration,
    interval: Duration,
    gate: leader::Gate,
    mut shutdown: watch::Receiver<bool>,
) -> JoinHandle<()> {
    // With a shared registry only the lease holder sweeps, and only once it has listened
    // to the other servers' last-seen digests for a whole stale-after window.
    let warm = tokio::time::Instant::now() + stale_after;
    tokio::spawn(async move {
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticker.reset();
        let stale_secs = i64::try_from(stale_after.as_secs()).unwrap_or(i64::MAX);
        loop {
            tokio::select! {
                _ = stopped(&mut shutdown) => return,
                _ = ticker.tick() => {
                    if !gate.is_leader() || tokio::time::Instant::now() < warm {
                        continue;
                    }
                    let cutoff = registry::unix_seconds().saturating_sub(stale_secs);
                    match registry.mark_stale(cutoff).await {
                        Ok(0) => {}
                        Ok(n) => {
                            tracing::info!("fleet: marked {n} service(s) stale");
                            metrics_notify.notify();
                        }
                        Err(e) => tracing::error!("fleet: stale sweep failed: {e}"),
                    }
                }
            }
        }
    })
}

/// Writes the registry's last-seen times behind, every `interval`; the last write happens
/// in [`RunningServer::shutdown`], after the heartbeat consumer stopped.
fn spawn_last_seen_writer(
    registry: Registry,
    interval: Duration,
    mut shutdown: watch::Receiver<bool>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticker.reset();
        loop {
            tokio::select! {
                _ = stopped(&mut shutdown) => return,
                // A failure is logged by the registry (once per burst); the times stay in
                // memory for the next tick.
                _ = ticker.tick() => { let _ = registry.flush_last_seen().await; }
            }
        }
    })
}

async fn reload_tree(tree: &Arc<ConfigTree>, metrics: &Metrics) -> Result<Reload, ServerError> {
    let scan = tree.clone();
    metrics.rescan.started();
    let outcome = blocking(move || scan.reload()).await;
    let outcome = match outcome {
        Ok(outcome) => outcome,
        Err(e) => {
            metrics.rescan.finished(Some(e.to_string()));
            return Err(e);
        }
    };
    match outcome {
        Ok(Reload::Replaced) => {
            metrics.rescan.finished(None);
            Metrics::add(&metrics.config_reloads, 1);
            tracing::info!("fleet: config tree reloaded");
            Ok(Reload::Replaced)
        }
        Ok(Reload::Unchanged) => {
            metrics.rescan.finished(None);
            Ok(Reload::Unchanged)
        }
        Err(e) => {
            metrics.rescan.finished(Some(e.to_string()));
            Metrics::add(&metrics.config_reload_errors, 1);
            tracing::warn!("fleet: config reload failed, keeping previous snapshot: {e}");
            Err(e.into())
        }
    }
}

fn spawn_reloader(
    tree: Arc<ConfigTree>,
    metrics: Arc<Metrics>,
    interval: Duration,
    mut shutdown: watch::Receiver<bool>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticker.reset();
        loop {
            tokio::select! {
                _ = stopped(&mut shutdown) => return,
                // Failures are logged and counted inside; the old generation stays.
                _ = ticker.tick() => {
                    // A rescan stuck on a file system that stopped answering does not
                    // hold the shutdown.
                    tokio::select! {
                        _ = reload_tree(&tree, &metrics) => {}
                        _ = stopped(&mut shutdown) => return,
                    }
                }
            }
        }
    })
}

/// The key pair that signs rosters: `jwt-private-key`, else `JWT_PRIVATE_KEY`, else none.
/// A key that is not the private half of the configured public key is refused: agents
/// configured with the public key would reject every roster.
fn roster_signer(config: &ServerConfig) -> Result<Option<Arc<auth::Keypair>>, ServerError> {
    let Some(key) = config
        .jwt_private_key
        .clone()
        .or_else(|| std::env::var("JWT_PRIVATE_KEY").ok())
        .filter(|k| !k.trim().is_empty())
    else {
        return Ok(None);
    };
    let keypair = auth::Keypair::from_private_base64(&key).map_err(ServerError::PrivateKey)?;
    if let Some(public) = config
        .jwt_public_key
        .clone()
        .or_else(|| std::env::var("JWT_PUBLIC_KEY").ok())
        .filter(|k| !k.trim().is_empty())
        && public.trim() != keypair.public_key_base64()
    {
        return Err(ServerError::InvalidConfig(
            "jwt-private-key is not the private half of jwt-public-key",
        ));
    }
    Ok(Some(Arc::new(keypair)))
}

/// Starts the server: loads the config tree, opens the registry, connects NATS (if
/// configured), binds the HTTP listener and starts the background loops.
pub async fn start(config: ServerConfig) -> Result<RunningServer, ServerError> {
    let allowlist = Arc::new(
        Allowlist::new(&config.api_allowed_ips)?
            .with_trusted_proxies(TrustedProxies::new(&config.trusted_proxies)?),
    );
    let verifier = if config.disable_authentication {
        tracing::warn!(
            "fleet: authentication is disabled; anyone allowed by api-allowed-ips can register, heartbeat and deregister"
        );
        None
    } else {
        let key = config
            .jwt_public_key
            .clone()
            .or_else(|| std::env::var("JWT_PUBLIC_KEY").ok())
            .filter(|k| !k.trim().is_empty())
            .ok_or(ServerError::NoPublicKey)?;
        Some(auth::Verifier::from_public_base64(&key).map_err(ServerError::Key)?)
    };
    let signer = roster_signer(&config)?;
    let fleet = &config.fleet;

    let tree = match fleet.config_dir.clone() {
        Some(dir) => {
            let tree = blocking(move || ConfigTree::load(&dir)).await??;
            Some(Arc::new(tree))
        }
        None => {
            tracing::warn!("fleet: no config-dir configured; every config pull answers 204");
            None
        }
    };
    let plugins = match fleet.plugin_dir.clone() {
        Some(dir) => {
            let shown = dir.display().to_string();
            let plugins = blocking(move || plugins::PluginDir::open(&dir))
                .await?
                .map_err(|e| {
                    ServerError::Plugins(format!("fleet.plugin-dir {shown}: cannot read: {e}"))
                })?;
            tracing::info!("fleet: plugin-dir {shown}: {} component(s)", plugins.len());
            Some(Arc::new(plugins))
        }
        None => None,
    };
    let metrics = Arc::new(Metrics::default());
    metrics
        .slow_consumer
        .set_pending_messages(fleet.heartbeat_pending_messages);
    let roster_notify = RosterNotify::default();
    let (shutdown, shutdown_rx) = watch::channel(false);
    let mut tasks = Vec::new();

    let nats = match &config.nats {
        Some(nats) => Some(
            connect_nats(
                nats,
                fleet.heartbeat_pending_messages,
                metrics.clone(),
                roster_notify.clone(),
            )
            .await?,
        ),
        None => None,
    };
    let mut db_lock = None;
    // With a shared registry: the registry's connection and bucket, which the servers also
    // share agents' reports over (see `rollout::share`).
    let mut report_sharing = None;
    let (registry, gate, last_seen_interval) = match (&config.registry, &nats) {
        (RegistryConfig::JetStreamKv(settings), Some(_)) => {
            let nats_config = config.nats.as_ref().expect("a nats section with a client");
            let client = connect_registry_nats(nats_config).await?;
            report_sharing = Some((client.clone(), settings.bucket.clone()));
            let store = registry::jetstream::JetStreamStore::open(client, settings.clone()).await?;
            let replication = store.replication();
            let lease_bucket = store.bucket().clone();
            let registry = blocking(move || Registry::new(store)).await??;
            let notify = roster_notify.clone();
            tasks.extend(
                replication
                    .spawn(
                        registry.clone(),
                        move || notify.notify(),
                        shutdown_rx.clone(),
                    )
                    .await?,
            );
            let notify = roster_notify.clone();
            let (gate, lease) = leader::spawn(
                leader::Lease {
                    kv: lease_bucket,
                    ttl: settings.lease_ttl,
                    on_gain: Box::new(move || notify.notify_all()),
                },
                shutdown_rx.clone(),
            );
            tasks.push(lease);
            tracing::info!(
                "fleet: registry in JetStream bucket {:?} ({} replica(s), roster lease {})",
                settings.bucket,
                settings.replicas,
                crate::duration::format(settings.lease_ttl)
            );
            (registry, gate, registry::jetstream::DIGEST_INTERVAL)
        }
        (RegistryConfig::JetStreamKv(_), None) => {
            return Err(ServerError::InvalidConfig(
                "registry: \"type\": \"jetstream-kv\" needs a nats connection",
            ));
        }
        (RegistryConfig::Sqlite, _) => {
            let db = config.db.clone();
            match db.clone() {
                // Before the file is opened: a second server must not even create tables.
                Some(path) => {
                    db_lock =
                        Some(blocking(move || registry::DatabaseLock::acquire(&path)).await??);
                }
                None => tracing::warn!(
                    "fleet: no db configured; the registry lives in memory and is lost on restart"
                ),
            }
            let registry = blocking(move || Registry::open(db.as_deref())).await??;
            (
                registry,
                leader::Gate::always(),
                registry::LAST_SEEN_FLUSH_INTERVAL,
            )
        }
    };

    let listener = tokio::net::TcpListener::bind(&config.addr)
        .await
        .map_err(|source| ServerError::Http {
            addr: config.addr.clone(),
            source,
        })?;
    let local_addr = listener.local_addr().map_err(|source| ServerError::Http {
        addr: config.addr.clone(),
        source,
    })?;

    let consumer = match (&nats, &fleet.heartbeat_subject, &fleet.heartbeat_stream) {
        (Some(client), Some(subject), Some(stream)) => Some(
            heartbeat_stream::spawn(
                client,
                subject,
                stream,
                // Half the subscription's capacity: a pull never overflows it.
                fleet.heartbeat_pending_messages / 2,
                heartbeats::ConsumerContext {
                    registry: registry.clone(),
                    metrics: metrics.clone(),
                    roster: roster_notify.clone(),
                    shutdown: shutdown_rx.clone(),
                },
            )
            .await?,
        ),
        (Some(client), Some(subject), None) => Some(
            heartbeats::spawn(
                client,
                subject,
                fleet.heartbeat_concurrency,
                heartbeats::ConsumerContext {
                    registry: registry.clone(),
                    metrics: metrics.clone(),
                    roster: roster_notify.clone(),
                    shutdown: shutdown_rx.clone(),
                },
            )
            .await?,
        ),
        (None, Some(_), _) => {
            tracing::warn!(
                "fleet: heartbeat-subject is set but no nats is configured; heartbeats only over REST"
            );
            None
        }
        (_, None, _) => None,
    };
    if let Some(client) = &nats {
        // A round trip makes sure the subscription is in place before start() returns, so
        // heartbeats published right afterwards are not missed. A NATS that is down does
        // not hold up start-up: the client keeps connecting in the background.
        match tokio::time::timeout(INITIAL_CONNECT_WAIT, client.flush()).await {
            Ok(Ok(())) => {}
            _ => tracing::warn!(
                "NATS: not reachable yet; heartbeats and rosters start once it connects"
            ),
        }
    }
    match &nats {
        Some(client) => tasks.push(roster::spawn(
            client.clone(),
            registry.clone(),
            metrics.clone(),
            roster_notify.clone(),
            roster::PublisherConfig {
                prefix: fleet.discovery_subject_prefix.clone(),
                interval: fleet.discovery_interval,
                debounce: fleet.discovery_debounce,
                signer,
                gate: gate.clone(),
            },
            shutdown_rx.clone(),
        )),
        None => {
            tracing::warn!(
                "fleet: NATS client unavailable, discovery rosters will not be published"
            );
        }
    }
    tasks.push(spawn_last_seen_writer(
        registry.clone(),
        last_seen_interval,
        shutdown_rx.clone(),
    ));
    tasks.push(spawn_sweeper(
        registry.clone(),
        roster_notify.clone(),
        fleet.stale_after,
        fleet.sweep_interval,
        gate.clone(),
        shutdown_rx.clone(),
    ));
    if let Some(tree) = &tree {
        tasks.push(spawn_reloader(
            tree.clone(),
            metrics.clone(),
            fleet.config_reload_interval,
            shutdown_rx.clone(),
        ));
    }

    let rollouts = Arc::new(rollout::Rollouts::new());
    if let Some((client, bucket)) = report_sharing {
        tasks.extend(
            rollout::share::spawn(rollouts.clone(), client, &bucket, shutdown_rx.clone())
                .await
                .map_err(|e| {
                    ServerError::Task(format!("subscribing to shared agents' reports: {e}"))
                })?,
        );
    }
    if let Some(tree) = &tree {
        let dir = plugins.clone();
        let known: Arc<dyn Fn(&str) -> bool + Send + Sync> =
            Arc::new(move |sha: &str| dir.as_ref().is_some_and(|d| d.find(sha).is_some()));
        tasks.push(rollout::spawn(
            rollouts.clone(),
            registry.clone(),
            tree.clone(),
            known,
            gate.clone(),
            fleet.rollout_interval,
            shutdown_rx.clone(),
        ));
    }

    let duplicates = Arc::new(duplicates::Duplicates::new(metrics.clone()));
    let app = api::router(app::AppState {
        registry: registry.clone(),
        tree: tree.clone(),
        verifier,
        allowlist,
        metrics: metrics.clone(),
        roster: roster_notify,
        health: health::Health::new(registry.clone(), nats.clone(), metrics.clone()),
        plugins,
        duplicates: duplicates.clone(),
        rollouts,
        status: Arc::new({
            let status = status::Status::new(
                &fleet.discovery_subject_prefix,
                fleet.stale_after,
                TrustedProxies::new(&config.trusted_proxies)?,
            );
            if nats.is_some() {
                status
            } else {
                status.without_rosters()
            }
        }),
    });
    let app = http::harden(app, &config.http, metrics.clone());
    let http = tokio::spawn(http::serve(
        listener,
        app,
        config.http,
        metrics.clone(),
        shutdown_rx.clone(),
    ));
    tracing::info!(
        "fleet: initialized (config-dir '{}', stale-after {}, sweep {}, reload {}, discovery {})",
        fleet
            .config_dir
            .as_deref()
            .map(|p| p.display().to_string())
            .unwrap_or_default(),
        crate::duration::format(fleet.stale_after),
        crate::duration::format(fleet.sweep_interval),
        crate::duration::format(fleet.config_reload_interval),
        crate::duration::format(fleet.discovery_interval),
    );
    tracing::info!("Enabling REST fleet service API on http://{local_addr}");
    Ok(RunningServer {
        local_addr,
        shutdown,
        http: Some(http),
        consumer,
        tasks,
        nats,
        tree,
        registry,
        metrics,
        duplicates,
        gate,
        db_lock,
    })
}

impl RunningServer {
    /// The bound HTTP address.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// `http://HOST:PORT` of the API.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.local_addr)
    }

    /// The registry (read access for tools, tests and benchmarks).
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// Members registered in turn from different peers: services sharing an identity.
    pub fn duplicates(&self) -> &duplicates::Duplicates {
        &self.duplicates
    }

    /// Whether this server publishes rosters and sweeps stale services now: always with a
    /// registry of its own, only while it holds the lease with a shared one.
    pub fn is_roster_leader(&self) -> bool {
        self.gate.is_leader()
    }

    /// The heartbeat counters.
    pub fn heartbeat_stats(&self) -> HeartbeatStats {
        self.metrics.heartbeat_stats()
    }

    /// Rescans the config tree now. On error the previous generation stays in place and the
    /// error is returned.
    pub async fn reload_config(&self) -> Result<(), ServerError> {
        match &self.tree {
            Some(tree) => reload_tree(tree, &self.metrics).await.map(|_| ()),
            None => Ok(()),
        }
    }

    /// Stops gracefully: stops accepting requests, processes the heartbeat messages already
    /// received, flushes pending heartbeats to the registry and flushes NATS.
    pub async fn shutdown(mut self) -> Result<(), ServerError> {
        let _ = self.shutdown.send(true);
        let mut result = Ok(());
        if let Some(mut http) = self.http.take() {
            match tokio::time::timeout(SHUTDOWN_GRACE, &mut http).await {
                Ok(Ok(Ok(()))) => {}
                Ok(Ok(Err(source))) => {
                    result = Err(ServerError::Http {
                        addr: self.local_addr.to_string(),
                        source,
                    });
                }
                Ok(Err(e)) => result = Err(ServerError::Task(e.to_string())),
                Err(_) => {
                    tracing::warn!(
                        "fleet: HTTP connections still open after the grace period; closing them"
                    );
                    // Aborting the server task drops the connections it owns.
                    http.abort();
                }
            }
        }
        // The consumer applies the heartbeats it has received; the other tasks only stop. None
        // may hold the shutdown up for long: a task waiting on a NATS that went away (a roster
        // round of a large fleet with a full outgoing buffer, a registry call) is ended.
        let deadline = tokio::time::Instant::now() + SHUTDOWN_GRACE;
        let mut overran = Vec::new();
        let consumer = self
            .consumer
            .take()
            .map(|task| ("heartbeat consumer", task));
        let tasks = std::mem::take(&mut self.tasks)
            .into_iter()
            .map(|task| ("background task", task));
        for (name, mut task) in consumer.into_iter().chain(tasks) {
            match tokio::time::timeout_at(deadline, &mut task).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => result = Err(ServerError::Task(e.to_string())),
                Err(_) => {
                    task.abort();
                    overran.push(name);
                }
            }
        }
        if !overran.is_empty() {
            tracing::warn!(
                "fleet: {} task(s) still running {} after the shutdown began ({}); ended them",
                overran.len(),
                crate::duration::format(SHUTDOWN_GRACE),
                overran.join(", ")
            );
        }
        // Heartbeats no longer arrive: the last-seen times in memory are written once more.
        if let Err(e) = self.registry.flush_last_seen().await {
            tracing::warn!(
                "fleet: {} last-seen time(s) could not be written at shutdown: {e}",
                self.registry.unwritten_last_seen()
            );
        }
        if let Some(nats) = self.nats.take() {
            let _ = tokio::time::timeout(SHUTDOWN_GRACE, nats.flush()).await;
        }
        // Every write is done: another server may take the file now.
        drop(self.db_lock.take());
        tracing::info!("fleet: server stopped");
        result
    }
}

impl Drop for RunningServer {
    fn drop(&mut self) {
        let _ = self.shutdown.send(true);
        if let Some(http) = self.http.take() {
            http.abort();
        }
    }
}
