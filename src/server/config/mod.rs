//! The server's JSON configuration file (`ccfleet server --config FILE`).
//!
//! The top level carries the HTTP and security settings cc-backend keeps in `main`, the
//! `nats` object is cc-lib's NATS client config, and `fleet` takes cc-backend's
//! `main.fleet` keys with the same defaults.
//!
//! This file holds the documented settings and their defaults; `raw` the form serde reads
//! and its conversion into them, `check` the address and subject checks.

use std::path::{Path, PathBuf};
use std::time::Duration;

mod check;
mod raw;
#[cfg(test)]
mod tests;

/// Default HTTP listen address.
pub const DEFAULT_ADDR: &str = "127.0.0.1:8080";
/// Default age after which an `active` instance without heartbeats becomes `stale`.
pub const DEFAULT_STALE_AFTER: Duration = Duration::from_secs(90);
/// Default period of the stale sweep.
pub const DEFAULT_SWEEP_INTERVAL: Duration = Duration::from_secs(30);
/// Default `fleet.rollout-interval`: how often the leading server judges each staged
/// rollout's stage (a look over every covered member; about 70 ms at 100,000 members).
pub const DEFAULT_ROLLOUT_INTERVAL: Duration = Duration::from_secs(5);
/// Default period of the config tree rescan.
pub const DEFAULT_CONFIG_RELOAD_INTERVAL: Duration = Duration::from_secs(60);
/// Default number of heartbeat decoder tasks.
pub const DEFAULT_HEARTBEAT_CONCURRENCY: usize = 2;
/// Default number of heartbeat messages the NATS client holds for the consumer before it
/// drops (and counts) them; with multi-line messages this is hundreds of thousands of
/// heartbeats.
pub const DEFAULT_HEARTBEAT_PENDING_MESSAGES: usize = 1024;
/// Upper bound of `fleet.heartbeat-pending-messages` (a message can be up to the server's
/// `max_payload`, 1 MiB by default, so the bound keeps the worst case at a few GiB).
pub const MAX_HEARTBEAT_PENDING_MESSAGES: usize = 4096;
/// Default period of the full roster re-publish.
pub const DEFAULT_DISCOVERY_INTERVAL: Duration = Duration::from_secs(60);
/// Default delay that coalesces roster re-publishes after registry changes.
pub const DEFAULT_DISCOVERY_DEBOUNCE: Duration = Duration::from_secs(2);
/// Default time a client has to send a request's headers (and the idle keep-alive limit).
pub const DEFAULT_HTTP_HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// Default longest pause while a request body is received.
pub const DEFAULT_HTTP_BODY_TIMEOUT: Duration = Duration::from_secs(30);
/// Default number of HTTP connections served at once: well below the common soft limit of
/// 1024 file descriptors, so the registry and the config tree reload keep theirs.
pub const DEFAULT_HTTP_MAX_CONNECTIONS: usize = 512;

/// The whole server configuration.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// HTTP listen address (`host:port`; port 0 picks a free port).
    pub addr: String,
    /// SQLite file of the registry; `None` keeps the registry in memory (lost on restart).
    pub db: Option<PathBuf>,
    /// Client addresses allowed to use `/api/`: exact strings, `*`, or CIDR ranges.
    /// Empty allows every address.
    pub api_allowed_ips: Vec<String>,
    /// Peers (addresses or CIDR ranges) whose `X-Real-IP` / `X-Forwarded-For` headers name
    /// the client for `api_allowed_ips`. Empty (the default) believes no such header.
    pub trusted_proxies: Vec<String>,
    /// Timeouts and the connection cap of the HTTP listener.
    pub http: HttpLimits,
    /// Accept API requests without a token.
    pub disable_authentication: bool,
    /// Base64 Ed25519 public key for token checks; the `JWT_PUBLIC_KEY` environment
    /// variable is used when this is unset.
    pub jwt_public_key: Option<String>,
    /// Base64 Ed25519 private key (cc-backend's `JWT_PRIVATE_KEY` format) that signs discovery
    /// rosters; the `JWT_PRIVATE_KEY` environment variable is used when this is unset. Without
    /// one, rosters go out unsigned.
    pub jwt_private_key: Option<String>,
    /// NATS connection; without it the server runs REST-only.
    pub nats: Option<NatsConfig>,
    /// The fleet service settings.
    pub fleet: FleetConfig,
    /// Where the registry lives (`registry`): SQLite (`db`, the default) or a JetStream
    /// key-value bucket shared by several servers.
    pub registry: RegistryConfig,
}

/// Default TTL of the roster publisher's lease with a JetStream registry.
pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(5);

/// The `registry` section: `{"type": "sqlite"}` (the default; the file is the top-level
/// `db`) or `{"type": "jetstream-kv", "bucket": ..., "replicas": ..., "lease-ttl": ...}`
/// on the configured `nats` connection.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum RegistryConfig {
    /// SQLite in the file `db` (in memory without one).
    #[default]
    Sqlite,
    /// A JetStream key-value bucket, shared by every server configured with it.
    JetStreamKv(super::registry::jetstream::JetStreamSettings),
}

pub use crate::nats::NatsConfig;

/// Limits of the HTTP listener (`http-header-timeout`, `http-body-timeout`,
/// `http-max-connections`); cc-backend leaves these to Go's defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HttpLimits {
    /// Time a client has to send a request's complete headers, counted from the
    /// connection's start or the end of the previous response; so also the time an idle
    /// keep-alive connection stays open.
    pub header_timeout: Duration,
    /// The longest pause while a request body is received; the request then fails.
    pub body_timeout: Duration,
    /// Connections served at once; further clients wait in the listen backlog.
    pub max_connections: usize,
}

impl Default for HttpLimits {
    fn default() -> Self {
        HttpLimits {
            header_timeout: DEFAULT_HTTP_HEADER_TIMEOUT,
            body_timeout: DEFAULT_HTTP_BODY_TIMEOUT,
            max_connections: DEFAULT_HTTP_MAX_CONNECTIONS,
        }
    }
}

/// cc-backend's `main.fleet` settings, with its defaults.
#[derive(Debug, Clone)]
pub struct FleetConfig {
    /// Root of the config tree; `None` means every config pull answers 204.
    pub config_dir: Option<PathBuf>,
    /// Directory of plugin components served by SHA-256 at `/api/fleet/plugins/{sha256}`;
    /// `None` answers 404 for every plugin.
    pub plugin_dir: Option<PathBuf>,
    /// Heartbeat age after which an `active` instance becomes `stale`.
    pub stale_after: Duration,
    /// Period of the stale sweep.
    pub sweep_interval: Duration,
    /// How often the leading server judges each staged rollout's stage.
    pub rollout_interval: Duration,
    /// Period of the config tree rescan.
    pub config_reload_interval: Duration,
    /// NATS subject of heartbeats; `None` disables the NATS consumer.
    pub heartbeat_subject: Option<String>,
    /// Number of heartbeat decoder tasks.
    pub heartbeat_concurrency: usize,
    /// Heartbeat messages buffered for the consumer before NATS messages are dropped
    /// (counted in `ccfleet_heartbeat_messages_dropped_total`); sizes the absorbable burst.
    pub heartbeat_pending_messages: usize,
    /// Prefix of roster subjects.
    pub discovery_subject_prefix: String,
    /// Period of the full roster re-publish.
    pub discovery_interval: Duration,
    /// Delay that coalesces roster re-publishes after registry changes (ccfleet extension;
    /// cc-backend hard-codes two seconds).
    pub discovery_debounce: Duration,
    /// `heartbeat-stream`: consume the heartbeat subject through a JetStream stream and a
    /// shared durable consumer instead of a plain queue subscription (ccfleet extension).
    pub heartbeat_stream: Option<HeartbeatStreamConfig>,
}

/// Default name of the heartbeat stream.
pub const DEFAULT_HEARTBEAT_STREAM: &str = "ccfleet-heartbeats";
/// Default name of the durable consumer every server shares.
pub const DEFAULT_HEARTBEAT_CONSUMER: &str = "ccfleet-server";
/// Default age after which JetStream discards an unconsumed heartbeat.
pub const DEFAULT_HEARTBEAT_STREAM_MAX_AGE: Duration = Duration::from_secs(3600);
/// Default size bound of the heartbeat stream (the oldest heartbeats go first).
pub const DEFAULT_HEARTBEAT_STREAM_MAX_BYTES: i64 = 1 << 30;
/// Default time JetStream waits for an acknowledgement before it redelivers a heartbeat.
pub const DEFAULT_HEARTBEAT_ACK_WAIT: Duration = Duration::from_secs(30);
/// Shortest `heartbeat-stream.ack-wait`: a batch is held for up to a second before it is
/// applied, so a shorter wait would redeliver messages that are still being handled.
pub const MIN_HEARTBEAT_ACK_WAIT: Duration = Duration::from_secs(5);

/// The `fleet.heartbeat-stream` section: `{"name", "consumer", "replicas", "max-age",
/// "max-bytes", "ack-wait"}`, every key optional.
///
/// The server makes sure a stream with this name captures `heartbeat-subject` (agents keep
/// publishing plain NATS messages; JetStream stores them) and reads it through the durable
/// pull consumer `consumer`, acknowledging a message only once its heartbeats are applied
/// to the registry. Servers configured with the same names share the consumer, so each
/// heartbeat is applied by one of them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeartbeatStreamConfig {
    /// Stream name (`[A-Za-z0-9_-]+`).
    pub name: String,
    /// Durable consumer name (`[A-Za-z0-9_-]+`), shared by every server.
    pub consumer: String,
    /// Stream replicas in a JetStream cluster (1 to 5).
    pub replicas: usize,
    /// Unconsumed heartbeats older than this are discarded by JetStream.
    pub max_age: Duration,
    /// Size bound of the stream in bytes; when full, the oldest heartbeats are discarded.
    pub max_bytes: i64,
    /// Time JetStream waits for an acknowledgement before it redelivers a message.
    pub ack_wait: Duration,
}

impl Default for FleetConfig {
    fn default() -> Self {
        FleetConfig {
            config_dir: None,
            plugin_dir: None,
            stale_after: DEFAULT_STALE_AFTER,
            sweep_interval: DEFAULT_SWEEP_INTERVAL,
            rollout_interval: DEFAULT_ROLLOUT_INTERVAL,
            config_reload_interval: DEFAULT_CONFIG_RELOAD_INTERVAL,
            heartbeat_subject: None,
            heartbeat_concurrency: DEFAULT_HEARTBEAT_CONCURRENCY,
            heartbeat_pending_messages: DEFAULT_HEARTBEAT_PENDING_MESSAGES,
            discovery_subject_prefix: crate::wire::DEFAULT_DISCOVERY_PREFIX.to_owned(),
            discovery_interval: DEFAULT_DISCOVERY_INTERVAL,
            discovery_debounce: DEFAULT_DISCOVERY_DEBOUNCE,
            heartbeat_stream: None,
        }
    }
}

impl ServerConfig {
    /// Resolves a relative `db`, `fleet.config-dir` and `fleet.plugin-dir` against `base`, the directory of the
    /// configuration file, so the server finds the same files whatever its working directory
    /// (`ccfleet server --config FILE` does this; the agent resolves its paths the same way).
    pub fn resolve_paths(&mut self, base: &Path) {
        for path in [
            self.db.as_mut(),
            self.fleet.config_dir.as_mut(),
            self.fleet.plugin_dir.as_mut(),
        ]
        .into_iter()
        .flatten()
        {
            if path.is_relative() {
                *path = base.join(&*path);
            }
        }
    }

    /// What this configuration allows but an operator probably did not mean, one sentence
    /// each (`ccfleet server` logs them at start-up, `--check-config` prints them).
    pub fn warnings(&self) -> Vec<String> {
        let mut warnings = Vec::new();
        if let Some(dir) = &self.fleet.config_dir
            && !dir.exists()
        {
            warnings.push(format!(
                "fleet.config-dir {} does not exist: every configuration pull answers 204 (no content) until it is created",
                dir.display()
            ));
        }
        warnings
    }
}
