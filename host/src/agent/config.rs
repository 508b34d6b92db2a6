//! The agent's configuration file (`ccfleet agent --config FILE`).
//!
//! ```json
//! {
//!   "service-type": "ccmc",
//!   "fleet": {"url": "http://backend:8080", "cluster": "fritz", "heartbeat-subject": "cc.fleet.event"},
//!   "nats": {"address": "nats://nats01:4222", "creds-file-path": "/etc/cc/nats.creds"},
//!   "discovery": {"provider": "STATIC", "static-endpoints": ["ms1:8080"]},
//!   "metrics": {"type": "nats", "subject": "cc.metric.fritz"},
//!   "plugins": [{"path": "plugins/loadavg.wasm", "collect-interval": "10s",
//!                "capabilities": {"read-files": ["/proc/loadavg"]}}],
//!   "shutdown-timeout": "10s",
//!   "metrics-addr": "127.0.0.1:9102"
//! }
//! ```
//!
//! Relative paths (plugins, `plugin-cache-dir`, `fleet.cache-path`, `nats.creds-file-path`,
//! `nats.nkey-seed-file`) are resolved against the directory of the configuration file.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ccfleet::duration::serde_go;
use ccfleet::wire::ServiceType;
use serde::Deserialize;

use super::AgentError;
use crate::PluginSpec;

/// The whole agent configuration.
#[derive(Clone, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct AgentConfig {
    /// The service type this agent registers as: `ccms`, `ccmc`, `ccb`, `cces`, `ccsa`,
    /// `ccnc` or `ccem`. Default `ccmc`.
    #[serde(default = "default_service_type")]
    #[cfg_attr(feature = "schema", schemars(with = "String"))]
    pub service_type: ServiceType,
    /// The fleet client's section, as `ccfleet::client::Config` reads it.
    #[cfg_attr(
        feature = "schema",
        schemars(schema_with = "ccfleet::client::config::json_schema")
    )]
    pub fleet: serde_json::Value,
    /// Metadata registered with the instance (broadcast in rosters: no secrets).
    #[serde(default)]
    pub meta: BTreeMap<String, String>,
    /// The NATS connection (heartbeats, rosters, metrics); REST only without it.
    #[serde(default)]
    pub nats: Option<NatsConfig>,
    /// A service-discovery provider whose instances are merged with the fleet rosters.
    #[serde(default)]
    pub discovery: Option<ccfleet::discovery::provider::Config>,
    /// How often discovery is refreshed (Go duration). Default `10s`.
    #[serde(default = "default_discovery_interval", with = "serde_go")]
    #[cfg_attr(feature = "schema", schemars(with = "String"))]
    pub discovery_refresh_interval: Duration,
    /// Where emitted points go when there is no `sinks` object (the single-sink form).
    #[serde(default)]
    pub metrics: MetricsConfig,
    /// Named metric sinks, as cc-metric-collector configures them; every point goes to every
    /// sink. Replaces `metrics`. Default: none, the `metrics` section decides.
    #[serde(default)]
    #[cfg_attr(
        feature = "schema",
        schemars(with = "BTreeMap<String, super::sinks::schema::SinkSchema>")
    )]
    pub sinks: BTreeMap<String, super::sinks::SinkConfig>,
    /// Where plugins the fleet names by SHA-256 are kept once downloaded (mode 0700).
    /// Default: `fleet-plugins` beside the compile cache.
    #[serde(default)]
    pub fleet_plugin_dir: Option<PathBuf>,
    /// The most the fleet may grant its plugins on this node (the node administrator's,
    /// never the fleet's). Default: `read-files` under `/proc` and `/sys`, `mount-info` and
    /// limits up to the agent's defaults; no commands, no native library, no WASI.
    #[serde(default)]
    pub fleet_ceiling: Option<crate::plugin::ceiling::Ceiling>,
    /// The site's plugin signing keys (standard base64 Ed25519 public keys): with any, a
    /// plugin the fleet names runs only when its component is signed by one of them
    /// (`ccfleet plugin sign` embeds the signature); without, signatures are not checked.
    #[serde(default)]
    #[cfg_attr(feature = "schema", schemars(with = "Vec<String>"))]
    pub plugin_public_keys: crate::plugin::signature::PublicKeys,
    /// Where compiled plugins are cached. Default: the user cache directory.
    #[serde(default)]
    pub plugin_cache_dir: Option<PathBuf>,
    /// How often plugin files are checked for changes; a changed file is reloaded (Go
    /// duration). Default `2s`.
    #[serde(default = "default_watch_interval", with = "serde_go")]
    #[cfg_attr(feature = "schema", schemars(with = "String"))]
    pub plugin_watch_interval: Duration,
    /// The plugins the node's administrator configures (the fleet's come from the
    /// configuration tree).
    #[serde(default)]
    pub plugins: Vec<PluginSpec>,
    /// The file this configuration was read from (set by [`AgentConfig::load`]); it may hold
    /// the token, so plugins may not read it.
    #[serde(skip)]
    pub path: Option<PathBuf>,
    /// How long shutdown may take after SIGTERM or SIGINT, whatever NATS, cc-backend or the
    /// plugins do; what has not finished by then is abandoned, and a second signal exits at
    /// once (Go duration). Default `10s`.
    #[serde(default = "default_shutdown_timeout", with = "serde_go")]
    #[cfg_attr(feature = "schema", schemars(with = "String"))]
    pub shutdown_timeout: Duration,
    /// Where to serve `GET /metrics` (Prometheus text format), `GET /healthz` (alive) and
    /// `GET /readyz` (ready), e.g. `127.0.0.1:9102`; off when absent.
    #[serde(default)]
    pub metrics_addr: Option<String>,
    /// The `self` collector: the agent's own figures sent as metrics beside the plugins'
    /// (cc-metric-collector's `self` keys, plus `interval` and `read_agent_stats`); off when
    /// absent.
    #[serde(default, rename = "self")]
    pub self_metrics: Option<super::self_metrics::SelfConfig>,
    /// The router between plugins and sinks: cc-metric-collector's `router.json` content
    /// (`process_messages`, `interval_aggregates`, ...); points pass untouched when absent.
    #[serde(default)]
    pub router: Option<super::router::RouterConfig>,
}

fn default_service_type() -> ServiceType {
    ServiceType::MetricCollector
}

fn default_discovery_interval() -> Duration {
    ccfleet::discovery::CACHE_REFRESH_INTERVAL
}

/// The default of `shutdown-timeout`.
pub const DEFAULT_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(10);

fn default_shutdown_timeout() -> Duration {
    DEFAULT_SHUTDOWN_TIMEOUT
}

fn default_watch_interval() -> Duration {
    Duration::from_secs(2)
}

impl AgentConfig {
    /// The JSON Schema of the configuration file, its keys described by their documentation
    /// (the book's configuration reference is generated from it).
    #[cfg(feature = "schema")]
    pub fn json_schema() -> schemars::Schema {
        schemars::schema_for!(AgentConfig)
    }
}

impl fmt::Debug for AgentConfig {
    // The fleet section may hold a token: only its shape is shown.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AgentConfig")
            .field("service_type", &self.service_type)
            .field("fleet", &"<fleet section>")
            .field("meta", &self.meta)
            .field("nats", &self.nats)
            .field("discovery", &self.discovery.as_ref().map(|d| &d.provider))
            .field("metrics", &self.metrics)
            .field("sinks", &self.sinks)
            .field("plugins", &self.plugins)
            .field("shutdown_timeout", &self.shutdown_timeout)
            .field("metrics_addr", &self.metrics_addr)
            .field("self_metrics", &self.self_metrics)
            .finish()
    }
}

impl AgentConfig {
    /// Parses a configuration; relative plugin paths are resolved against `base`.
    pub fn from_json(text: &str, base: &Path) -> Result<AgentConfig, AgentError> {
        // A mistake names its key and the form the key takes (`ccfleet::json_config`).
        let mut config: AgentConfig = ccfleet::json_config::from_str(text)
            .map_err(|e| AgentError::Config(format!("invalid agent configuration: {e}")))?;
        let mut names = std::collections::BTreeSet::new();
        for plugin in &mut config.plugins {
            plugin.resolve_path(base);
            plugin.validate()?;
            // Logs, events and /metrics tell plugins apart by name.
            let name = plugin.display_name();
            if !names.insert(name.clone()) {
                return Err(AgentError::Config(format!(
                    "two plugins are named {name:?}; give one of them a distinct \"name\""
                )));
            }
        }
        if let Some(ceiling) = &mut config.fleet_ceiling {
            ceiling.validate().map_err(AgentError::Config)?;
            if let Some(root) = &mut ceiling.capabilities.files_root
                && root.is_relative()
            {
                *root = base.join(&*root);
            }
        }
        if let Some(addr) = &config.metrics_addr
            && addr.trim().is_empty()
        {
            return Err(AgentError::Config(
                "metrics-addr is empty; leave it out to serve no metrics".to_owned(),
            ));
        }
        if config.shutdown_timeout.is_zero() {
            return Err(AgentError::Config(
                "shutdown-timeout must be positive".to_owned(),
            ));
        }
        for dir in [&mut config.plugin_cache_dir, &mut config.fleet_plugin_dir]
            .into_iter()
            .flatten()
        {
            if dir.is_relative() {
                *dir = base.join(&*dir);
            }
        }
        for (name, sink) in &mut config.sinks {
            sink.validate(name).map_err(AgentError::Config)?;
            sink.resolve_paths(base);
        }
        super::sinks::effective(&config.sinks, &config.metrics, config.nats.is_some())?;
        if let Some(router) = &config.router {
            // Compiling is the check: every condition is parsed, every name resolved.
            super::router::Router::new(router, "localhost").map_err(AgentError::Config)?;
        }
        // Every relative path of the file means the same wherever the agent is started.
        if let Some(serde_json::Value::String(cache)) = config.fleet.get_mut("cache-path")
            && !cache.is_empty()
            && Path::new(cache.as_str()).is_relative()
        {
            *cache = base.join(cache.as_str()).to_string_lossy().into_owned();
        }
        if let Some(nats) = &mut config.nats {
            for file in [&mut nats.creds_file_path, &mut nats.nkey_seed_file] {
                if !file.is_empty() && Path::new(file.as_str()).is_relative() {
                    *file = base.join(file.as_str()).to_string_lossy().into_owned();
                }
            }
        }
        Ok(config)
    }

    /// Reads and parses a configuration file.
    pub fn load(path: &Path) -> Result<AgentConfig, AgentError> {
        let text = std::fs::read_to_string(path).map_err(|source| AgentError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let base = path.parent().unwrap_or(Path::new("."));
        let mut config = AgentConfig::from_json(&text, base)?;
        config.path = Some(path.to_path_buf());
        Ok(config)
    }

    /// The files holding the agent's secrets, which no plugin may read whatever its grant:
    /// this configuration file, the token file (`token_file`: the value of
    /// `CC_FLEET_TOKEN_FILE`), the NATS credentials file, the sinks' JWT files and the compile cache's key
    /// (`<cache dir>.key`, beside `cache_dir`).
    pub fn secret_files(
        &self,
        token_file: Option<std::ffi::OsString>,
        cache_dir: Option<&Path>,
    ) -> Vec<PathBuf> {
        let mut files: Vec<PathBuf> = self.path.iter().cloned().collect();
        if let Some(token) = token_file.filter(|v| !v.is_empty()) {
            files.push(PathBuf::from(token));
        }
        if let Some(nats) = &self.nats {
            for file in [&nats.creds_file_path, &nats.nkey_seed_file] {
                if !file.is_empty() {
                    files.push(PathBuf::from(file));
                }
            }
        }
        // cc-metric-store's JWTs, InfluxDB's passwords.
        files.extend(self.sinks.values().flat_map(|s| s.secret_files()));
        if let Some(dir) = cache_dir {
            let mut key = dir.as_os_str().to_owned();
            key.push(".key");
            files.push(PathBuf::from(key));
        }
        files
    }
}

/// The secret files the environment names (`env` looks a variable up): the NATS user and
/// password files (`CC_NATS_USERNAME_FILE`, `CC_NATS_PASSWORD_FILE`) and systemd's
/// credentials directory (`CREDENTIALS_DIRECTORY`).
pub fn env_secret_files(env: impl Fn(&str) -> Option<std::ffi::OsString>) -> Vec<PathBuf> {
    let names = [
        format!("{}_FILE", ccfleet::nats::ENV_NATS_USERNAME),
        format!("{}_FILE", ccfleet::nats::ENV_NATS_PASSWORD),
        "CREDENTIALS_DIRECTORY".to_owned(),
    ];
    names
        .iter()
        .filter_map(|name| env(name).filter(|v| !v.is_empty()).map(PathBuf::from))
        .collect()
}

pub use ccfleet::nats::{ConnectionReporter, NatsConfig};

/// Connects as the agent: reconnecting forever, so the agent starts (and heartbeats over
/// REST) while NATS is down. The returned reporter logs the connection's events (an outage
/// costs a few lines, never one per reconnect attempt) and knows whether it is up.
pub async fn connect_nats(
    section: &NatsConfig,
) -> Result<(async_nats::Client, ConnectionReporter), AgentError> {
    let reporter = ConnectionReporter::new(&section.address);
    let events = reporter.clone();
    let options = section
        .connect_options("ccfleet-agent")
        .await
        .map_err(|e| AgentError::Config(section.scrub(&e)))?
        .event_callback(move |event| {
            let events = events.clone();
            async move { events.on_event(event).await }
        });
    let client = section.connect(options).await.map_err(|e| {
        // The address may carry credentials: only its host and port are shown, and the
        // error is scrubbed.
        AgentError::Nats(format!(
            "cannot connect to {}: {e}",
            section.display_address()
        ))
    })?;
    Ok((client, reporter))
}

/// Where metrics go.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct MetricsConfig {
    /// `nats` or `stdout`. Default: `nats` with a `nats` section, else `stdout`; the agent
    /// logs its choice at start.
    #[serde(default, rename = "type")]
    pub kind: Option<SinkKind>,
    /// NATS subject of the points. Default: `cc.metric.<cluster>`, or `cc.metric` without a
    /// cluster.
    #[serde(default)]
    pub subject: Option<String>,
}

/// The metric sink's kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum SinkKind {
    /// Publish to NATS.
    Nats,
    /// Write to standard output.
    Stdout,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_secret_files_are_the_config_token_credentials_and_cache_key() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("agent.json");
        std::fs::write(
            &path,
            r#"{"fleet":{"url":"http://h:8080"},
                "nats":{"address":"nats://n:4222","creds-file-path":"/etc/cc/nats.creds"}}"#,
        )
        .unwrap();
        let config = AgentConfig::load(&path).unwrap();
        let files = config.secret_files(
            Some("/run/secrets/fleet.token".into()),
            Some(Path::new("/var/cache/ccfleet/components")),
        );
        assert_eq!(
            files,
            [
                path.clone(),
                PathBuf::from("/run/secrets/fleet.token"),
                PathBuf::from("/etc/cc/nats.creds"),
                PathBuf::from("/var/cache/ccfleet/components.key"),
            ]
        );
        // An unset or empty token file and no cache: nothing of theirs.
        assert_eq!(
            config.secret_files(Some("".into()), None),
            [path, PathBuf::from("/etc/cc/nats.creds")]
        );
    }

    #[test]
    fn the_environment_names_the_nats_password_file_and_the_credentials_directory() {
        let env = |name: &str| match name {
            "CC_NATS_PASSWORD_FILE" => Some("/run/nats.pw".into()),
            "CREDENTIALS_DIRECTORY" => Some("/run/credentials/ccfleet.service".into()),
            "CC_NATS_USERNAME_FILE" => Some("".into()),
            _ => None,
        };
        assert_eq!(
            env_secret_files(env),
            [
                PathBuf::from("/run/nats.pw"),
                PathBuf::from("/run/credentials/ccfleet.service")
            ]
        );
        let dir = tempfile::tempdir().unwrap();
        let config = AgentConfig::from_json(
            r#"{"fleet":{"url":"http://h:8080"},
                "nats":{"address":"nats://n:4222","nkey-seed-file":"/etc/cc/nkey.seed"}}"#,
            dir.path(),
        )
        .unwrap();
        assert!(
            config
                .secret_files(None, None)
                .contains(&PathBuf::from("/etc/cc/nkey.seed"))
        );
    }

    #[test]
    fn parses_a_full_configuration() {
        let config = AgentConfig::from_json(
            r#"{"service-type":"ccms","fleet":{"url":"http://h:8080","token":"secret"},
                "nats":{"address":"nats://n:4222","username":"u","password":"p"},
                "discovery":{"provider":"STATIC","static-endpoints":["a:1"]},
                "discovery-refresh-interval":"5s",
                "metrics":{"type":"nats","subject":"cc.metric.fritz"},
                "plugins":[{"path":"p/l.wasm","collect-interval":"10s"}],
                "shutdown-timeout":"3s"}"#,
            Path::new("/etc/cc"),
        )
        .unwrap();
        assert_eq!(config.service_type, ServiceType::MetricStore);
        assert_eq!(config.plugins[0].path, Path::new("/etc/cc/p/l.wasm"));
        assert_eq!(config.discovery_refresh_interval, Duration::from_secs(5));
        assert_eq!(config.metrics.kind, Some(SinkKind::Nats));
        assert_eq!(config.shutdown_timeout, Duration::from_secs(3));
        let shown = format!("{config:?}");
        assert!(
            !shown.contains("secret") && !shown.contains("\"p\""),
            "{shown}"
        );
    }

    #[test]
    fn every_relative_path_is_resolved_against_the_config_directory() {
        let config = AgentConfig::from_json(
            r#"{"fleet":{"url":"http://h:8080","cache-path":"var/fleet-config.json"},
                "nats":{"address":"nats://n:4222","creds-file-path":"nats.creds"},
                "plugin-cache-dir":"cache",
                "plugins":[{"path":"plugins/loadavg.wasm"}]}"#,
            Path::new("/etc/ccfleet"),
        )
        .unwrap();
        assert_eq!(
            config.fleet["cache-path"],
            "/etc/ccfleet/var/fleet-config.json"
        );
        assert_eq!(
            config.nats.as_ref().unwrap().creds_file_path,
            "/etc/ccfleet/nats.creds"
        );
        assert_eq!(
            config.plugin_cache_dir.as_deref(),
            Some(Path::new("/etc/ccfleet/cache"))
        );
        assert_eq!(
            config.plugins[0].path,
            Path::new("/etc/ccfleet/plugins/loadavg.wasm")
        );
    }

    #[test]
    fn shutdown_is_bounded_by_ten_seconds_unless_configured() {
        let config = AgentConfig::from_json(r#"{"fleet":{}}"#, Path::new(".")).unwrap();
        assert_eq!(config.shutdown_timeout, Duration::from_secs(10));
        let err = AgentConfig::from_json(r#"{"fleet":{},"shutdown-timeout":"0s"}"#, Path::new("."))
            .unwrap_err()
            .to_string();
        assert!(err.contains("shutdown-timeout"), "{err}");
    }

    #[test]
    fn two_plugins_of_one_name_are_refused() {
        let err = AgentConfig::from_json(
            r#"{"fleet":{},"plugins":[{"path":"a/l.wasm"},{"path":"b/l.wasm"}]}"#,
            Path::new("."),
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("two plugins are named \"l\""), "{err}");
        let named = AgentConfig::from_json(
            r#"{"fleet":{},"plugins":[{"path":"a/l.wasm"},{"path":"b/l.wasm","name":"l2"}]}"#,
            Path::new("."),
        );
        assert!(named.is_ok());
    }

    #[test]
    fn metrics_addr_is_off_unless_given_and_never_empty() {
        let config = AgentConfig::from_json(r#"{"fleet":{}}"#, Path::new(".")).unwrap();
        assert_eq!(config.metrics_addr, None);
        let config = AgentConfig::from_json(
            r#"{"fleet":{},"metrics-addr":"127.0.0.1:9102"}"#,
            Path::new("."),
        )
        .unwrap();
        assert_eq!(config.metrics_addr.as_deref(), Some("127.0.0.1:9102"));
        let err = AgentConfig::from_json(r#"{"fleet":{},"metrics-addr":" "}"#, Path::new("."))
            .unwrap_err()
            .to_string();
        assert!(err.contains("metrics-addr is empty"), "{err}");
    }

    #[test]
    fn rejects_unknown_keys() {
        let err = AgentConfig::from_json(r#"{"fleet":{},"plugin":[]}"#, Path::new("."))
            .unwrap_err()
            .to_string();
        assert!(err.contains("unknown field `plugin`"), "{err}");
    }
}
