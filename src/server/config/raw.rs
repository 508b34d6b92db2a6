//! The raw form serde reads from the server's configuration file, and its checks and
//! conversion into the documented settings ([`ServerConfig::from_json`]).

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::check::{check_addr, is_subject_prefix, is_subscription_subject};
use super::{
    DEFAULT_ADDR, DEFAULT_CONFIG_RELOAD_INTERVAL, DEFAULT_DISCOVERY_DEBOUNCE,
    DEFAULT_DISCOVERY_INTERVAL, DEFAULT_HEARTBEAT_ACK_WAIT, DEFAULT_HEARTBEAT_CONCURRENCY,
    DEFAULT_HEARTBEAT_CONSUMER, DEFAULT_HEARTBEAT_PENDING_MESSAGES, DEFAULT_HEARTBEAT_STREAM,
    DEFAULT_HEARTBEAT_STREAM_MAX_AGE, DEFAULT_HEARTBEAT_STREAM_MAX_BYTES,
    DEFAULT_HTTP_BODY_TIMEOUT, DEFAULT_HTTP_HEADER_TIMEOUT, DEFAULT_HTTP_MAX_CONNECTIONS,
    DEFAULT_LEASE_TTL, DEFAULT_ROLLOUT_INTERVAL, DEFAULT_STALE_AFTER, DEFAULT_SWEEP_INTERVAL,
    FleetConfig, HeartbeatStreamConfig, HttpLimits, MAX_HEARTBEAT_PENDING_MESSAGES,
    MIN_HEARTBEAT_ACK_WAIT, NatsConfig, RegistryConfig, ServerConfig,
};
use crate::server::error::ServerError;
use crate::untrusted::Untrusted;

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct RawRegistry {
    #[serde(rename = "type")]
    kind: String,
    bucket: Option<String>,
    replicas: Option<i64>,
    lease_ttl: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct RawHeartbeatStream {
    name: Option<String>,
    consumer: Option<String>,
    replicas: Option<i64>,
    max_age: Option<String>,
    max_bytes: Option<i64>,
    ack_wait: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct RawConfig {
    addr: Option<String>,
    db: Option<PathBuf>,
    #[serde(default)]
    api_allowed_ips: Vec<String>,
    #[serde(default)]
    trusted_proxies: Vec<String>,
    http_header_timeout: Option<String>,
    http_body_timeout: Option<String>,
    http_max_connections: Option<i64>,
    #[serde(default)]
    disable_authentication: bool,
    jwt_public_key: Option<String>,
    jwt_private_key: Option<String>,
    nats: Option<NatsConfig>,
    #[serde(default)]
    fleet: RawFleet,
    registry: Option<RawRegistry>,
}

// Durations stay strings here, parsed with Go's syntax below. cc-backend logs a malformed
// one and falls back to the default; this server refuses it instead (at start-up and in
// `--check-config` alike): a typo such as "90 seconds" would otherwise run the fleet with a
// value nobody chose, and the warning scrolls by unread.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct RawFleet {
    config_dir: Option<PathBuf>,
    plugin_dir: Option<PathBuf>,
    stale_after: Option<String>,
    sweep_interval: Option<String>,
    rollout_interval: Option<String>,
    config_reload_interval: Option<String>,
    heartbeat_subject: Option<String>,
    heartbeat_concurrency: Option<i64>,
    heartbeat_pending_messages: Option<i64>,
    discovery_subject_prefix: Option<String>,
    discovery_interval: Option<String>,
    discovery_debounce: Option<String>,
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

impl ServerConfig {
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
    let is_name = crate::server::registry::jetstream::is_bucket_name;
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
            if !crate::server::registry::jetstream::is_bucket_name(&bucket) {
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
                crate::server::registry::jetstream::JetStreamSettings {
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
