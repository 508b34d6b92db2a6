//! The fleet client: a port of cc-lib's Go `fleet` client.
//!
//! A ClusterCockpit service uses it to
//! - register with cc-backend and get an instance id,
//! - receive its configuration from the central configuration tree, with ETag-based polling,
//! - stay marked alive with heartbeats over NATS, or over REST when NATS is unavailable,
//! - receive discovery rosters of the peers it depends on,
//! - deregister on shutdown.
//!
//! ```no_run
//! # async fn demo(raw_section: &str) -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use ccfleet::client::{Client, Config, Options};
//! use ccfleet::wire::ServiceType;
//!
//! let config = Config::from_json(raw_section)?;
//! let client = Client::new(Options::new(config, ServiceType::MetricCollector))?;
//! let initial = match client.bootstrap(Duration::from_secs(10)).await {
//!     Ok(update) => update,
//!     Err(e) if e.is_unreachable() => e.into_fallback(), // the cached configuration, or none
//!     Err(e) => return Err(e.into()),
//! };
//! // apply initial.config ...
//! let runner = client.clone();
//! let run = tokio::spawn(async move { runner.run().await });
//! let mut configs = client.configs();
//! while let Some(update) = configs.recv().await {
//!     // apply update.config; only sent when the configuration really changed
//! #   break;
//! }
//! client.close(Duration::from_secs(5)).await?; // stops run, then deregisters
//! run.await??;
//! # Ok(())
//! # }
//! ```
//!
//! Heartbeats go to the heartbeat subject while the NATS client is connected and over REST
//! otherwise; a disconnected NATS client never buffers them. When cc-backend answers 404 (the
//! id was rotated or deregistered), [`Client::run`] registers again and pulls the
//! configuration at once; NATS heartbeats cannot detect this, so the config poll does.
//! [`REPLACED_WARN_AFTER`] such replacements in a row, each soon after the registration
//! before, are warned about once: another service registers with the same cluster, host name
//! and type, and the two replace each other's instance at every heartbeat
//! ([`Client::replacements`] counts them). Failures of the loop are logged with the fleet
//! server they came from and listed by [`Client::failures`].
//!
//! `url` may list several fleet servers (a JSON array, in order of preference; one string is
//! one server, as in Go). A request that fails with a connection error, a timeout, a server
//! error (5xx) or 429 is sent to the next server at once, with the same instance id and ETag;
//! a failed server is probed through `/healthz` with backoff and jitter, and requests return
//! to the preferred server once it is healthy again. [`Client::current_server`] names the
//! server in use. The servers must share one registry for the instance id to stay valid on
//! all of them; a server that does not know the id answers 404 and the client registers there
//! again.

mod api;
mod cache;
pub mod config;
pub mod error;
mod http;
pub mod latest;
mod rosters;
mod run;
mod servers;

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;

pub use api::MAX_CONFIG_SIZE;
pub use config::{CONFIG_SCHEMA, Config, ConfigError};
pub use error::{BootstrapError, Error, Op, StatusError};
pub use latest::Latest;
pub use rosters::RosterStats;
pub use run::{Failure, MAX_BACKOFF, MIN_BACKOFF, REPLACED_WARN_AFTER};
pub use servers::{MAX_PROBE_INTERVAL, MIN_PROBE_INTERVAL};

use crate::wire::{Provider, Scope, ServiceType};
use cache::{Cache, Identity};
use latest::Slot;
use run::{Backoff, Lifecycle};

/// Returns the application's current NATS client, or `None` while it has none.
///
/// Called on every use, so the application may replace its client at any time; the run loop
/// subscribes again when a different client appears.
pub type NatsProvider = Arc<dyn Fn() -> Option<async_nats::Client> + Send + Sync>;

/// What [`Client::new`] needs.
pub struct Options {
    /// The local `fleet` section.
    pub config: Config,
    /// The type of this service.
    pub service_type: ServiceType,
    /// Metadata registered with the instance. It is broadcast unauthenticated in discovery
    /// rosters: never put secrets here.
    pub meta: BTreeMap<String, String>,
    /// The application's NATS client; `None` sends every heartbeat over REST and receives no
    /// rosters.
    pub nats: Option<NatsProvider>,
    /// The HTTP client to use; by default one with the configured timeout.
    pub http_client: Option<reqwest::Client>,
}

impl Options {
    /// Options with no metadata, no NATS and the default HTTP client.
    pub fn new(config: Config, service_type: ServiceType) -> Options {
        Options {
            config,
            service_type,
            meta: BTreeMap::new(),
            nats: None,
            http_client: None,
        }
    }
}

impl fmt::Debug for Options {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Options")
            .field("config", &self.config)
            .field("service_type", &self.service_type)
            .field("meta", &self.meta)
            .field("nats", &self.nats.as_ref().map(|_| "<provider>"))
            .field("http_client", &self.http_client)
            .finish()
    }
}

/// Where a configuration came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Source {
    /// Nothing is authored for this instance: run with the local configuration.
    #[default]
    None,
    /// Received from cc-backend.
    Fleet,
    /// Read from the local cache because cc-backend was unreachable.
    Cache,
}

impl Source {
    /// `none`, `fleet` or `cache`.
    pub fn as_str(self) -> &'static str {
        match self {
            Source::None => "none",
            Source::Fleet => "fleet",
            Source::Cache => "cache",
        }
    }
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A configuration for the application.
#[derive(Clone, PartialEq, Eq, Default)]
pub struct Update {
    /// The merged configuration as JSON text, exactly as cc-backend sent it; `None` for
    /// [`Source::None`].
    pub config: Option<String>,
    /// The configuration revision (empty when none is known).
    pub revision: String,
    /// Where the configuration came from.
    pub source: Source,
}

impl Update {
    /// "Nothing authored": run with the local configuration.
    pub fn none() -> Update {
        Update::default()
    }
}

impl fmt::Debug for Update {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The configuration may hold secrets; show only its size.
        f.debug_struct("Update")
            .field(
                "config",
                &self.config.as_ref().map(|c| format!("<{} bytes>", c.len())),
            )
            .field("revision", &self.revision)
            .field("source", &self.source)
            .finish()
    }
}

/// The mutable protocol state: who we are to cc-backend and what we last received.
#[derive(Default)]
struct State {
    instance_id: Option<String>,
    /// When the instance id was received: how long an instance lived before another
    /// registration of this member replaced it.
    registered_at: Option<tokio::time::Instant>,
    /// The ETag of `blob`, sent verbatim as `If-None-Match`.
    etag: String,
    revision: String,
    blob: Option<String>,
    /// What the agent runs, sent with every configuration poll (see
    /// [`crate::wire::AgentReport`]); none until [`Client::set_report`] is called.
    report: Option<reqwest::header::HeaderValue>,
}

struct Inner {
    http: http::Http,
    identity: Identity,
    meta: BTreeMap<String, String>,
    heartbeat_interval: Duration,
    poll_interval: Duration,
    heartbeat_subject: String,
    discovery_subject: String,
    cache: Option<Cache>,
    nats: Option<NatsProvider>,
    state: Mutex<State>,
    backoff: Mutex<Backoff>,
    lifecycle: watch::Sender<Lifecycle>,
    configs: Slot<Update>,
    rosters: Arc<Slot<Vec<Provider>>>,
    roster_gate: Arc<rosters::RosterGate>,
    /// Operations of the run loop failing now (kept by its warn-once reporter).
    failures: Arc<Mutex<Vec<Failure>>>,
    /// Times cc-backend no longer knew this member's instance and it registered again.
    replacements: std::sync::atomic::AtomicU64,
}

/// A fleet member. Cheap to clone; all clones share one registration.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the instance id: it authenticates heartbeats.
        f.debug_struct("Client")
            .field("service_type", &self.inner.identity.service_type)
            .field("scope", &self.inner.identity.scope)
            .field("cluster", &self.inner.identity.cluster)
            .field("hostname", &self.inner.identity.hostname)
            .field("registered", &self.registered())
            .finish()
    }
}

impl Client {
    /// Validates the options and builds the client. Does no network I/O.
    pub fn new(opts: Options) -> Result<Client, Error> {
        let config = opts.config;
        config.validate()?;
        let bases = config.base_urls()?;
        let token = config.resolve_token()?;
        let hostname = config.effective_hostname()?;
        let http_client = match opts.http_client {
            Some(client) => client,
            None => {
                // Trust anchors read at the first TLS handshake, not here (`crate::tls`).
                crate::tls::http_client_builder()
                    .timeout(config.timeout)
                    .build()
                    .map_err(Error::HttpClient)?
            }
        };
        let identity = Identity {
            service_type: opts.service_type,
            scope: Scope::of_cluster(&config.cluster),
            cluster: config.cluster.clone(),
            hostname,
        };
        let discovery_subject = crate::wire::discovery_subject(
            &config.discovery_subject_prefix,
            crate::wire::bucket(&config.cluster),
            opts.service_type,
        );
        let roster_gate = Arc::new(rosters::RosterGate::new(&config)?);
        let cache = config
            .cache_path
            .clone()
            .map(|path| Cache::new(path, identity.clone()));
        Ok(Client {
            inner: Arc::new(Inner {
                http: http::Http::new(http_client, bases, &token, config.timeout)?,
                identity,
                meta: opts.meta,
                heartbeat_interval: config.heartbeat_interval,
                poll_interval: config.config_poll_interval,
                heartbeat_subject: config.heartbeat_subject,
                discovery_subject,
                cache,
                nats: opts.nats,
                state: Mutex::new(State::default()),
                backoff: Mutex::new(Backoff::default()),
                lifecycle: watch::Sender::new(Lifecycle::default()),
                configs: Slot::new(),
                rosters: Arc::new(Slot::new()),
                roster_gate,
                failures: Arc::default(),
                replacements: std::sync::atomic::AtomicU64::new(0),
            }),
        })
    }

    /// `cluster`, or `infra` when no cluster is configured.
    pub fn scope(&self) -> Scope {
        self.inner.identity.scope
    }

    /// The service type this client registers as.
    pub fn service_type(&self) -> ServiceType {
        self.inner.identity.service_type
    }

    /// The hostname this client registers under.
    pub fn hostname(&self) -> &str {
        &self.inner.identity.hostname
    }

    /// The NATS subject rosters for this client arrive on.
    pub fn discovery_subject(&self) -> &str {
        &self.inner.discovery_subject
    }

    /// Sets what the agent runs, reported to the server with every configuration poll from
    /// now on (cc-backend ignores the header). A report that cannot be a header is dropped.
    pub fn set_report(&self, report: &crate::wire::AgentReport) {
        let value = reqwest::header::HeaderValue::from_str(&report.to_string()).ok();
        self.inner.state().report = value;
    }

    /// Whether the client currently holds an instance id.
    pub fn registered(&self) -> bool {
        self.inner.state().instance_id.is_some()
    }

    /// Configuration updates delivered by [`Client::run`]: only sent when the configuration
    /// really changed, and an unread update is replaced by a newer one.
    pub fn configs(&self) -> Latest<Update> {
        self.inner.configs.subscribe()
    }

    /// Discovery rosters (full lists, not deltas); an unread roster is replaced by a newer one.
    /// Only rosters within the configured size and provider caps (and, with
    /// `roster-public-key`, signed by the fleet server) are delivered.
    pub fn rosters(&self) -> Latest<Vec<Provider>> {
        self.inner.rosters.subscribe()
    }

    /// How many of the run loop's operations (register, heartbeat, config, subscribe) fail
    /// now: 0 while cc-backend (and the roster subscription) answer.
    pub fn failing_operations(&self) -> usize {
        self.failures().len()
    }

    /// The run loop's operations failing now, each with its latest error and the server
    /// that failed it; empty while cc-backend (and the roster subscription) answer.
    pub fn failures(&self) -> Vec<Failure> {
        self.inner
            .failures
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// How often cc-backend no longer knew this member's instance and the run loop
    /// registered again. Growing at every heartbeat, it means another service registers
    /// with the same cluster, host name and type (the run loop warns after
    /// [`REPLACED_WARN_AFTER`] quick replacements in a row).
    pub fn replacements(&self) -> u64 {
        self.inner
            .replacements
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The fleet server requests go to now, without user information (`user:password@`):
    /// the first `url` until it fails, then the next (see the module docs on failover).
    pub fn current_server(&self) -> &str {
        self.inner.http.current_shown()
    }

    /// Every configured fleet server in order of preference, without user information, each
    /// with whether it is considered down now (a failed request, and no healthy probe since).
    pub fn servers(&self) -> Vec<(String, bool)> {
        let servers = self.inner.http.servers();
        servers
            .down()
            .into_iter()
            .enumerate()
            .map(|(i, down)| (servers.get(i).shown.clone(), down))
            .collect()
    }

    /// How often the client moved to another fleet server: failovers and returns to a
    /// preferred server that is healthy again.
    pub fn server_changes(&self) -> u64 {
        self.inner.http.servers().failovers()
    }

    /// How many rosters were accepted and rejected, by reason.
    pub fn roster_stats(&self) -> RosterStats {
        self.inner.roster_gate.stats()
    }
}

impl Inner {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // The state stays consistent under every panic point (plain field assignments).
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn backoff(&self) -> std::sync::MutexGuard<'_, Backoff> {
        self.backoff.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options() -> Options {
        let mut config = Config::new("http://127.0.0.1:1/");
        config.cluster = "fritz".into();
        config.hostname = "f0101".into();
        config.token = "eyJ-secret".into();
        Options::new(config, ServiceType::MetricCollector)
    }

    #[test]
    fn new_does_no_io_and_derives_identity() {
        let client = Client::new(options()).unwrap();
        assert_eq!(client.scope(), Scope::Cluster);
        assert_eq!(client.hostname(), "f0101");
        assert_eq!(client.discovery_subject(), "cc.fleet.discovery.fritz.ccmc");
        assert!(!client.registered());
        let mut infra = options();
        infra.config.cluster.clear();
        infra.config.discovery_subject_prefix = "site.disc".into();
        let client = Client::new(infra).unwrap();
        assert_eq!(client.scope(), Scope::Infra);
        assert_eq!(client.discovery_subject(), "site.disc.infra.ccmc");
    }

    #[test]
    fn new_rejects_unusable_options() {
        let mut bad = options();
        bad.config.url = "cc.example.org".into();
        assert!(matches!(
            Client::new(bad),
            Err(Error::Config(ConfigError::InvalidUrl { .. }))
        ));
        let mut bad = options();
        bad.config.hostname = "a/b".into();
        assert!(matches!(
            Client::new(bad),
            Err(Error::Config(ConfigError::UnsafeName { .. }))
        ));
        let mut bad = options();
        bad.config.token = "line\nbreak".into();
        let err = Client::new(bad).unwrap_err();
        assert!(
            matches!(err, Error::Config(ConfigError::InvalidToken)),
            "{err}"
        );
        assert!(!err.to_string().contains("break"));
    }

    #[test]
    fn debug_output_holds_no_secrets() {
        let opts = options();
        assert!(!format!("{opts:?}").contains("eyJ-secret"));
        let client = Client::new(opts).unwrap();
        assert!(!format!("{client:?}").contains("eyJ-secret"));
        let update = Update {
            config: Some(r#"{"password":"hunter2"}"#.into()),
            revision: "7".into(),
            source: Source::Fleet,
        };
        let shown = format!("{update:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("22 bytes"), "{shown}");
    }

    #[test]
    fn source_names() {
        assert_eq!(Source::None.to_string(), "none");
        assert_eq!(Source::Fleet.to_string(), "fleet");
        assert_eq!(Source::Cache.to_string(), "cache");
        assert_eq!(Update::none().source, Source::None);
    }
}
