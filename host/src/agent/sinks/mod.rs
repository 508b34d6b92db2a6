//! The agent's metric sinks, as cc-metric-collector has them: `nats` (publish line protocol
//! to a subject), `http` (cc-metric-store's `POST /api/write?cluster=...`, JWT bearer auth,
//! batching, a bounded retry buffer, optional gzip), `stdout`, and `influxdb`/`influxasync`
//! (InfluxDB's v2 or v1 write API, with cc-lib's keys), `prometheus` (served for scraping)
//! and `ganglia`/`libganglia` (gmond's UDP messages).
//!
//! ```json
//! {
//!   "fleet": {"url": "http://backend:8080", "cluster": "fritz"},
//!   "nats": {"address": "nats://nats01:4222"},
//!   "sinks": {
//!     "store": {"type": "http", "url": "http://ms01:8082/api/write", "cluster": "fritz",
//!               "jwt-file": "/etc/cc/ccms.jwt", "batch-size": 1000, "flush-delay": "1s",
//!               "gzip": true},
//!     "bus":   {"type": "nats", "subject": "cc.metric.fritz"}
//!   }
//! }
//! ```
//!
//! An entry is `type`, the shared `queue-size`, and the keys of its type (each type's own
//! struct refuses keys it does not know). Plugins hand batches to one bounded channel
//! without waiting; a fan-out task copies each batch into every sink's own bounded queue,
//! again without waiting: a full queue drops the batch for that sink only and counts it. So
//! a stalled cc-metric-store delays nothing but its own sink, and never a plugin.

mod batch;
mod counters;
mod fanout;
pub mod ganglia;
pub mod http;
pub mod influxdb;
mod kind;
pub mod meta_tags;
pub mod nats;
pub mod prometheus;
#[cfg(feature = "schema")]
pub mod schema;
pub mod stdout;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use serde::Deserialize;
use serde::de::{DeserializeOwned, Deserializer, Error as _};
use serde_json::{Map, Value};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::AgentError;
use super::router::Router;
use crate::sink::{Batch, BatchReceiver};
use fanout::Queue;

pub use batch::gzip;
pub use counters::{SinkCounters, SinkInfo};
pub use ganglia::{GangliaConfig, LibgangliaConfig};
pub use http::{DEFAULT_BATCH_SIZE, DEFAULT_RETRY_BUFFER, HttpConfig};
pub use influxdb::InfluxConfig;
pub use kind::SinkType;
pub use nats::NatsConfig;
pub use prometheus::PrometheusConfig;
pub use stdout::StdoutConfig;

/// Batches queued for one sink by default before new ones are dropped for it.
pub const DEFAULT_QUEUE_SIZE: usize = 1024;

/// The keys of one sink's type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SinkSettings {
    /// `http`: cc-metric-store's write API.
    Http(HttpConfig),
    /// `nats`: a subject on the agent's NATS connection.
    Nats(NatsConfig),
    /// `stdout`.
    Stdout(StdoutConfig),
    /// `influxdb` or `influxasync` (the same writer): InfluxDB's write API.
    Influx(SinkType, InfluxConfig),
    /// `prometheus`: the latest values, served for scraping.
    Prometheus(PrometheusConfig),
    /// `ganglia`: gmond's messages, with cc-lib's `ganglia` keys.
    Ganglia(GangliaConfig),
    /// `libganglia`: gmond's messages, with cc-lib's `libganglia` keys.
    Libganglia(LibgangliaConfig),
}

/// One entry of the agent's `sinks` object: `type`, the keys every sink takes, and its
/// type's own keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SinkConfig {
    /// Batches queued for this sink before further ones are dropped (and counted).
    pub queue_size: usize,
    /// cc-lib's `meta_as_tags` of this sink: the meta keys it writes as tags, of those the
    /// plugins write; `None`: every tag the plugins write ([`meta_tags`]).
    pub meta_as_tags: Option<Vec<String>>,
    /// The type and its keys.
    pub settings: SinkSettings,
}

/// Reads a type's keys, naming the key that does not fit (`batch-size: invalid type ...`;
/// an unknown key is named by serde's message).
fn settings<T: DeserializeOwned>(rest: Map<String, Value>) -> Result<T, String> {
    serde_path_to_error::deserialize(Value::Object(rest)).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        // An unknown key is named by the message itself.
        if path == "." || path.is_empty() || inner.to_string().starts_with("unknown field") {
            inner.to_string()
        } else {
            format!("{path}: {inner}")
        }
    })
}

fn kinds() -> String {
    SinkType::ALL
        .iter()
        .map(|k| k.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

impl SinkConfig {
    /// A sink of `settings` with the default queue.
    pub fn new(settings: SinkSettings) -> SinkConfig {
        SinkConfig {
            queue_size: DEFAULT_QUEUE_SIZE,
            meta_as_tags: None,
            settings,
        }
    }

    /// Its kind.
    pub fn kind(&self) -> SinkType {
        match &self.settings {
            SinkSettings::Http(_) => SinkType::Http,
            SinkSettings::Nats(_) => SinkType::Nats,
            SinkSettings::Stdout(_) => SinkType::Stdout,
            SinkSettings::Influx(kind, _) => *kind,
            SinkSettings::Prometheus(_) => SinkType::Prometheus,
            SinkSettings::Ganglia(_) => SinkType::Ganglia,
            SinkSettings::Libganglia(_) => SinkType::Libganglia,
        }
    }

    /// Reads an entry from its JSON object.
    pub fn from_map(mut map: Map<String, Value>) -> Result<SinkConfig, String> {
        let kind = match map.remove("type") {
            Some(Value::String(name)) => SinkType::from_name(&name).ok_or_else(|| {
                format!(
                    "unknown sink type {}; one of {}",
                    ccfleet::untrusted::Untrusted(&name).capped(64),
                    kinds()
                )
            })?,
            Some(_) => return Err(format!("type: a string, one of {}", kinds())),
            None => return Err(format!("missing field `type` (one of {})", kinds())),
        };
        let queue_size = match map.remove("queue-size") {
            None => DEFAULT_QUEUE_SIZE,
            Some(v) => serde_json::from_value::<usize>(v)
                .map_err(|e| format!("queue-size: {e}; queue-size takes a positive integer"))?,
        };
        let meta_as_tags = match map.remove("meta_as_tags") {
            None => None,
            Some(v) => Some(serde_json::from_value::<Vec<String>>(v).map_err(|e| {
                format!(
                    "meta_as_tags: {e}; meta_as_tags takes an array of strings, e.g. [\"unit\"]"
                )
            })?),
        };
        let settings = match kind {
            SinkType::Http => SinkSettings::Http(settings(map)?),
            SinkType::Nats => SinkSettings::Nats(settings(map)?),
            SinkType::Stdout => SinkSettings::Stdout(settings(map)?),
            SinkType::Influxdb | SinkType::Influxasync => {
                SinkSettings::Influx(kind, settings(map)?)
            }
            SinkType::Prometheus => SinkSettings::Prometheus(settings(map)?),
            SinkType::Ganglia => SinkSettings::Ganglia(settings(map)?),
            SinkType::Libganglia => SinkSettings::Libganglia(settings(map)?),
        };
        Ok(SinkConfig {
            queue_size,
            meta_as_tags,
            settings,
        })
    }

    /// Checks the entry named `name` for impossible values.
    pub fn validate(&self, name: &str) -> Result<(), String> {
        let fail = |why: String| Err(format!("sinks.{name}: {why}"));
        if self.queue_size == 0 {
            return fail("queue-size must be positive".to_owned());
        }
        let checked = match &self.settings {
            SinkSettings::Http(c) => c.validate(),
            SinkSettings::Influx(_, c) => c.validate(),
            SinkSettings::Prometheus(c) => c.validate(),
            SinkSettings::Ganglia(c) => c.options().validate(),
            SinkSettings::Libganglia(c) => c.options().validate(),
            SinkSettings::Nats(_) | SinkSettings::Stdout(_) => Ok(()),
        };
        match checked {
            Ok(()) => Ok(()),
            Err(why) => fail(why),
        }
    }

    /// Resolves relative paths (`jwt-file`, `password_file`) against `base`.
    pub fn resolve_paths(&mut self, base: &Path) {
        match &mut self.settings {
            SinkSettings::Http(c) => c.resolve_paths(base),
            SinkSettings::Influx(_, c) => c.resolve_paths(base),
            SinkSettings::Ganglia(c) => {
                if let Some(file) = &mut c.gmetric_config
                    && file.is_relative()
                {
                    *file = base.join(&*file);
                }
            }
            SinkSettings::Libganglia(c) => {
                if let Some(file) = &mut c.gmond_config
                    && file.is_relative()
                {
                    *file = base.join(&*file);
                }
            }
            SinkSettings::Nats(_) | SinkSettings::Stdout(_) | SinkSettings::Prometheus(_) => {}
        }
    }

    /// The files holding secrets this sink reads.
    pub fn secret_files(&self) -> Vec<std::path::PathBuf> {
        match &self.settings {
            SinkSettings::Http(c) => c.jwt_file.iter().cloned().collect(),
            SinkSettings::Influx(_, c) => c.password_file.iter().cloned().collect(),
            SinkSettings::Nats(_)
            | SinkSettings::Stdout(_)
            | SinkSettings::Prometheus(_)
            | SinkSettings::Ganglia(_)
            | SinkSettings::Libganglia(_) => Vec::new(),
        }
    }
}

impl<'de> Deserialize<'de> for SinkConfig {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<SinkConfig, D::Error> {
        let map = Map::<String, Value>::deserialize(deserializer)?;
        SinkConfig::from_map(map).map_err(D::Error::custom)
    }
}

/// The running sinks: the fan-out task (which ends when every plugin's sink handle is gone,
/// after the sinks have written what they hold).
pub(crate) struct Sinks {
    pub info: Vec<SinkInfo>,
    pub task: JoinHandle<()>,
}

/// Starts the task of one sink reading `rx`.
fn spawn(
    name: &str,
    config: &SinkConfig,
    rx: mpsc::Receiver<Batch>,
    counters: Arc<SinkCounters>,
    nats: Option<&async_nats::Client>,
    fleet_cluster: &str,
    legacy: bool,
) -> Result<JoinHandle<()>, AgentError> {
    config.validate(name).map_err(AgentError::Config)?;
    Ok(match &config.settings {
        SinkSettings::Stdout(_) => {
            if legacy {
                tracing::info!(
                    "metrics go to standard output (no nats section, or metrics.type is stdout)"
                );
            } else {
                tracing::info!(sink = %name, "metrics go to standard output");
            }
            tokio::spawn(stdout::run(rx, counters))
        }
        SinkSettings::Nats(c) => {
            let Some(client) = nats else {
                return Err(AgentError::Config(format!(
                    "sinks.{name}: type nats needs a nats section"
                )));
            };
            let subject = c.subject(fleet_cluster);
            tracing::info!(sink = %name, %subject, "metrics go to NATS");
            tokio::spawn(nats::run(rx, client.clone(), subject, counters))
        }
        SinkSettings::Http(c) => {
            let sink = http::HttpSink::new(name, c, fleet_cluster).map_err(AgentError::Config)?;
            tokio::spawn(batch::run(
                sink,
                name.to_owned(),
                c.batching(),
                counters,
                rx,
            ))
        }
        SinkSettings::Influx(_, c) => {
            let sink = influxdb::InfluxSink::new(name, c).map_err(AgentError::Config)?;
            tokio::spawn(batch::run(
                sink,
                name.to_owned(),
                c.batching(),
                counters,
                rx,
            ))
        }
        SinkSettings::Prometheus(c) => {
            let listener = prometheus::bind(name, c).map_err(AgentError::Config)?;
            tokio::spawn(prometheus::run(listener, c.clone(), rx, counters))
        }
        SinkSettings::Ganglia(c) => {
            ganglia::start(name, c.options(), rx, counters).map_err(AgentError::Config)?
        }
        SinkSettings::Libganglia(c) => {
            ganglia::start(name, c.options(), rx, counters).map_err(AgentError::Config)?
        }
    })
}

/// One sink running outside an agent (for tools and benchmarks): send it batches of line
/// protocol; dropping `tx` makes it write what it holds and end.
pub struct Standalone {
    /// Where batches go (bounded by the sink's `queue-size`).
    pub tx: mpsc::Sender<Batch>,
    /// The sink's counters.
    pub counters: Arc<SinkCounters>,
    /// The sink's task; it ends once `tx` is dropped and everything held is written.
    pub task: JoinHandle<()>,
}

/// Starts the sink `name` of `config` on its own (no NATS connection: a `nats` sink is
/// refused); `fleet_cluster` is the `http` sink's default cluster. Needs a Tokio runtime.
pub fn start_standalone(
    name: &str,
    config: &SinkConfig,
    fleet_cluster: &str,
) -> Result<Standalone, AgentError> {
    let counters = Arc::new(SinkCounters::default());
    let (tx, rx) = mpsc::channel(config.queue_size.max(1));
    let task = spawn(
        name,
        config,
        rx,
        counters.clone(),
        None,
        fleet_cluster,
        false,
    )?;
    Ok(Standalone { tx, counters, task })
}

/// Starts every sink of `configs` and the fan-out from `batches`; `legacy` when they come
/// from the `metrics` section (its log line names the choice); `plugin_meta` are the meta
/// keys the plugins write as tags ([`meta_tags::of_plugins`]).
#[allow(clippy::too_many_arguments)]
pub(crate) fn start(
    batches: BatchReceiver,
    configs: &BTreeMap<String, SinkConfig>,
    nats: Option<&async_nats::Client>,
    fleet_cluster: &str,
    legacy: bool,
    alive: super::loops::LoopToken,
    router: Option<Router>,
    plugin_meta: &std::collections::BTreeSet<String>,
) -> Result<Sinks, AgentError> {
    let mut info = Vec::new();
    let mut queues = Vec::new();
    let mut tasks = Vec::new();
    for (name, config) in configs {
        let counters = Arc::new(SinkCounters::default());
        let (tx, rx) = mpsc::channel(config.queue_size.max(1));
        let task = spawn(
            name,
            config,
            rx,
            counters.clone(),
            nats,
            fleet_cluster,
            legacy,
        )?;
        info.push(SinkInfo {
            name: name.clone(),
            kind: config.kind(),
            counters: counters.clone(),
        });
        let strip = config
            .meta_as_tags
            .as_deref()
            .and_then(|keep| meta_tags::removed(plugin_meta, keep))
            .map(Arc::new);
        queues.push(Queue {
            tx,
            counters,
            strip,
        });
        tasks.push(task);
    }
    let task = tokio::spawn(async move {
        let _alive = alive;
        match router {
            Some(router) => fanout::fan_out_routed(batches, queues, router).await,
            None => fanout::fan_out(batches, queues).await,
        }
        for task in tasks {
            let _ = task.await;
        }
    });
    Ok(Sinks { info, task })
}

/// The `sinks` the agent runs: the configured ones, else the one the legacy `metrics`
/// section names (`nats` with a NATS section, else `stdout`).
pub(crate) fn effective(
    sinks: &BTreeMap<String, SinkConfig>,
    metrics: &super::MetricsConfig,
    has_nats: bool,
) -> Result<BTreeMap<String, SinkConfig>, AgentError> {
    if !sinks.is_empty() {
        if metrics.kind.is_some() || metrics.subject.is_some() {
            return Err(AgentError::Config(
                "give sinks or metrics, not both (sinks replaces metrics)".to_owned(),
            ));
        }
        return Ok(sinks.clone());
    }
    let config = match (metrics.kind, has_nats) {
        (Some(super::SinkKind::Stdout), _) | (None, false) => {
            SinkConfig::new(SinkSettings::Stdout(StdoutConfig::default()))
        }
        (_, true) => SinkConfig::new(SinkSettings::Nats(NatsConfig {
            subject: metrics.subject.clone(),
        })),
        (Some(super::SinkKind::Nats), false) => {
            return Err(AgentError::Config(
                "metrics.type is nats but there is no nats section".to_owned(),
            ));
        }
    };
    Ok(BTreeMap::from([(
        config.kind().as_str().to_owned(),
        config,
    )]))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: &str) -> Result<SinkConfig, String> {
        ccfleet::json_config::from_str::<BTreeMap<String, SinkConfig>>(json)
            .map(|mut m| m.remove("s").unwrap())
            .map_err(|e| e.to_string())
    }

    #[test]
    fn keys_of_another_type_unknown_types_and_missing_keys_are_refused_naming_sink_and_key() {
        let err = parse(r#"{"s": {"type":"nats","url":"http://x/api/write"}}"#).unwrap_err();
        assert!(err.starts_with("s: unknown field `url`"), "{err}");
        let err = parse(r#"{"s": {"type":"stdout","subject":"x"}}"#).unwrap_err();
        assert!(err.starts_with("s: unknown field `subject`"), "{err}");
        let err = parse(r#"{"s": {"type":"http"}}"#).unwrap_err();
        assert!(err.contains("missing field `url`"), "{err}");
        let err = parse(r#"{"s": {"type":"http","url":"http://x","batch-size":"x"}}"#).unwrap_err();
        assert!(err.starts_with("s: batch-size: invalid type"), "{err}");
        let err = parse(r#"{"s": {"type":"questdb"}}"#).unwrap_err();
        assert!(
            err.contains("unknown sink type questdb; one of http"),
            "{err}"
        );
        let err = parse(r#"{"s": {"queue-size": 3}}"#).unwrap_err();
        assert!(err.contains("missing field `type`"), "{err}");
        let small = parse(
            r#"{"s": {"type":"http","url":"http://x/api/write","batch-size":10,"retry-buffer":5}}"#,
        )
        .unwrap();
        assert!(
            small
                .validate("store")
                .unwrap_err()
                .contains("retry-buffer")
        );
    }

    #[test]
    fn the_shared_queue_size_is_read_beside_each_types_keys() {
        let nats = parse(r#"{"s": {"type":"nats","subject":"cc.x","queue-size":7}}"#).unwrap();
        assert_eq!(nats.queue_size, 7);
        assert_eq!(
            nats.settings,
            SinkSettings::Nats(NatsConfig {
                subject: Some("cc.x".to_owned())
            })
        );
        let stdout = parse(r#"{"s": {"type":"stdout"}}"#).unwrap();
        assert_eq!(stdout.queue_size, DEFAULT_QUEUE_SIZE);
        assert_eq!(stdout.kind(), SinkType::Stdout);
    }
}
