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
pub const CONFIG_SCHEMA: &str = include_str!("config/schema.json");

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
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct RawConfig {
    /// Base URL of cc-backend or `ccfleet server`; an array lists several fleet servers in
    /// order of preference (a request that fails with a connection error, a timeout, 5xx or
    /// 429 goes to the next). One string is one server, as in Go: a comma-separated string
    /// is refused, not split. Required.
    #[serde(default, deserialize_with = "url_list")]
    #[cfg_attr(feature = "schema", schemars(with = "Option<Urls>"))]
    url: Option<Vec<String>>,
    /// JWT with the `api` role; `CC_FLEET_TOKEN`, else the file `CC_FLEET_TOKEN_FILE` names,
    /// overrides it. Without any, the agent warns and the server answers 401 unless its
    /// authentication is disabled. Default: empty.
    token: Option<String>,
    /// The cluster this member belongs to. Default: empty, the infra scope.
    cluster: Option<String>,
    /// The name to register under. Default: the system's host name.
    hostname: Option<String>,
    /// Time between heartbeats (Go duration). Default `30s`.
    heartbeat_interval: Option<String>,
    /// Time between configuration pulls, with ETags (Go duration). Default `60s`.
    config_poll_interval: Option<String>,
    /// NATS subject of heartbeats; needs a `nats` section. Default: empty, heartbeats go
    /// over REST.
    heartbeat_subject: Option<String>,
    /// Prefix of the roster subjects. Default `cc.fleet.discovery`.
    discovery_subject_prefix: Option<String>,
    /// File caching the last configuration, used when cc-backend is unreachable at start.
    /// Default: none, no cache.
    cache_path: Option<String>,
    /// The bound of one HTTP request to the fleet server (Go duration). Default `10s`.
    timeout: Option<String>,
    /// Larger rosters are rejected and counted. Default 1048576.
    roster_max_bytes: Option<usize>,
    /// Rosters listing more providers are rejected and counted. Default 10000.
    roster_max_providers: Option<usize>,
    /// The fleet server's `JWT_PUBLIC_KEY`: only rosters it signed are accepted. Default:
    /// empty, rosters need no signature.
    roster_public_key: Option<String>,
    /// With a roster key: how far a roster's timestamp may lie from the local clock (Go
    /// duration). Default `5m`.
    roster_max_age: Option<String>,
}

/// `url`: one server, or several in order of preference.
#[cfg(feature = "schema")]
#[derive(schemars::JsonSchema)]
#[serde(untagged)]
#[allow(dead_code)]
enum Urls {
    One(String),
    Several(Vec<String>),
}

/// The JSON Schema of the `fleet` section, for the agent configuration's schema
/// (`schemars(schema_with = ...)`).
#[cfg(feature = "schema")]
pub fn json_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
    let mut schema = generator.subschema_for::<RawConfig>();
    schema.insert(
        "description".to_owned(),
        "The fleet client: how to reach the fleet server and who this member is.".into(),
    );
    schema
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
mod tests;
