//! The local `fleet` configuration section: how to reach cc-backend.
//!
//! The section always stays local; it never comes from the fleet service itself. Keys are
//! kebab-case as ClusterCockpit writes them, unknown keys are rejected, and durations use Go's
//! syntax (`30s`, `1m30s`, `1.5h`) and must be positive.

use std::ffi::OsString;
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use crate::duration::{self, DurationError};
use crate::secret::SecretError;
use crate::wire::DEFAULT_DISCOVERY_PREFIX;

/// Environment variable whose non-empty value overrides the configured token.
pub const ENV_TOKEN: &str = "CC_FLEET_TOKEN";
/// Environment variable naming a file that holds the token (used when [`ENV_TOKEN`] is unset).
pub const ENV_TOKEN_FILE: &str = "CC_FLEET_TOKEN_FILE";

/// Default interval between heartbeats.
pub const DEFAULT_HEARTBEAT_INTERVAL: Duration = Duration::from_secs(30);
/// Default interval between configuration polls.
pub const DEFAULT_CONFIG_POLL_INTERVAL: Duration = Duration::from_secs(60);
/// Default timeout of one HTTP request to cc-backend.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
/// Default largest roster message accepted: NATS's own default `max_payload`, and thousands
/// of providers.
pub const DEFAULT_ROSTER_MAX_BYTES: usize = 1 << 20;
/// Default largest number of providers in one accepted roster.
pub const DEFAULT_ROSTER_MAX_PROVIDERS: usize = 10_000;
/// Default largest age (and clock lead) of a signed roster when a roster key is configured.
pub const DEFAULT_ROSTER_MAX_AGE: Duration = Duration::from_secs(5 * 60);

/// JSON schema of the `fleet` section, for applications that validate their whole config file.
pub const CONFIG_SCHEMA: &str = r#"{
  "$schema": "https://json-schema.org/draft/2020-12/schema",
  "title": "fleet",
  "description": "How to reach the cc-backend fleet service. This section always stays local.",
  "type": "object",
  "properties": {
    "url": {
      "description": "Base URL of cc-backend, e.g. https://cc.example.org, or an array of fleet server URLs in order of preference (the client fails over between them).",
      "type": ["string", "array"],
      "items": {"type": "string"},
      "minItems": 1
    },
    "token": {
      "description": "JWT with the api role. CC_FLEET_TOKEN, or the file named by CC_FLEET_TOKEN_FILE, overrides it.",
      "type": "string"
    },
    "cluster": {
      "description": "Cluster this service belongs to; empty registers in the infra scope.",
      "type": "string"
    },
    "hostname": {
      "description": "Hostname to register under; defaults to the system hostname.",
      "type": "string"
    },
    "heartbeat-interval": {
      "description": "Interval between heartbeats as a Go duration; default 30s.",
      "type": "string"
    },
    "config-poll-interval": {
      "description": "Interval between configuration polls as a Go duration; default 60s.",
      "type": "string"
    },
    "heartbeat-subject": {
      "description": "NATS subject for heartbeats; empty sends heartbeats over REST only.",
      "type": "string"
    },
    "discovery-subject-prefix": {
      "description": "Prefix of the NATS discovery subjects; default cc.fleet.discovery.",
      "type": "string"
    },
    "cache-path": {
      "description": "File caching the last received configuration; empty disables the cache.",
      "type": "string"
    },
    "timeout": {
      "description": "Timeout of one HTTP request to cc-backend as a Go duration; default 10s.",
      "type": "string"
    },
    "roster-max-bytes": {
      "description": "Largest discovery roster message accepted, in bytes; default 1048576. Larger rosters are rejected and counted.",
      "type": "integer",
      "minimum": 1
    },
    "roster-max-providers": {
      "description": "Largest number of providers in an accepted discovery roster; default 10000.",
      "type": "integer",
      "minimum": 1
    },
    "roster-public-key": {
      "description": "The fleet server's Ed25519 public key (JWT_PUBLIC_KEY format, standard base64). When set, only rosters signed with its private key are accepted.",
      "type": "string"
    },
    "roster-max-age": {
      "description": "With roster-public-key: how far a signed roster's timestamp may lie from the local clock, as a Go duration; default 5m.",
      "type": "string"
    }
  },
  "required": ["url"],
  "additionalProperties": false
}"#;

/// Why a `fleet` section (or the token it points to) is unusable.
///
/// Messages name the offending key and value, but never the token.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The section is empty.
    #[error("fleet: empty configuration")]
    Empty,
    /// The section is not a JSON object of the known keys (unknown key, wrong type, bad JSON);
    /// the message names the key (`fleet.heartbeat-interval: ...`) and the form it takes.
    #[error("{0}")]
    Decode(#[source] crate::json_config::KeyError),
    /// `url` is missing or empty.
    #[error("fleet: configuration is missing 'url'")]
    MissingUrl,
    /// `url` (or one entry of a `url` list) is not an absolute http(s) URL with a host.
    #[error("fleet: invalid url{}: {reason}", entry_suffix(*entry))]
    InvalidUrl {
        /// What is wrong with it (the URL itself is left out: it may carry credentials).
        reason: &'static str,
        /// Which entry of a `url` list, counted from 1; `None` for a single URL.
        entry: Option<usize>,
    },
    /// `url` is an empty list.
    #[error("fleet: 'url' is an empty list; give at least one server URL")]
    EmptyUrlList,
    /// `url` lists one server twice (compared after dropping trailing slashes).
    #[error("fleet: 'url' lists the same server twice (entries {first} and {second})")]
    DuplicateUrl {
        /// The first entry, counted from 1.
        first: usize,
        /// The repeating entry, counted from 1.
        second: usize,
    },
    /// A duration key does not hold a Go duration.
    #[error("fleet: invalid {key} {value:?}: {source}")]
    InvalidDuration {
        /// The config key.
        key: &'static str,
        /// The rejected value.
        value: String,
        /// What the duration parser found.
        #[source]
        source: DurationError,
    },
    /// A duration key holds zero or a negative duration.
    #[error("fleet: {key} must be positive, got {value:?}")]
    NotPositive {
        /// The config key.
        key: &'static str,
        /// The rejected value.
        value: String,
    },
    /// `hostname` or `cluster` could escape the server's configuration tree.
    #[error("fleet: {key} {value:?} is not a safe path component")]
    UnsafeName {
        /// The config key.
        key: &'static str,
        /// The rejected value.
        value: String,
    },
    /// No `hostname` is configured and the system hostname cannot be read.
    #[error("fleet: cannot determine the hostname: {0}")]
    Hostname(#[source] std::io::Error),
    /// The file named by `CC_FLEET_TOKEN_FILE` cannot be read.
    #[error("fleet: reading the token file {path:?} named by CC_FLEET_TOKEN_FILE: {source}")]
    TokenFile {
        /// The file.
        path: PathBuf,
        /// The read error.
        #[source]
        source: std::io::Error,
    },
    /// The file named by `CC_FLEET_TOKEN_FILE` holds only whitespace.
    #[error("fleet: the token file {path:?} named by CC_FLEET_TOKEN_FILE is empty")]
    EmptyTokenFile {
        /// The file.
        path: PathBuf,
    },
    /// The token cannot be sent in an HTTP header (control characters or non-ASCII bytes).
    #[error("fleet: the token contains characters not allowed in an HTTP header")]
    InvalidToken,
    /// `roster-public-key` is not the standard base64 of a 32-byte Ed25519 public key.
    #[error("fleet: roster-public-key is not a base64 Ed25519 public key (JWT_PUBLIC_KEY format)")]
    InvalidRosterKey,
    /// A size limit is zero.
    #[error("fleet: {key} must be at least 1")]
    ZeroLimit {
        /// The config key.
        key: &'static str,
    },
}

fn entry_suffix(entry: Option<usize>) -> String {
    entry.map_or_else(String::new, |n| format!(" (entry {n} of the list)"))
}

/// The parsed `fleet` section.
///
/// Build it with [`Config::from_json`] / [`Config::from_value`], or with [`Config::new`] and
/// field updates. The token held here is the configured one; [`Config::resolve_token`] applies
/// the environment overrides, which the client does when it is created.
#[derive(Clone, PartialEq, Eq)]
pub struct Config {
    /// Base URL of cc-backend (`https://cc.example.org`); a trailing `/` is ignored. With
    /// several fleet servers, the preferred one (the first entry of a `url` list).
    pub url: String,
    /// Further fleet servers, in order of preference after [`Config::url`] (the rest of a
    /// `url` list). The client fails over to them; empty for a single server.
    pub failover_urls: Vec<String>,
    /// JWT with the `api` role, sent as `X-Auth-Token`.
    pub token: String,
    /// Cluster of this service; empty registers in the infra scope.
    pub cluster: String,
    /// Hostname to register under; empty means the system hostname.
    pub hostname: String,
    /// Interval between heartbeats.
    pub heartbeat_interval: Duration,
    /// Interval between configuration polls.
    pub config_poll_interval: Duration,
    /// NATS subject for heartbeats; empty sends heartbeats over REST only.
    pub heartbeat_subject: String,
    /// Prefix of the discovery subjects.
    pub discovery_subject_prefix: String,
    /// File caching the last received configuration; `None` disables the cache.
    pub cache_path: Option<PathBuf>,
    /// Timeout of one HTTP request.
    pub timeout: Duration,
    /// Largest roster message accepted, in bytes.
    pub roster_max_bytes: usize,
    /// Largest number of providers in an accepted roster.
    pub roster_max_providers: usize,
    /// The fleet server's Ed25519 public key (standard base64); when not empty, only rosters
    /// signed with its private key are accepted.
    pub roster_public_key: String,
    /// With a roster key: how far a roster's timestamp may lie from the local clock.
    pub roster_max_age: Duration,
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The token is a credential; only say whether one is configured.
        f.debug_struct("Config")
            // URLs may carry user information (`user:password@`): shown without it.
            .field("url", &debug_url(&self.url))
            .field(
                "failover_urls",
                &self
                    .failover_urls
                    .iter()
                    .map(|u| debug_url(u))
                    .collect::<Vec<_>>(),
            )
            .field(
                "token",
                &if self.token.is_empty() {
                    ""
                } else {
                    "<redacted>"
                },
            )
            .field("cluster", &self.cluster)
            .field("hostname", &self.hostname)
            .field(
                "heartbeat_interval",
                &duration::GoDuration(self.heartbeat_interval),
            )
            .field(
                "config_poll_interval",
                &duration::GoDuration(self.config_poll_interval),
            )
            .field("heartbeat_subject", &self.heartbeat_subject)
            .field("discovery_subject_prefix", &self.discovery_subject_prefix)
            .field("cache_path", &self.cache_path)
            .field("timeout", &duration::GoDuration(self.timeout))
            .field("roster_max_bytes", &self.roster_max_bytes)
            .field("roster_max_providers", &self.roster_max_providers)
            .field("roster_public_key", &self.roster_public_key)
            .field("roster_max_age", &duration::GoDuration(self.roster_max_age))
            .finish()
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct RawConfig {
    #[serde(default, deserialize_with = "url_list")]
    url: Option<Vec<String>>,
    token: Option<String>,
    cluster: Option<String>,
    hostname: Option<String>,
    heartbeat_interval: Option<String>,
    config_poll_interval: Option<String>,
    heartbeat_subject: Option<String>,
    discovery_subject_prefix: Option<String>,
    cache_path: Option<String>,
    timeout: Option<String>,
    roster_max_bytes: Option<usize>,
    roster_max_providers: Option<usize>,
    roster_public_key: Option<String>,
    roster_max_age: Option<String>,
}

impl Config {
    /// A configuration for `url` with every other key at its default.
    pub fn new(url: impl Into<String>) -> Config {
        Config {
            url: url.into(),
            failover_urls: Vec::new(),
            token: String::new(),
            cluster: String::new(),
            hostname: String::new(),
            heartbeat_interval: DEFAULT_HEARTBEAT_INTERVAL,
            config_poll_interval: DEFAULT_CONFIG_POLL_INTERVAL,
            heartbeat_subject: String::new(),
            discovery_subject_prefix: DEFAULT_DISCOVERY_PREFIX.to_owned(),
            cache_path: None,
            timeout: DEFAULT_TIMEOUT,
            roster_max_bytes: DEFAULT_ROSTER_MAX_BYTES,
            roster_max_providers: DEFAULT_ROSTER_MAX_PROVIDERS,
            roster_public_key: String::new(),
            roster_max_age: DEFAULT_ROSTER_MAX_AGE,
        }
    }

    /// Parses the section from its JSON text.
    pub fn from_json(raw: &str) -> Result<Config, ConfigError> {
        if raw.trim().is_empty() {
            return Err(ConfigError::Empty);
        }
        let raw: RawConfig = crate::json_config::from_str(raw).map_err(|e| {
            // The text is the section alone: its keys are shown as the section's own.
            ConfigError::Decode(e.within("fleet"))
        })?;
        Config::from_raw(raw)
    }

    /// Parses the section from an already decoded JSON value.
    pub fn from_value(value: serde_json::Value) -> Result<Config, ConfigError> {
        if value.is_null() {
            return Err(ConfigError::Empty);
        }
        let raw: RawConfig =
            crate::json_config::from_value(value, "fleet").map_err(ConfigError::Decode)?;
        Config::from_raw(raw)
    }

    fn from_raw(raw: RawConfig) -> Result<Config, ConfigError> {
        let mut urls = raw.url.ok_or(ConfigError::MissingUrl)?.into_iter();
        let url = urls.next().ok_or(ConfigError::EmptyUrlList)?;
        let failover_urls: Vec<String> = urls.collect();
        // Go treats an empty string like an absent key; an empty entry of a list is an error
        // of that entry (reported by `validate`).
        if url.is_empty() && failover_urls.is_empty() {
            return Err(ConfigError::MissingUrl);
        }
        let mut config = Config::new(url);
        config.failover_urls = failover_urls;
        config.token = raw.token.unwrap_or_default();
        config.cluster = raw.cluster.unwrap_or_default();
        config.hostname = raw.hostname.unwrap_or_default();
        config.heartbeat_subject = raw.heartbeat_subject.unwrap_or_default();
        if let Some(prefix) = raw.discovery_subject_prefix.filter(|p| !p.is_empty()) {
            config.discovery_subject_prefix = prefix;
        }
        config.cache_path = raw.cache_path.filter(|p| !p.is_empty()).map(PathBuf::from);
        if let Some(n) = raw.roster_max_bytes {
            config.roster_max_bytes = n;
        }
        if let Some(n) = raw.roster_max_providers {
            config.roster_max_providers = n;
        }
        config.roster_public_key = raw.roster_public_key.unwrap_or_default().trim().to_owned();
        let durations = [
            (
                "heartbeat-interval",
                raw.heartbeat_interval,
                &mut config.heartbeat_interval,
            ),
            (
                "config-poll-interval",
                raw.config_poll_interval,
                &mut config.config_poll_interval,
            ),
            ("timeout", raw.timeout, &mut config.timeout),
            (
                "roster-max-age",
                raw.roster_max_age,
                &mut config.roster_max_age,
            ),
        ];
        for (key, value, slot) in durations {
            // Go treats an empty string like an absent key.
            if let Some(value) = value.filter(|v| !v.is_empty()) {
                *slot = positive_duration(key, &value)?;
            }
        }
        Ok(config)
    }

    /// Checks what the typed fields cannot express: a usable URL, positive durations and
    /// names that are safe path components on the server.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.base_urls()?;
        for (key, value) in [
            ("heartbeat-interval", self.heartbeat_interval),
            ("config-poll-interval", self.config_poll_interval),
            ("timeout", self.timeout),
            ("roster-max-age", self.roster_max_age),
        ] {
            if value.is_zero() {
                return Err(ConfigError::NotPositive {
                    key,
                    value: duration::format(value),
                });
            }
        }
        for (key, value) in [
            ("roster-max-bytes", self.roster_max_bytes),
            ("roster-max-providers", self.roster_max_providers),
        ] {
            if value == 0 {
                return Err(ConfigError::ZeroLimit { key });
            }
        }
        self.roster_key()?;
        if !self.cluster.is_empty() && !crate::wire::safe_path_component(&self.cluster) {
            return Err(ConfigError::UnsafeName {
                key: "cluster",
                value: self.cluster.clone(),
            });
        }
        if !self.hostname.is_empty() && !crate::wire::safe_path_component(&self.hostname) {
            return Err(ConfigError::UnsafeName {
                key: "hostname",
                value: self.hostname.clone(),
            });
        }
        Ok(())
    }

    /// Every configured server URL in order of preference: [`Config::url`], then
    /// [`Config::failover_urls`].
    pub fn urls(&self) -> impl Iterator<Item = &str> {
        std::iter::once(self.url.as_str()).chain(self.failover_urls.iter().map(String::as_str))
    }

    /// The base URL of every server (checked, without trailing slashes), in order of
    /// preference. A list must not name one server twice.
    pub(crate) fn base_urls(&self) -> Result<Vec<String>, ConfigError> {
        let several = !self.failover_urls.is_empty();
        let mut bases: Vec<String> = Vec::new();
        let mut seen: Vec<String> = Vec::new();
        for (i, url) in self.urls().enumerate() {
            let entry = several.then_some(i + 1);
            if url.is_empty() && !several {
                return Err(ConfigError::MissingUrl);
            }
            let base = base_url(url).map_err(|e| match e {
                ConfigError::InvalidUrl { reason, .. } => ConfigError::InvalidUrl { reason, entry },
                ConfigError::MissingUrl => ConfigError::InvalidUrl {
                    reason: "the entry is empty",
                    entry,
                },
                other => other,
            })?;
            // Compared parsed, so `HTTP://H:80/` and `http://h` are one server.
            let key = reqwest::Url::parse(&base)
                .map(|u| u.as_str().trim_end_matches('/').to_owned())
                .unwrap_or_else(|_| base.clone());
            if let Some(first) = seen.iter().position(|k| *k == key) {
                return Err(ConfigError::DuplicateUrl {
                    first: first + 1,
                    second: i + 1,
                });
            }
            seen.push(key);
            bases.push(base);
        }
        Ok(bases)
    }

    /// The roster verification key, if one is configured.
    pub fn roster_key(&self) -> Result<Option<ed25519_dalek::VerifyingKey>, ConfigError> {
        use base64::Engine;
        if self.roster_public_key.is_empty() {
            return Ok(None);
        }
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(&self.roster_public_key)
            .map_err(|_| ConfigError::InvalidRosterKey)?;
        let raw: [u8; 32] = bytes
            .as_slice()
            .try_into()
            .map_err(|_| ConfigError::InvalidRosterKey)?;
        ed25519_dalek::VerifyingKey::from_bytes(&raw)
            .map(Some)
            .map_err(|_| ConfigError::InvalidRosterKey)
    }

    /// The token to send: `CC_FLEET_TOKEN` if set and non-empty, else the trimmed content of
    /// the file named by `CC_FLEET_TOKEN_FILE` (unreadable or empty is an error, with no
    /// fallback), else the configured `token`.
    ///
    /// No token at all is allowed (cc-backend may run without authentication) but logged
    /// as a warning: otherwise only the server's 401 would tell.
    pub fn resolve_token(&self) -> Result<String, ConfigError> {
        let token = self.resolve_token_with(|name| std::env::var_os(name))?;
        if token.is_empty() {
            tracing::warn!(
                "fleet: no token (set CC_FLEET_TOKEN, CC_FLEET_TOKEN_FILE or fleet.token): cc-backend answers 401 unless its authentication is disabled"
            );
        }
        Ok(token)
    }

    /// [`Config::resolve_token`] with an injected environment, so tests need not mutate the
    /// process environment.
    pub(crate) fn resolve_token_with(
        &self,
        env: impl Fn(&str) -> Option<OsString>,
    ) -> Result<String, ConfigError> {
        crate::secret::from_env_with(ENV_TOKEN, &self.token, env).map_err(|e| match e {
            SecretError::Unreadable { path, source, .. } => ConfigError::TokenFile { path, source },
            SecretError::Empty { path, .. } => ConfigError::EmptyTokenFile { path },
        })
    }

    /// The hostname to register under: the configured one, else the system hostname.
    pub fn effective_hostname(&self) -> Result<String, ConfigError> {
        if !self.hostname.is_empty() {
            return Ok(self.hostname.clone());
        }
        let name = system_hostname().map_err(ConfigError::Hostname)?;
        if !crate::wire::safe_path_component(&name) {
            return Err(ConfigError::UnsafeName {
                key: "hostname",
                value: name,
            });
        }
        Ok(name)
    }
}

fn positive_duration(key: &'static str, value: &str) -> Result<Duration, ConfigError> {
    let nanos = duration::parse_nanos(value).map_err(|source| ConfigError::InvalidDuration {
        key,
        value: value.to_owned(),
        source,
    })?;
    match u64::try_from(nanos) {
        Ok(n) if n > 0 => Ok(Duration::from_nanos(n)),
        _ => Err(ConfigError::NotPositive {
            key,
            value: value.to_owned(),
        }),
    }
}

/// A URL for `Debug` output: without user information; a text that does not parse is shown
/// only when it holds no `@`.
fn debug_url(url: &str) -> String {
    if reqwest::Url::parse(url).is_ok() || url.contains('@') {
        super::servers::shown_url(url)
    } else {
        url.to_owned()
    }
}

/// Reads `url` as one URL string (the Go form) or an array of URL strings.
fn url_list<'de, D>(deserializer: D) -> Result<Option<Vec<String>>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    struct UrlList;

    impl<'de> serde::de::Visitor<'de> for UrlList {
        type Value = Option<Vec<String>>;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("`url` as a URL string or an array of URL strings")
        }

        fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Self::Value, E> {
            Ok(Some(vec![v.to_owned()]))
        }

        fn visit_unit<E: serde::de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }

        fn visit_seq<A: serde::de::SeqAccess<'de>>(
            self,
            mut seq: A,
        ) -> Result<Self::Value, A::Error> {
            let mut urls = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(16));
            while let Some(UrlEntry(url)) = seq.next_element()? {
                urls.push(url);
            }
            Ok(Some(urls))
        }
    }

    /// One entry of a `url` list; its own type so a wrong one is reported with the key.
    struct UrlEntry(String);

    impl<'de> Deserialize<'de> for UrlEntry {
        fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<UrlEntry, D::Error> {
            struct Entry;
            impl serde::de::Visitor<'_> for Entry {
                type Value = UrlEntry;

                fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                    f.write_str("a URL string as each entry of the `url` array")
                }

                fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<UrlEntry, E> {
                    Ok(UrlEntry(v.to_owned()))
                }
            }
            d.deserialize_str(Entry)
        }
    }

    deserializer.deserialize_any(UrlList)
}

/// The base URL without trailing slashes, after checking it is absolute http(s) with a host.
pub(crate) fn base_url(url: &str) -> Result<String, ConfigError> {
    if url.is_empty() {
        return Err(ConfigError::MissingUrl);
    }
    // Go's client would take "http://a,http://b" for one (broken) URL; say what to do instead.
    if url.split(',').skip(1).any(|rest| {
        rest.trim_start().starts_with("http://") || rest.trim_start().starts_with("https://")
    }) {
        return Err(ConfigError::InvalidUrl {
            reason: "several URLs in one string; list the servers as a JSON array instead",
            entry: None,
        });
    }
    let parsed = reqwest::Url::parse(url).map_err(|_| ConfigError::InvalidUrl {
        reason: "not an absolute URL",
        entry: None,
    })?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(ConfigError::InvalidUrl {
            reason: "the scheme must be http or https",
            entry: None,
        });
    }
    if parsed.host_str().is_none_or(str::is_empty) {
        return Err(ConfigError::InvalidUrl {
            reason: "the host is missing",
            entry: None,
        });
    }
    if parsed.query().is_some() || parsed.fragment().is_some() {
        return Err(ConfigError::InvalidUrl {
            reason: "a query or fragment is not allowed",
            entry: None,
        });
    }
    Ok(url.trim_end_matches('/').to_owned())
}

fn system_hostname() -> std::io::Result<String> {
    // The kernel's view first; /etc/hostname covers systems without procfs.
    let mut last_err = None;
    for file in ["/proc/sys/kernel/hostname", "/etc/hostname"] {
        match std::fs::read_to_string(file) {
            Ok(name) if !name.trim().is_empty() => return Ok(name.trim().to_owned()),
            Ok(_) => {}
            Err(e) => last_err = Some(e),
        }
    }
    Err(last_err.unwrap_or_else(|| std::io::Error::other("the system hostname is empty")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<OsString> {
        let map: HashMap<String, OsString> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), OsString::from(v)))
            .collect();
        move |name| map.get(name).cloned()
    }

    #[test]
    fn minimal_section_gets_defaults() {
        let c = Config::from_json(r#"{"url":"https://cc.example.org"}"#).unwrap();
        assert_eq!(c, Config::new("https://cc.example.org"));
        assert_eq!(c.heartbeat_interval, Duration::from_secs(30));
        assert_eq!(c.config_poll_interval, Duration::from_secs(60));
        assert_eq!(c.timeout, Duration::from_secs(10));
        assert_eq!(c.discovery_subject_prefix, "cc.fleet.discovery");
        assert!(c.cache_path.is_none());
        c.validate().unwrap();
    }

    #[test]
    fn full_section_from_the_readme() {
        let c = Config::from_json(
            r#"{
              "url": "https://cc.example.org",
              "token": "jwt",
              "cluster": "fritz",
              "hostname": "f0101",
              "heartbeat-interval": "1m30s",
              "config-poll-interval": "1.5h",
              "heartbeat-subject": "cc.fleet.event",
              "discovery-subject-prefix": "site.disc",
              "cache-path": "/var/lib/cc-metric-collector/fleet-config.json",
              "timeout": "500ms"
            }"#,
        )
        .unwrap();
        assert_eq!(c.token, "jwt");
        assert_eq!(c.cluster, "fritz");
        assert_eq!(c.hostname, "f0101");
        assert_eq!(c.heartbeat_interval, Duration::from_secs(90));
        assert_eq!(c.config_poll_interval, Duration::from_secs(5400));
        assert_eq!(c.heartbeat_subject, "cc.fleet.event");
        assert_eq!(c.discovery_subject_prefix, "site.disc");
        assert_eq!(
            c.cache_path.as_deref(),
            Some(std::path::Path::new(
                "/var/lib/cc-metric-collector/fleet-config.json"
            ))
        );
        assert_eq!(c.timeout, Duration::from_millis(500));
        c.validate().unwrap();
    }

    #[test]
    fn from_value_matches_from_json() {
        let v = serde_json::json!({"url": "http://h:8080/", "cluster": "alex"});
        let a = Config::from_value(v.clone()).unwrap();
        let b = Config::from_json(&v.to_string()).unwrap();
        assert_eq!(a, b);
        assert!(matches!(
            Config::from_value(serde_json::Value::Null),
            Err(ConfigError::Empty)
        ));
    }

    #[test]
    fn rejects_bad_sections() {
        assert!(matches!(Config::from_json(""), Err(ConfigError::Empty)));
        assert!(matches!(Config::from_json("  \n"), Err(ConfigError::Empty)));
        assert!(matches!(
            Config::from_json("{}"),
            Err(ConfigError::MissingUrl)
        ));
        assert!(matches!(
            Config::from_json(r#"{"url":""}"#),
            Err(ConfigError::MissingUrl)
        ));
        let err = Config::from_json(r#"{"url":"https://x","bogus":1}"#).unwrap_err();
        assert!(matches!(err, ConfigError::Decode(_)));
        assert!(err.to_string().contains("bogus"), "{err}");
        assert!(matches!(
            Config::from_json(r#"{"url":"https://x","heartbeat-interval":"often"}"#),
            Err(ConfigError::InvalidDuration {
                key: "heartbeat-interval",
                ..
            })
        ));
        let err = Config::from_json(r#"{"url":"https://x","timeout":"-1s"}"#).unwrap_err();
        assert!(matches!(
            err,
            ConfigError::NotPositive { key: "timeout", .. }
        ));
        assert_eq!(
            err.to_string(),
            r#"fleet: timeout must be positive, got "-1s""#
        );
        assert!(matches!(
            Config::from_json(r#"{"url":"https://x","config-poll-interval":"0s"}"#),
            Err(ConfigError::NotPositive { .. })
        ));
        assert!(matches!(
            Config::from_json(r#"{"url":5}"#),
            Err(ConfigError::Decode(_))
        ));
    }

    #[test]
    fn validate_checks_url_names_and_durations() {
        for bad in [
            "cc.example.org",
            "ftp://cc.example.org",
            "http://",
            "https://h/?x=1",
        ] {
            let err = Config::new(bad).validate().unwrap_err();
            assert!(
                matches!(err, ConfigError::InvalidUrl { .. }),
                "{bad}: {err}"
            );
        }
        let mut c = Config::new("https://h");
        c.hostname = "../etc".into();
        assert!(matches!(
            c.validate(),
            Err(ConfigError::UnsafeName {
                key: "hostname",
                ..
            })
        ));
        c.hostname = "h1.example.org".into();
        c.validate().unwrap();
        c.cluster = "a/b".into();
        assert!(matches!(
            c.validate(),
            Err(ConfigError::UnsafeName { key: "cluster", .. })
        ));
        c.cluster = "fritz".into();
        c.heartbeat_interval = Duration::ZERO;
        assert!(matches!(c.validate(), Err(ConfigError::NotPositive { .. })));
    }

    #[test]
    fn one_url_string_is_one_server_as_in_go() {
        let c = Config::from_json(r#"{"url":"https://cc.example.org/"}"#).unwrap();
        assert_eq!(c.url, "https://cc.example.org/");
        assert!(c.failover_urls.is_empty());
        assert_eq!(c.base_urls().unwrap(), ["https://cc.example.org"]);
    }

    #[test]
    fn an_array_of_urls_lists_the_servers_in_order_of_preference() {
        let c = Config::from_json(
            r#"{"url":["https://fleet1.example.org","http://fleet2:8080/cc/","https://fleet3"]}"#,
        )
        .unwrap();
        assert_eq!(c.url, "https://fleet1.example.org");
        assert_eq!(
            c.failover_urls,
            ["http://fleet2:8080/cc/", "https://fleet3"]
        );
        assert_eq!(
            c.urls().collect::<Vec<_>>(),
            [
                "https://fleet1.example.org",
                "http://fleet2:8080/cc/",
                "https://fleet3"
            ]
        );
        assert_eq!(
            c.base_urls().unwrap(),
            [
                "https://fleet1.example.org",
                "http://fleet2:8080/cc",
                "https://fleet3"
            ]
        );
        c.validate().unwrap();
        // A list of one is the same as the string.
        let one = Config::from_json(r#"{"url":["https://h"]}"#).unwrap();
        assert_eq!(one, Config::new("https://h"));
        let value = Config::from_value(serde_json::json!({"url": ["https://a", "https://b"]}));
        assert_eq!(value.unwrap().failover_urls, ["https://b"]);
    }

    #[test]
    fn an_empty_url_list_is_refused_naming_the_key() {
        let err = Config::from_json(r#"{"url":[]}"#).unwrap_err();
        assert!(matches!(err, ConfigError::EmptyUrlList), "{err}");
        assert_eq!(
            err.to_string(),
            "fleet: 'url' is an empty list; give at least one server URL"
        );
        assert!(matches!(
            Config::from_json(r#"{"url":null}"#),
            Err(ConfigError::MissingUrl)
        ));
    }

    #[test]
    fn a_url_that_is_neither_a_string_nor_a_list_of_strings_is_refused_naming_the_key() {
        for bad in [
            r#"{"url":5}"#,
            r#"{"url":{"a":1}}"#,
            r#"{"url":["https://h",7]}"#,
        ] {
            let err = Config::from_json(bad).unwrap_err();
            assert!(matches!(err, ConfigError::Decode(_)), "{bad}: {err}");
            assert!(err.to_string().contains("url"), "{bad}: {err}");
        }
    }

    #[test]
    fn a_server_listed_twice_is_refused() {
        for list in [
            r#"["https://a","https://b","https://a"]"#,
            r#"["https://a","https://b","https://A:443/"]"#,
            r#"["http://u:p@a","https://b","http://u:p@a/"]"#,
        ] {
            let err = Config::from_json(&format!(r#"{{"url":{list}}}"#))
                .unwrap()
                .validate()
                .unwrap_err();
            assert!(
                matches!(
                    err,
                    ConfigError::DuplicateUrl {
                        first: 1,
                        second: 3
                    }
                ),
                "{list}: {err}"
            );
            assert_eq!(
                err.to_string(),
                "fleet: 'url' lists the same server twice (entries 1 and 3)"
            );
        }
    }

    #[test]
    fn a_bad_entry_of_a_url_list_is_named_by_its_position_without_its_credentials() {
        let c = Config::from_json(r#"{"url":["https://a","ftp://u:s3cret@b"]}"#).unwrap();
        let err = c.validate().unwrap_err();
        assert!(
            matches!(err, ConfigError::InvalidUrl { entry: Some(2), .. }),
            "{err}"
        );
        assert_eq!(
            err.to_string(),
            "fleet: invalid url (entry 2 of the list): the scheme must be http or https"
        );
        let c = Config::from_json(r#"{"url":["https://a",""]}"#).unwrap();
        assert!(matches!(
            c.validate(),
            Err(ConfigError::InvalidUrl {
                entry: Some(2),
                reason: "the entry is empty"
            })
        ));
        let c = Config::from_json(r#"{"url":["","https://a"]}"#).unwrap();
        assert!(matches!(
            c.validate(),
            Err(ConfigError::InvalidUrl { entry: Some(1), .. })
        ));
        // A single bad URL keeps its message.
        let err = Config::new("ftp://h").validate().unwrap_err();
        assert_eq!(
            err.to_string(),
            "fleet: invalid url: the scheme must be http or https"
        );
    }

    #[test]
    fn comma_separated_urls_in_one_string_are_refused_with_a_hint() {
        for bad in ["https://a,https://b", "http://a:8080, http://b:8080"] {
            let err = Config::new(bad).validate().unwrap_err();
            assert!(
                matches!(err, ConfigError::InvalidUrl { .. }),
                "{bad}: {err}"
            );
            assert!(err.to_string().contains("JSON array"), "{bad}: {err}");
        }
        // A comma inside a path is a URL's own business.
        Config::new("https://h/a,b").validate().unwrap();
    }

    #[test]
    fn base_url_trims_trailing_slashes() {
        assert_eq!(
            base_url("https://cc.example.org//").unwrap(),
            "https://cc.example.org"
        );
        assert_eq!(base_url("http://h:8080/cc").unwrap(), "http://h:8080/cc");
    }

    #[test]
    fn invalid_url_message_does_not_echo_credentials() {
        let err = Config::new("ftp://user:s3cret@h").validate().unwrap_err();
        assert!(!err.to_string().contains("s3cret"), "{err}");
    }

    #[test]
    fn token_precedence() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("token");
        std::fs::write(&file, "  from-file\n").unwrap();
        let file_str = file.to_str().unwrap();
        let mut c = Config::new("https://h");
        c.token = "from-config".into();

        assert_eq!(c.resolve_token_with(env(&[])).unwrap(), "from-config");
        assert_eq!(
            c.resolve_token_with(env(&[(ENV_TOKEN, "from-env"), (ENV_TOKEN_FILE, file_str)]))
                .unwrap(),
            "from-env"
        );
        assert_eq!(
            c.resolve_token_with(env(&[(ENV_TOKEN, ""), (ENV_TOKEN_FILE, file_str)]))
                .unwrap(),
            "from-file"
        );
    }

    #[test]
    fn token_file_errors_do_not_fall_back() {
        let dir = tempfile::tempdir().unwrap();
        let blank = dir.path().join("blank");
        std::fs::write(&blank, " \n\t").unwrap();
        let mut c = Config::new("https://h");
        c.token = "from-config".into();
        let err = c
            .resolve_token_with(env(&[(ENV_TOKEN_FILE, blank.to_str().unwrap())]))
            .unwrap_err();
        assert!(matches!(err, ConfigError::EmptyTokenFile { .. }));
        let missing = dir.path().join("missing");
        let err = c
            .resolve_token_with(env(&[(ENV_TOKEN_FILE, missing.to_str().unwrap())]))
            .unwrap_err();
        assert!(matches!(err, ConfigError::TokenFile { .. }));
        assert!(!err.to_string().contains("from-config"));
    }

    #[test]
    fn roster_limits_and_key_are_parsed_and_checked() {
        let c = Config::from_json(r#"{"url":"https://h"}"#).unwrap();
        assert_eq!(c.roster_max_bytes, 1 << 20);
        assert_eq!(c.roster_max_providers, 10_000);
        assert!(c.roster_key().unwrap().is_none());
        let key = base64::Engine::encode(
            &base64::engine::general_purpose::STANDARD,
            ed25519_dalek::SigningKey::from_bytes(&[7; 32])
                .verifying_key()
                .as_bytes(),
        );
        let c = Config::from_value(serde_json::json!({
            "url": "https://h", "roster-max-bytes": 4096, "roster-max-providers": 3,
            "roster-public-key": key, "roster-max-age": "30s"
        }))
        .unwrap();
        c.validate().unwrap();
        assert_eq!(c.roster_max_bytes, 4096);
        assert_eq!(c.roster_max_providers, 3);
        assert_eq!(c.roster_max_age, Duration::from_secs(30));
        assert!(c.roster_key().unwrap().is_some());
        for bad in ["not base64!", "AAAA"] {
            let mut c = Config::new("https://h");
            c.roster_public_key = bad.into();
            assert!(matches!(c.validate(), Err(ConfigError::InvalidRosterKey)));
        }
        let mut c = Config::new("https://h");
        c.roster_max_providers = 0;
        assert!(matches!(
            c.validate(),
            Err(ConfigError::ZeroLimit {
                key: "roster-max-providers"
            })
        ));
        assert!(Config::from_json(r#"{"url":"https://h","roster-max-bytes":-1}"#).is_err());
    }

    #[test]
    fn debug_redacts_the_token() {
        let mut c = Config::new("https://h");
        c.token = "eyJ-secret".into();
        let shown = format!("{c:?}");
        assert!(!shown.contains("eyJ-secret"), "{shown}");
        assert!(shown.contains("<redacted>"));
    }

    #[test]
    fn debug_shows_urls_without_their_user_information() {
        let mut c = Config::new("https://cc:pw-one@fleet1");
        c.failover_urls = vec!["https://cc:pw-two@fleet2:8443".into(), "a@b:c".into()];
        let shown = format!("{c:?}");
        for secret in ["pw-one", "pw-two", "a@b"] {
            assert!(!shown.contains(secret), "{shown}");
        }
        assert!(shown.contains("https://fleet1"), "{shown}");
        assert!(shown.contains("https://fleet2:8443"), "{shown}");
        assert!(format!("{:?}", Config::new("cc.example.org")).contains("cc.example.org"));
    }

    #[test]
    fn schema_lists_exactly_the_accepted_keys() {
        let schema: serde_json::Value = serde_json::from_str(CONFIG_SCHEMA).unwrap();
        assert_eq!(schema["required"], serde_json::json!(["url"]));
        assert_eq!(schema["additionalProperties"], serde_json::json!(false));
        let props = schema["properties"].as_object().unwrap();
        assert_eq!(props.len(), 14);
        for (key, prop) in props {
            // Every key of the schema is accepted by the parser (with a value valid for it).
            let value = if prop["type"] == "integer" {
                serde_json::json!(5)
            } else if key.ends_with("interval") || key == "timeout" || key.ends_with("age") {
                serde_json::json!("5s")
            } else if key == "url" {
                serde_json::json!("https://h")
            } else {
                assert_eq!(prop["type"], "string", "{key}");
                serde_json::json!("x")
            };
            let mut section = serde_json::json!({"url": "https://h"});
            section[key] = value;
            Config::from_value(section).unwrap_or_else(|e| panic!("{key}: {e}"));
        }
    }

    #[test]
    fn effective_hostname_prefers_the_configured_one() {
        let mut c = Config::new("https://h");
        c.hostname = "f0101".into();
        assert_eq!(c.effective_hostname().unwrap(), "f0101");
        c.hostname.clear();
        let system = c.effective_hostname().unwrap();
        assert!(!system.is_empty());
    }
}
