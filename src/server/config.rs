//! The server's JSON configuration file (`ccfleet server --config FILE`).
//!
//! The top level carries the HTTP and security settings cc-backend keeps in `main`, the
//! `nats` object is cc-lib's NATS client config, and `fleet` takes cc-backend's
//! `main.fleet` keys with the same defaults.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use super::error::ServerError;
use crate::untrusted::Untrusted;

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

/// Where the registry lives: `{"type": "sqlite"}` (the file `db`, the default) or
/// `{"type": "jetstream-kv", ...}`, a key-value bucket several servers share (see the book's
/// "Scale-out on JetStream").
#[derive(Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct RawRegistry {
    /// `sqlite` (the file `db`) or `jetstream-kv` (a bucket shared by several servers, on the
    /// `nats` connection).
    #[serde(rename = "type")]
    kind: String,
    /// `jetstream-kv` only: the key-value bucket (letters, digits, `-`, `_`); created at
    /// start-up if missing. Default `ccfleet`.
    bucket: Option<String>,
    /// `jetstream-kv` only: replicas of the bucket when it is created, 1 to 5 (3 needs a NATS
    /// cluster of at least 3 nodes). Default 1.
    replicas: Option<i64>,
    /// `jetstream-kv` only: the roster publisher's lease (Go duration); failover takes at
    /// most 5/3 of it. Default `5s`.
    lease_ttl: Option<String>,
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

/// Opt-in: heartbeats read through a JetStream stream and a durable consumer every server
/// shares, so heartbeats published while servers are down, slow or failing are kept. Needs
/// `heartbeat-subject`, `nats` and JetStream on the NATS server; `{}` takes every default.
#[derive(Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct RawHeartbeatStream {
    /// The stream (letters, digits, `-`, `_`); created at start-up if missing, used as it is
    /// if present (it must capture `heartbeat-subject`). Default `ccfleet-heartbeats`.
    name: Option<String>,
    /// The durable pull consumer every server shares (letters, digits, `-`, `_`). Default
    /// `ccfleet-server`.
    consumer: Option<String>,
    /// Replicas of the stream when it is created, 1 to 5. Default 1.
    replicas: Option<i64>,
    /// Unconsumed heartbeats older than this are discarded (Go duration, at least `1s`).
    /// Default `1h`.
    max_age: Option<String>,
    /// Size bound of the stream in bytes (at least 1048576); when full, the oldest
    /// heartbeats are discarded. Default 1 GiB.
    max_bytes: Option<i64>,
    /// Time JetStream waits for an acknowledgement before it redelivers a message (Go
    /// duration, at least `5s`); applied to the consumer at each start. Default `30s`.
    ack_wait: Option<String>,
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

/// The server's configuration file (`ccfleet server --config FILE`): what cc-backend keeps
/// in its `main` section at the top level, cc-lib's NATS client section as `nats`, and
/// cc-backend's `main.fleet` keys, with the same defaults, as `fleet`.
#[derive(Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct RawConfig {
    /// HTTP listen address, `host:port` (`0.0.0.0:8080` for every IPv4 address, `[::]:8080`
    /// for IPv6); port 0 picks a free port. Default `127.0.0.1:8080`.
    addr: Option<String>,
    /// SQLite file of the registry; its directory must exist; one server per file. Default:
    /// none, the registry is kept in memory and lost on restart.
    db: Option<PathBuf>,
    /// Client addresses allowed on `/api/`: exact addresses, `*`, or CIDR ranges. Default
    /// `[]`: every address.
    #[serde(default)]
    api_allowed_ips: Vec<String>,
    /// Peers (addresses or CIDR ranges) whose `X-Real-IP` / `X-Forwarded-For` name the client
    /// for `api-allowed-ips`; from any other peer these headers are ignored, since every
    /// client can send them. Behind a trusted proxy the client is `X-Real-IP`, else the
    /// right-most `X-Forwarded-For` entry that is not itself a trusted proxy. Default `[]`.
    #[serde(default)]
    trusted_proxies: Vec<String>,
    /// Time a client has to send a request's headers, from connecting or from the previous
    /// response; idle keep-alive connections close after it too (Go duration). Default `10s`.
    http_header_timeout: Option<String>,
    /// Longest pause while a request body arrives; the request then fails with 400 (Go
    /// duration). Default `30s`.
    http_body_timeout: Option<String>,
    /// Connections served at once; further clients wait in the listen backlog, so file
    /// descriptors stay free for the registry and the configuration tree. Default 512.
    http_max_connections: Option<i64>,
    /// Accept API requests without a token. Default `false`.
    #[serde(default)]
    disable_authentication: bool,
    /// Standard base64 of the 32-byte Ed25519 public key that checks API tokens
    /// (`ccfleet keygen`'s `JWT_PUBLIC_KEY=` line); required unless authentication is
    /// disabled. Default: the `JWT_PUBLIC_KEY` environment variable.
    jwt_public_key: Option<String>,
    /// Standard base64 of the 64-byte Ed25519 private key of the same pair
    /// (`ccfleet keygen`'s `JWT_PRIVATE_KEY=` line); signs the discovery rosters. Default:
    /// the `JWT_PRIVATE_KEY` environment variable, else none: rosters go out unsigned.
    jwt_private_key: Option<String>,
    /// The NATS connection (heartbeats, rosters, the JetStream registry). Default: none, the
    /// server runs REST only.
    nats: Option<NatsConfig>,
    /// cc-backend's `main.fleet` settings.
    #[serde(default)]
    fleet: RawFleet,
    /// Where the registry lives. Default `{"type": "sqlite"}`.
    registry: Option<RawRegistry>,
}

// Durations stay strings here, parsed with Go's syntax below. cc-backend logs a malformed
// one and falls back to the default; this server refuses it instead (at start-up and in
// `--check-config` alike): a typo such as "90 seconds" would otherwise run the fleet with a
// value nobody chose, and the warning scrolls by unread.
/// cc-backend's `main.fleet` keys, with its defaults.
#[derive(Deserialize, Default)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct RawFleet {
    /// Root of the configuration tree. Default: none, every configuration pull answers 204.
    config_dir: Option<PathBuf>,
    /// Directory of WebAssembly components served by the SHA-256 of their content at
    /// `GET /api/fleet/plugins/{sha256}`; it must be readable at start and hold every
    /// component the configuration tree names by `sha256` (checked at start and by
    /// `--check-config`). Default: none, every plugin download answers 404.
    plugin_dir: Option<PathBuf>,
    /// Heartbeat age after which an `active` member becomes `stale` (Go duration). Default
    /// `90s`.
    stale_after: Option<String>,
    /// Period of the stale sweep (Go duration). Default `30s`.
    sweep_interval: Option<String>,
    /// How often the leading server judges each staged rollout's stage, a look over every
    /// covered member: about 70 ms at 100,000 (Go duration). Default `5s`.
    rollout_interval: Option<String>,
    /// Period of the configuration tree rescan (Go duration). Default `60s`.
    config_reload_interval: Option<String>,
    /// NATS subject of heartbeats, e.g. `cc.fleet.event`. Default: none, no NATS heartbeats.
    heartbeat_subject: Option<String>,
    /// Heartbeat decoder tasks of the plain subscription. Default 2.
    heartbeat_concurrency: Option<i64>,
    /// Heartbeat messages the NATS client holds while the consumer is busy, 1 to 4096;
    /// beyond it messages are dropped and counted. Default 1024.
    heartbeat_pending_messages: Option<i64>,
    /// Prefix of the roster subjects. Default `cc.fleet.discovery`.
    discovery_subject_prefix: Option<String>,
    /// Period of the full roster re-publish (Go duration). Default `60s`.
    discovery_interval: Option<String>,
    /// Delay that coalesces roster re-publishes after registry changes (Go duration;
    /// cc-backend hard-codes two seconds). Default `2s`.
    discovery_debounce: Option<String>,
    /// Read the heartbeat subject through a JetStream stream instead of a plain queue
    /// subscription. Default: none.
    heartbeat_stream: Option<RawHeartbeatStream>,
}

/// A positive Go duration, or `default` when the key is absent or empty.
fn duration_or_default(
    key: &str,
    raw: Option<&str>,
    default: Duration,
) -> Result<Duration, ServerError> {
    let Some(raw) = raw.filter(|s| !s.is_empty()) else {
        return Ok(default);
    };
    match crate::duration::parse(raw) {
        Ok(d) if !d.is_zero() => Ok(d),
        Ok(_) => Err(ServerError::InvalidValue(format!(
            "{key} must be a positive duration, got \"{}\" (the default is \"{}\")",
            Untrusted(raw),
            crate::duration::format(default)
        ))),
        Err(e) => Err(ServerError::InvalidValue(format!(
            "{key} \"{}\" is not a Go duration ({e}); write e.g. \"{}\", \"1m30s\" or \"1.5h\"",
            Untrusted(raw),
            crate::duration::format(default)
        ))),
    }
}

/// Checks `addr` is what the listener binds: `host:port`, the host a name, an IPv4 address
/// or a bracketed IPv6 address, the port a number (0 picks a free one).
fn check_addr(addr: &str) -> Result<(), ServerError> {
    let refuse = |why: &str| {
        Err(ServerError::InvalidValue(format!(
            "addr \"{}\" {why}; write \"host:port\", e.g. \"127.0.0.1:8080\", \"0.0.0.0:8080\" (every IPv4 address) or \"[::]:8080\"",
            Untrusted(addr)
        )))
    };
    let Some((host, port)) = addr.rsplit_once(':') else {
        return refuse("has no port");
    };
    if port.parse::<u16>().is_err() {
        return refuse(if port.is_empty() {
            "has no port"
        } else {
            "has no valid port (0 to 65535)"
        });
    }
    if host.is_empty() {
        return refuse("has no host (Go's \":8080\" form is not accepted)");
    }
    if host.contains(':') && !(host.starts_with('[') && host.ends_with(']')) {
        return refuse("holds an IPv6 address without brackets");
    }
    if host
        .chars()
        .any(|c| c.is_whitespace() || c.is_control() || c == '/')
    {
        return refuse("is not a host name or address");
    }
    Ok(())
}

/// Whether `prefix` is literal NATS subject tokens: non-empty tokens joined by `.`, without
/// wildcards, whitespace or control characters, and short enough to leave room in
/// nats-server's 4 KiB control line for the bucket and type that follow.
fn is_subject_prefix(prefix: &str) -> bool {
    prefix.len() <= 1024
        && prefix.split('.').all(|token| {
            !token.is_empty()
                && !token
                    .chars()
                    .any(|c| c == '*' || c == '>' || c.is_whitespace() || c.is_control())
        })
}

/// Whether nats-server accepts `subject` in a subscription: non-empty tokens joined by `.`,
/// without whitespace or control characters, where a wildcard is a whole token (`*`, or `>`
/// as the last one), at most 1024 bytes.
fn is_subscription_subject(subject: &str) -> bool {
    let mut tokens = subject.split('.').peekable();
    subject.len() <= 1024
        && std::iter::from_fn(|| tokens.next().map(|t| (t, tokens.peek().is_none()))).all(
            |(token, last)| {
                !token.is_empty()
                    && !token.chars().any(|c| c.is_whitespace() || c.is_control())
                    && match token {
                        "*" => true,
                        ">" => last,
                        _ => !token.contains(['*', '>']),
                    }
            },
        )
}

impl ServerConfig {
    /// The JSON Schema of the configuration file, its keys described by their documentation
    /// (the book's configuration reference is generated from it).
    #[cfg(feature = "schema")]
    pub fn json_schema() -> schemars::Schema {
        schemars::schema_for!(RawConfig)
    }

    /// Parses the JSON configuration file text.
    ///
    /// Unknown keys, values of the wrong type (named by their key), an `addr` that is not
    /// `host:port` and malformed or non-positive durations are errors. cc-backend logs a
    /// malformed duration and uses the default; this server refuses it (see `RawFleet`).
    pub fn from_json(text: &str) -> Result<ServerConfig, ServerError> {
        let raw: RawConfig =
            crate::json_config::from_str(text).map_err(ServerError::ConfigSyntax)?;
        let f = raw.fleet;
        let heartbeat_concurrency = match f.heartbeat_concurrency {
            None => DEFAULT_HEARTBEAT_CONCURRENCY,
            Some(n) if n > 0 => usize::try_from(n).unwrap_or(DEFAULT_HEARTBEAT_CONCURRENCY),
            Some(n) => {
                tracing::warn!(
                    "Config: fleet.heartbeat-concurrency: {n} is not positive, using {DEFAULT_HEARTBEAT_CONCURRENCY}"
                );
                DEFAULT_HEARTBEAT_CONCURRENCY
            }
        };
        let heartbeat_pending_messages = match f.heartbeat_pending_messages {
            None => DEFAULT_HEARTBEAT_PENDING_MESSAGES,
            Some(n) if n > 0 && n <= MAX_HEARTBEAT_PENDING_MESSAGES as i64 => n as usize,
            Some(_) => {
                return Err(ServerError::InvalidConfig(
                    "fleet.heartbeat-pending-messages must be between 1 and 4096",
                ));
            }
        };
        // Every roster subject starts with the prefix: one that is not plain subject tokens
        // would silence (or cross-deliver) every roster, so refuse it at start-up.
        if let Some(prefix) = f.discovery_subject_prefix.as_deref()
            && !prefix.is_empty()
            && !is_subject_prefix(prefix)
        {
            return Err(ServerError::InvalidConfig(
                "fleet.discovery-subject-prefix must be NATS subject tokens joined by '.' (at most 1024 bytes, no empty token, wildcard, whitespace or control character)",
            ));
        }
        // nats-server refuses such a subscription, which would end the server at start.
        if let Some(subject) = f.heartbeat_subject.as_deref()
            && !subject.is_empty()
            && !is_subscription_subject(subject)
        {
            return Err(ServerError::InvalidConfig(
                "fleet.heartbeat-subject must be a NATS subject: tokens joined by '.' (at most 1024 bytes, no empty token, whitespace or control character; '*' and a final '>' only as whole tokens)",
            ));
        }
        let heartbeat_stream = heartbeat_stream_config(
            f.heartbeat_stream,
            f.heartbeat_subject
                .as_deref()
                .is_some_and(|s| !s.is_empty()),
            raw.nats.is_some(),
        )?;
        let fleet = FleetConfig {
            config_dir: f.config_dir.filter(|p| !p.as_os_str().is_empty()),
            plugin_dir: f.plugin_dir.filter(|p| !p.as_os_str().is_empty()),
            stale_after: duration_or_default(
                "fleet.stale-after",
                f.stale_after.as_deref(),
                DEFAULT_STALE_AFTER,
            )?,
            sweep_interval: duration_or_default(
                "fleet.sweep-interval",
                f.sweep_interval.as_deref(),
                DEFAULT_SWEEP_INTERVAL,
            )?,
            rollout_interval: duration_or_default(
                "fleet.rollout-interval",
                f.rollout_interval.as_deref(),
                DEFAULT_ROLLOUT_INTERVAL,
            )?,
            config_reload_interval: duration_or_default(
                "fleet.config-reload-interval",
                f.config_reload_interval.as_deref(),
                DEFAULT_CONFIG_RELOAD_INTERVAL,
            )?,
            heartbeat_subject: f.heartbeat_subject.filter(|s| !s.is_empty()),
            heartbeat_concurrency,
            heartbeat_pending_messages,
            discovery_subject_prefix: f
                .discovery_subject_prefix
                .filter(|s| !s.is_empty())
                .unwrap_or_else(|| crate::wire::DEFAULT_DISCOVERY_PREFIX.to_owned()),
            discovery_interval: duration_or_default(
                "fleet.discovery-interval",
                f.discovery_interval.as_deref(),
                DEFAULT_DISCOVERY_INTERVAL,
            )?,
            discovery_debounce: duration_or_default(
                "fleet.discovery-debounce",
                f.discovery_debounce.as_deref(),
                DEFAULT_DISCOVERY_DEBOUNCE,
            )?,
            heartbeat_stream,
        };
        let max_connections = match raw.http_max_connections {
            None => DEFAULT_HTTP_MAX_CONNECTIONS,
            Some(n) if n > 0 => usize::try_from(n).unwrap_or(DEFAULT_HTTP_MAX_CONNECTIONS),
            Some(_) => {
                return Err(ServerError::InvalidConfig(
                    "http-max-connections must be positive",
                ));
            }
        };
        let http = HttpLimits {
            header_timeout: duration_or_default(
                "http-header-timeout",
                raw.http_header_timeout.as_deref(),
                DEFAULT_HTTP_HEADER_TIMEOUT,
            )?,
            body_timeout: duration_or_default(
                "http-body-timeout",
                raw.http_body_timeout.as_deref(),
                DEFAULT_HTTP_BODY_TIMEOUT,
            )?,
            max_connections,
        };
        if let Some(nats) = &raw.nats
            && nats.address.is_empty()
        {
            return Err(ServerError::InvalidConfig("nats.address is required"));
        }
        let registry = registry_config(raw.registry, raw.db.is_some(), raw.nats.is_some())?;
        let addr = raw
            .addr
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| DEFAULT_ADDR.to_owned());
        check_addr(&addr)?;
        Ok(ServerConfig {
            addr,
            db: raw.db.filter(|p| !p.as_os_str().is_empty()),
            api_allowed_ips: raw.api_allowed_ips,
            trusted_proxies: raw.trusted_proxies,
            http,
            disable_authentication: raw.disable_authentication,
            jwt_public_key: raw.jwt_public_key.filter(|s| !s.is_empty()),
            jwt_private_key: raw.jwt_private_key.filter(|s| !s.is_empty()),
            nats: raw.nats,
            fleet,
            registry,
        })
    }
}

fn heartbeat_stream_config(
    raw: Option<RawHeartbeatStream>,
    has_subject: bool,
    has_nats: bool,
) -> Result<Option<HeartbeatStreamConfig>, ServerError> {
    let Some(raw) = raw else {
        return Ok(None);
    };
    if !has_subject {
        return Err(ServerError::InvalidConfig(
            "fleet.heartbeat-stream needs fleet.heartbeat-subject (the subject the stream captures)",
        ));
    }
    if !has_nats {
        return Err(ServerError::InvalidConfig(
            "fleet.heartbeat-stream needs a nats connection",
        ));
    }
    let is_name = super::registry::jetstream::is_bucket_name;
    let name = raw
        .name
        .unwrap_or_else(|| DEFAULT_HEARTBEAT_STREAM.to_owned());
    if !is_name(&name) {
        return Err(ServerError::InvalidConfig(
            "fleet.heartbeat-stream.name must be letters, digits, '-' and '_'",
        ));
    }
    let consumer = raw
        .consumer
        .unwrap_or_else(|| DEFAULT_HEARTBEAT_CONSUMER.to_owned());
    if !is_name(&consumer) {
        return Err(ServerError::InvalidConfig(
            "fleet.heartbeat-stream.consumer must be letters, digits, '-' and '_'",
        ));
    }
    let replicas = match raw.replicas {
        None => 1,
        Some(n @ 1..=5) => n as usize,
        Some(_) => {
            return Err(ServerError::InvalidConfig(
                "fleet.heartbeat-stream.replicas must be between 1 and 5",
            ));
        }
    };
    let max_age = match raw.max_age.as_deref().map(crate::duration::parse) {
        None => DEFAULT_HEARTBEAT_STREAM_MAX_AGE,
        Some(Ok(d)) if d >= Duration::from_secs(1) => d,
        Some(_) => {
            return Err(ServerError::InvalidConfig(
                "fleet.heartbeat-stream.max-age must be a duration of at least 1s (e.g. \"1h\")",
            ));
        }
    };
    let max_bytes = match raw.max_bytes {
        None => DEFAULT_HEARTBEAT_STREAM_MAX_BYTES,
        Some(n) if n >= 1 << 20 => n,
        Some(_) => {
            return Err(ServerError::InvalidConfig(
                "fleet.heartbeat-stream.max-bytes must be at least 1048576 (1 MiB, the largest NATS message by default)",
            ));
        }
    };
    let ack_wait = match raw.ack_wait.as_deref().map(crate::duration::parse) {
        None => DEFAULT_HEARTBEAT_ACK_WAIT,
        Some(Ok(d)) if d >= MIN_HEARTBEAT_ACK_WAIT => d,
        Some(_) => {
            return Err(ServerError::InvalidConfig(
                "fleet.heartbeat-stream.ack-wait must be a duration of at least 5s (e.g. \"30s\")",
            ));
        }
    };
    Ok(Some(HeartbeatStreamConfig {
        name,
        consumer,
        replicas,
        max_age,
        max_bytes,
        ack_wait,
    }))
}

fn registry_config(
    raw: Option<RawRegistry>,
    has_db: bool,
    has_nats: bool,
) -> Result<RegistryConfig, ServerError> {
    let Some(raw) = raw else {
        return Ok(RegistryConfig::Sqlite);
    };
    match raw.kind.as_str() {
        "sqlite" => {
            if raw.bucket.is_some() || raw.replicas.is_some() || raw.lease_ttl.is_some() {
                return Err(ServerError::InvalidConfig(
                    "registry: bucket, replicas and lease-ttl belong to \"type\": \"jetstream-kv\" (the SQLite file is the top-level db)",
                ));
            }
            Ok(RegistryConfig::Sqlite)
        }
        "jetstream-kv" => {
            if !has_nats {
                return Err(ServerError::InvalidConfig(
                    "registry: \"type\": \"jetstream-kv\" needs a nats connection",
                ));
            }
            if has_db {
                return Err(ServerError::InvalidConfig(
                    "registry: db names a SQLite registry; with \"type\": \"jetstream-kv\" leave it out (copy it into the bucket with `ccfleet server migrate --from-sqlite FILE`)",
                ));
            }
            let bucket = raw.bucket.unwrap_or_else(|| "ccfleet".to_owned());
            if !super::registry::jetstream::is_bucket_name(&bucket) {
                return Err(ServerError::InvalidConfig(
                    "registry.bucket must be letters, digits, '-' and '_'",
                ));
            }
            let replicas = match raw.replicas {
                None => 1,
                Some(n @ 1..=5) => n as usize,
                Some(_) => {
                    return Err(ServerError::InvalidConfig(
                        "registry.replicas must be between 1 and 5",
                    ));
                }
            };
            let lease_ttl = match raw.lease_ttl.as_deref().map(crate::duration::parse) {
                None => DEFAULT_LEASE_TTL,
                Some(Ok(d)) if d >= Duration::from_millis(300) => d,
                Some(_) => {
                    return Err(ServerError::InvalidConfig(
                        "registry.lease-ttl must be a duration of at least 300ms (e.g. \"5s\")",
                    ));
                }
            };
            Ok(RegistryConfig::JetStreamKv(
                super::registry::jetstream::JetStreamSettings {
                    bucket,
                    replicas,
                    lease_ttl,
                },
            ))
        }
        _ => Err(ServerError::InvalidConfig(
            "registry.type must be \"sqlite\" or \"jetstream-kv\"",
        )),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_match_cc_backend() {
        let c = ServerConfig::from_json("{}").unwrap();
        assert_eq!(c.addr, DEFAULT_ADDR);
        assert!(c.db.is_none() && c.nats.is_none() && !c.disable_authentication);
        assert_eq!(c.fleet.stale_after, Duration::from_secs(90));
        assert_eq!(c.fleet.sweep_interval, Duration::from_secs(30));
        assert_eq!(c.fleet.config_reload_interval, Duration::from_secs(60));
        assert_eq!(c.fleet.discovery_interval, Duration::from_secs(60));
        assert_eq!(c.fleet.discovery_debounce, Duration::from_secs(2));
        assert_eq!(c.fleet.heartbeat_concurrency, 2);
        assert_eq!(c.fleet.discovery_subject_prefix, "cc.fleet.discovery");
        assert!(c.fleet.heartbeat_subject.is_none());
        assert!(
            c.trusted_proxies.is_empty(),
            "no proxy is trusted by default"
        );
        assert_eq!(c.http, HttpLimits::default());
    }

    #[test]
    fn parses_the_http_limits_and_trusted_proxies() {
        let c = ServerConfig::from_json(
            r#"{"trusted-proxies":["10.0.0.1","192.168.0.0/16"],"http-header-timeout":"250ms",
            "http-body-timeout":"2s","http-max-connections":64}"#,
        )
        .unwrap();
        assert_eq!(c.trusted_proxies, ["10.0.0.1", "192.168.0.0/16"]);
        assert_eq!(c.http.header_timeout, Duration::from_millis(250));
        assert_eq!(c.http.body_timeout, Duration::from_secs(2));
        assert_eq!(c.http.max_connections, 64);
        assert!(ServerConfig::from_json(r#"{"http-max-connections":0}"#).is_err());
        let e = ServerConfig::from_json(r#"{"http-header-timeout":"soon"}"#).unwrap_err();
        assert!(e.to_string().contains("http-header-timeout"), "{e}");
    }

    #[test]
    fn parses_every_key() {
        let c = ServerConfig::from_json(
            r#"{"addr":"127.0.0.1:0","db":"x.sqlite","api-allowed-ips":["10.0.0.0/8"],
            "disable-authentication":true,"jwt-public-key":"k","jwt-private-key":"s",
            "nats":{"address":"nats://h:4222","username":"u","password":"p"},
            "fleet":{"config-dir":"cfg","stale-after":"1m30s","sweep-interval":"10s",
            "config-reload-interval":"5s","heartbeat-subject":"cc.fleet.event",
            "heartbeat-concurrency":4,"heartbeat-pending-messages":2048,
            "discovery-subject-prefix":"site.disc",
            "discovery-interval":"2m","discovery-debounce":"100ms"}}"#,
        )
        .unwrap();
        assert_eq!(c.addr, "127.0.0.1:0");
        assert_eq!(c.db.as_deref(), Some(std::path::Path::new("x.sqlite")));
        assert_eq!(c.api_allowed_ips, ["10.0.0.0/8"]);
        assert_eq!(c.jwt_private_key.as_deref(), Some("s"));
        assert_eq!(c.nats.unwrap().username, "u");
        assert_eq!(c.fleet.stale_after, Duration::from_secs(90));
        assert_eq!(c.fleet.heartbeat_concurrency, 4);
        assert_eq!(c.fleet.heartbeat_pending_messages, 2048);
        assert_eq!(c.fleet.discovery_debounce, Duration::from_millis(100));
        assert_eq!(c.fleet.heartbeat_subject.as_deref(), Some("cc.fleet.event"));
    }

    #[test]
    fn malformed_or_non_positive_durations_are_errors_naming_key_and_value() {
        for (fleet, key, value) in [
            (
                r#"{"stale-after":"90 seconds"}"#,
                "fleet.stale-after",
                "90 seconds",
            ),
            (r#"{"stale-after":"soon"}"#, "fleet.stale-after", "soon"),
            (r#"{"sweep-interval":"0s"}"#, "fleet.sweep-interval", "0s"),
            (
                r#"{"rollout-interval":"0s"}"#,
                "fleet.rollout-interval",
                "0s",
            ),
            (
                r#"{"discovery-debounce":"-1s"}"#,
                "fleet.discovery-debounce",
                "-1s",
            ),
        ] {
            let e = ServerConfig::from_json(&format!(r#"{{"fleet":{fleet}}}"#))
                .unwrap_err()
                .to_string();
            assert!(
                e.contains(key) && e.contains(&format!("\"{value}\"")),
                "{fleet}: {e}"
            );
        }
        assert!(ServerConfig::from_json(r#"{"bogus":1}"#).is_err());
        assert!(ServerConfig::from_json(r#"{"fleet":{"bogus":1}}"#).is_err());
        assert!(ServerConfig::from_json(r#"{"nats":{"address":""}}"#).is_err());
    }

    #[test]
    fn an_addr_without_host_or_port_is_refused() {
        for bad in [
            "localhost",
            "localhost:",
            ":8080",
            "127.0.0.1:99999",
            "::1:8080",
            "a b:1",
        ] {
            let e = ServerConfig::from_json(&format!(r#"{{"addr":"{bad}"}}"#))
                .unwrap_err()
                .to_string();
            assert!(e.contains("addr") && e.contains("host:port"), "{bad}: {e}");
        }
        for good in [
            "localhost:8080",
            "127.0.0.1:0",
            "[::1]:8080",
            "[::]:80",
            "fleet.example:443",
        ] {
            let c = ServerConfig::from_json(&format!(r#"{{"addr":"{good}"}}"#)).unwrap();
            assert_eq!(c.addr, good);
        }
    }

    #[test]
    fn a_value_of_the_wrong_type_names_its_key_and_form() {
        let e = ServerConfig::from_json("{\n  \"addr\": 18081\n}")
            .unwrap_err()
            .to_string();
        assert!(e.contains("addr: invalid type: integer `18081`"), "{e}");
        assert!(e.contains("line 2"), "{e}");
        assert!(e.contains("\"host:port\""), "{e}");
        let e = ServerConfig::from_json(r#"{"fleet": {"stale-after": 90}}"#)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("fleet.stale-after") && e.contains("Go duration"),
            "{e}"
        );
    }

    #[test]
    fn relative_paths_are_resolved_against_the_config_directory() {
        let mut c = ServerConfig::from_json(
            r#"{"db":"var/fleet.sqlite","fleet":{"config-dir":"/etc/cc/tree"}}"#,
        )
        .unwrap();
        c.resolve_paths(Path::new("/etc/ccfleet"));
        assert_eq!(
            c.db.as_deref(),
            Some(Path::new("/etc/ccfleet/var/fleet.sqlite"))
        );
        assert_eq!(
            c.fleet.config_dir.as_deref(),
            Some(Path::new("/etc/cc/tree"))
        );
    }

    #[test]
    fn a_config_dir_that_does_not_exist_is_warned_about() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("no-such-tree");
        let mut c = ServerConfig::from_json(r#"{"fleet":{"config-dir":"no-such-tree"}}"#).unwrap();
        c.resolve_paths(dir.path());
        let warnings = c.warnings();
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(
            warnings[0].contains(&missing.display().to_string()) && warnings[0].contains("204"),
            "{warnings:?}"
        );
        std::fs::create_dir(&missing).unwrap();
        assert!(c.warnings().is_empty());
    }

    #[test]
    fn a_heartbeat_subject_nats_would_refuse_is_refused() {
        for subject in [
            "cc..event",
            ".cc",
            "cc.",
            "c c.x",
            "cc\\n",
            "cc.>.x",
            "cc.ev*",
            "cc.>x",
            "cc.a>",
        ] {
            let text = format!(r#"{{"fleet":{{"heartbeat-subject":"{subject}"}}}}"#);
            let err = ServerConfig::from_json(&text).unwrap_err();
            assert!(
                err.to_string().contains("heartbeat-subject"),
                "{subject:?}: {err}"
            );
        }
        let long = format!(
            r#"{{"fleet":{{"heartbeat-subject":"{}"}}}}"#,
            "a".repeat(1025)
        );
        assert!(ServerConfig::from_json(&long).is_err());
        for subject in [
            "cc.fleet.event",
            "cc.*.event",
            "cc.fleet.>",
            ">",
            "site-1.hb_2",
        ] {
            let text = format!(r#"{{"fleet":{{"heartbeat-subject":"{subject}"}}}}"#);
            let c = ServerConfig::from_json(&text).unwrap();
            assert_eq!(c.fleet.heartbeat_subject.as_deref(), Some(subject));
        }
    }

    #[test]
    fn a_discovery_prefix_that_is_no_literal_subject_is_refused() {
        for prefix in ["cc.*", "cc.>", "cc..x", ".cc", "cc.", "c c", "cc\n"] {
            let text = format!(r#"{{"fleet":{{"discovery-subject-prefix":"{prefix}"}}}}"#);
            assert!(ServerConfig::from_json(&text).is_err(), "{prefix:?}");
        }
        let long = format!(
            r#"{{"fleet":{{"discovery-subject-prefix":"{}"}}}}"#,
            "a".repeat(1025)
        );
        assert!(ServerConfig::from_json(&long).is_err());
        let c =
            ServerConfig::from_json(r#"{"fleet":{"discovery-subject-prefix":"site-1.disc_2"}}"#)
                .unwrap();
        assert_eq!(c.fleet.discovery_subject_prefix, "site-1.disc_2");
    }

    #[test]
    fn a_heartbeat_pending_limit_out_of_range_is_refused_by_name() {
        assert_eq!(
            ServerConfig::from_json("{}")
                .unwrap()
                .fleet
                .heartbeat_pending_messages,
            DEFAULT_HEARTBEAT_PENDING_MESSAGES
        );
        for bad in ["0", "-1", "4097"] {
            let e = ServerConfig::from_json(&format!(
                r#"{{"fleet":{{"heartbeat-pending-messages":{bad}}}}}"#
            ))
            .unwrap_err();
            assert!(
                e.to_string().contains("fleet.heartbeat-pending-messages"),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn the_heartbeat_stream_section_is_parsed_and_bad_values_are_refused_by_name() {
        let base = r#""nats": {"address": "nats://127.0.0.1:4222"}"#;
        let c = ServerConfig::from_json(&format!(
            r#"{{{base}, "fleet": {{"heartbeat-subject": "hb", "heartbeat-stream": {{}}}}}}"#
        ))
        .unwrap();
        assert_eq!(
            c.fleet.heartbeat_stream,
            Some(HeartbeatStreamConfig {
                name: DEFAULT_HEARTBEAT_STREAM.to_owned(),
                consumer: DEFAULT_HEARTBEAT_CONSUMER.to_owned(),
                replicas: 1,
                max_age: DEFAULT_HEARTBEAT_STREAM_MAX_AGE,
                max_bytes: DEFAULT_HEARTBEAT_STREAM_MAX_BYTES,
                ack_wait: DEFAULT_HEARTBEAT_ACK_WAIT,
            })
        );
        let c = ServerConfig::from_json(&format!(
            r#"{{{base}, "fleet": {{"heartbeat-subject": "hb", "heartbeat-stream": {{"name": "hb_1",
            "consumer": "site-a", "replicas": 3, "max-age": "10m", "max-bytes": 2097152, "ack-wait": "1m"}}}}}}"#
        ))
        .unwrap();
        let s = c.fleet.heartbeat_stream.unwrap();
        assert_eq!(
            (s.name.as_str(), s.consumer.as_str(), s.replicas),
            ("hb_1", "site-a", 3)
        );
        assert_eq!(
            (s.max_age, s.max_bytes, s.ack_wait),
            (Duration::from_secs(600), 2_097_152, Duration::from_secs(60))
        );
        assert!(
            ServerConfig::from_json("{}")
                .unwrap()
                .fleet
                .heartbeat_stream
                .is_none()
        );
        let refused = [
            (
                r#""heartbeat-subject": "hb", "heartbeat-stream": {"name": "a.b"}"#,
                "heartbeat-stream.name",
            ),
            (
                r#""heartbeat-subject": "hb", "heartbeat-stream": {"consumer": ""}"#,
                "heartbeat-stream.consumer",
            ),
            (
                r#""heartbeat-subject": "hb", "heartbeat-stream": {"replicas": 0}"#,
                "heartbeat-stream.replicas",
            ),
            (
                r#""heartbeat-subject": "hb", "heartbeat-stream": {"max-age": "soon"}"#,
                "heartbeat-stream.max-age",
            ),
            (
                r#""heartbeat-subject": "hb", "heartbeat-stream": {"max-bytes": 1000}"#,
                "heartbeat-stream.max-bytes",
            ),
            (
                r#""heartbeat-subject": "hb", "heartbeat-stream": {"ack-wait": "1s"}"#,
                "heartbeat-stream.ack-wait",
            ),
            (
                r#""heartbeat-subject": "hb", "heartbeat-stream": {"bogus": 1}"#,
                "bogus",
            ),
            (r#""heartbeat-stream": {}"#, "needs fleet.heartbeat-subject"),
        ];
        for (fleet, needle) in refused {
            let e = ServerConfig::from_json(&format!(r#"{{{base}, "fleet": {{{fleet}}}}}"#))
                .unwrap_err()
                .to_string();
            assert!(e.contains(needle), "{fleet}: {e}");
        }
        let e = ServerConfig::from_json(
            r#"{"fleet": {"heartbeat-subject": "hb", "heartbeat-stream": {}}}"#,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("needs a nats connection"), "{e}");
    }

    #[test]
    fn the_registry_section_selects_sqlite_or_a_jetstream_bucket() {
        let nats = r#""nats": {"address": "nats://127.0.0.1:4222"}"#;
        assert_eq!(
            ServerConfig::from_json(r#"{"db": "fleet.sqlite"}"#)
                .unwrap()
                .registry,
            RegistryConfig::Sqlite
        );
        let c = ServerConfig::from_json(&format!(
            r#"{{{nats}, "registry": {{"type": "jetstream-kv", "bucket": "fleet-a", "replicas": 3, "lease-ttl": "2s"}}}}"#
        ))
        .unwrap();
        let RegistryConfig::JetStreamKv(settings) = c.registry else {
            panic!("not jetstream");
        };
        assert_eq!(
            (
                settings.bucket.as_str(),
                settings.replicas,
                settings.lease_ttl
            ),
            ("fleet-a", 3, Duration::from_secs(2))
        );
        let refused = [
            (r#"{"registry": {"type": "jetstream-kv"}}"#, "needs a nats"),
            (
                &format!(r#"{{{nats}, "db": "x.sqlite", "registry": {{"type": "jetstream-kv"}}}}"#),
                "migrate",
            ),
            (
                &format!(r#"{{{nats}, "registry": {{"type": "jetstream-kv", "bucket": "a.b"}}}}"#),
                "registry.bucket",
            ),
            (
                &format!(r#"{{{nats}, "registry": {{"type": "jetstream-kv", "replicas": 7}}}}"#),
                "registry.replicas",
            ),
            (
                &format!(
                    r#"{{{nats}, "registry": {{"type": "jetstream-kv", "lease-ttl": "1ms"}}}}"#
                ),
                "lease-ttl",
            ),
            (
                r#"{"registry": {"type": "sqlite", "bucket": "x"}}"#,
                "jetstream-kv",
            ),
            (r#"{"registry": {"type": "etcd"}}"#, "registry.type"),
        ];
        for (json, needle) in refused {
            let e = ServerConfig::from_json(json).unwrap_err().to_string();
            assert!(e.contains(needle), "{json}: {e}");
        }
    }
}
