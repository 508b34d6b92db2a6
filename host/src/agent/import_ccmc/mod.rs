//! `ccfleet agent import-ccmc`: a ClusterCockpit `cc-metric-collector` configuration turned
//! into an agent configuration.
//!
//! The main file (`config.json`, in either of cc-metric-collector's forms: see [`source`])
//! and its `collectors`, `sinks`, `router` and `receivers` sections become the agent's
//! plugins (one per collector, with the grants it needs: [`collectors`]), sinks
//! ([`sinks`]) and router. What has no counterpart here (LIKWID, receivers, InfluxDB or
//! Ganglia sinks, ...) is named in [`Import::left_out`] with the reason; changes of form
//! that keep the meaning are named in [`Import::notes`].
//!
//! The fleet section cannot come from cc-metric-collector, which has no fleet: its URL is
//! given, and the cluster is given or read from the configuration (the router's
//! unconditional `cluster` tag, or an HTTP sink's `cluster=` parameter).

mod ceiling;
pub mod collectors;
pub mod sinks;
pub mod source;

use std::fmt;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value, json};

use super::router::{Router, RouterConfig};
use super::self_metrics::SelfConfig;

/// Where the agent's plugins are installed, unless told otherwise.
pub const DEFAULT_PLUGIN_DIR: &str = "/usr/local/lib/ccfleet/plugins";
/// cc-metric-collector's collect interval when its main file sets none.
const DEFAULT_INTERVAL: &str = "10s";

/// What the import is told besides the configuration.
#[derive(Debug, Clone)]
pub struct ImportOptions {
    /// The fleet server's URL (`fleet.url`).
    pub fleet_url: String,
    /// The cluster; read from the configuration when `None`.
    pub cluster: Option<String>,
    /// Where the plugins' components are installed.
    pub plugin_dir: PathBuf,
    /// Sections read from these files instead of those the main file names
    /// (`collectors`, `sinks`, `router`, `receivers`).
    pub overrides: Vec<(&'static str, PathBuf)>,
    /// The directory, relative to the written configuration, that secret files go to.
    pub secrets_dir: String,
}

/// A secret moved out of the configuration into a file of its own.
pub struct Secret {
    /// The file, relative to the written configuration's directory.
    pub path: PathBuf,
    /// What it holds.
    pub contents: String,
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Secret")
            .field("path", &self.path)
            .field("contents", &"<secret>")
            .finish()
    }
}

/// One thing the import reports: where in the configuration, and what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// The key, e.g. `collectors.likwid` or `sinks.nhrinflux`.
    pub at: String,
    /// Why it was left out, or what changed.
    pub reason: String,
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.at, self.reason)
    }
}

/// What the import left out and what it changed.
#[derive(Debug, Default)]
pub struct Findings {
    /// What has no counterpart in the agent.
    pub left_out: Vec<Finding>,
    /// Changes of form that keep the meaning, and settings that do not apply.
    pub notes: Vec<Finding>,
}

impl Findings {
    fn left_out(&mut self, at: &str, reason: &str) {
        self.left_out.push(Finding {
            at: at.to_owned(),
            reason: reason.to_owned(),
        });
    }

    fn note(&mut self, at: &str, reason: &str) {
        self.notes.push(Finding {
            at: at.to_owned(),
            reason: reason.to_owned(),
        });
    }
}

/// An imported configuration.
#[derive(Debug)]
pub struct Import {
    /// The agent configuration.
    pub config: Value,
    /// Files to write beside it (the sinks' JWTs).
    pub secrets: Vec<Secret>,
    /// What has no counterpart in the agent.
    pub left_out: Vec<Finding>,
    /// Changes of form that keep the meaning.
    pub notes: Vec<Finding>,
    /// The files read, by section.
    pub read: Vec<(&'static str, PathBuf)>,
}

/// Why a configuration could not be imported at all.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    /// A file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A file is not the JSON it should be.
    #[error("{path}: {reason}")]
    Json {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A section's file was not found.
    #[error("{}", missing_message(section, tried, variants))]
    Missing {
        /// The section.
        section: String,
        /// The files looked for.
        tried: Vec<PathBuf>,
        /// `<section>.*.json` files that exist.
        variants: Vec<String>,
    },
    /// No cluster was given or found.
    #[error(
        "no cluster: the configuration tags no `cluster` for every metric (router add_tags) and no http sink names one (?cluster=); give --cluster NAME"
    )]
    NoCluster,
}

fn missing_message(section: &str, tried: &[PathBuf], variants: &[String]) -> String {
    let tried: Vec<String> = tried.iter().map(|p| p.display().to_string()).collect();
    let mut message = format!(
        "the {section} file was not found (looked for {})",
        tried.join(", ")
    );
    if !variants.is_empty() {
        message.push_str(&format!(
            "; the directory has {}: choose one with --{section} FILE",
            variants.join(", ")
        ));
    }
    message
}

/// `object`, `array`, ... for error messages.
pub(crate) fn json_kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// The cluster the configuration names: an unconditional `cluster` tag of the router, else
/// the `cluster` parameter of an HTTP sink's URL.
fn cluster_of(source: &source::Source) -> Option<String> {
    let from_router = source
        .router
        .as_ref()
        .and_then(|r| r.get("add_tags"))
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .find(|rule| {
            rule.get("key").and_then(Value::as_str) == Some("cluster")
                && matches!(rule.get("if").and_then(Value::as_str), Some("*" | "true"))
        })
        .and_then(|rule| rule.get("value").and_then(Value::as_str))
        .filter(|v| !v.is_empty())
        .map(str::to_owned);
    from_router.or_else(|| {
        source.sinks.values().find_map(|sink| {
            let url = sink.get("url").and_then(Value::as_str)?;
            let url = reqwest::Url::parse(url).ok()?;
            url.query_pairs()
                .find(|(k, v)| k == "cluster" && !v.is_empty())
                .map(|(_, v)| v.into_owned())
        })
    })
}

/// Router keys NHR@FAU's configurations carry that cc-metric-collector's router does not
/// know; versions that ignored unknown keys ignored these, so leaving them out keeps the
/// meaning.
const IGNORED_ROUTER_KEYS: [(&str, &str); 1] = [(
    "normalize_metrics",
    "not an option of cc-metric-collector's router (which ignored it, or refuses it since it checks keys): left out; `normalize_units` is the option that normalizes units",
)];

fn router_section(
    router: Option<Map<String, Value>>,
    interval: &str,
    findings: &mut Findings,
) -> Option<Value> {
    let mut router = router?;
    for (key, reason) in IGNORED_ROUTER_KEYS {
        if router.remove(key).is_some() {
            findings.note(&format!("router.{key}"), reason);
        }
    }
    if router.is_empty() {
        return None;
    }
    router.entry("interval").or_insert_with(|| json!(interval));
    let value = Value::Object(router);
    let checked = serde_json::from_value::<RouterConfig>(value.clone())
        .map_err(|e| e.to_string())
        .and_then(|config| Router::new(&config, "localhost").map(|_| ()));
    match checked {
        Ok(()) => Some(value),
        Err(e) => {
            findings.left_out("router", &format!("the agent's router refuses it: {e}"));
            None
        }
    }
}

/// Imports the configuration at `input` (a directory holding `config.json`, or the main
/// file itself).
pub fn import(input: &Path, options: &ImportOptions) -> Result<Import, ImportError> {
    let source = source::read(input, &options.overrides)?;
    let mut findings = Findings::default();
    let cluster = match &options.cluster {
        Some(c) => c.clone(),
        None => cluster_of(&source).ok_or(ImportError::NoCluster)?,
    };
    let interval = match &source.interval {
        Some(i) => i.clone(),
        None => {
            findings.note(
                "interval",
                &format!("not set: the plugins collect every {DEFAULT_INTERVAL}"),
            );
            DEFAULT_INTERVAL.to_owned()
        }
    };
    if ccfleet::duration::parse(&interval).is_err() {
        return Err(ImportError::Json {
            path: source.main_file.clone(),
            reason: format!("`interval` {interval:?} is not a duration such as \"10s\""),
        });
    }
    for key in &source.other_keys {
        findings.note(key, "not a key cc-metric-collector reads: left out");
    }

    let mut converted = sinks::convert(&source.sinks, &options.secrets_dir, &mut findings);
    let meta_as_tags = sinks::share_meta_as_tags(&mut converted);

    let mut plugins = Vec::new();
    let mut self_section = None;
    for (name, value) in &source.collectors {
        let at = format!("collectors.{name}");
        let Value::Object(config) = value else {
            findings.left_out(&at, "a collector's settings must be a JSON object");
            continue;
        };
        let mut config = config.clone();
        let (run, changes) = collectors::translate(name, &mut config);
        for (key, change) in changes {
            let at = format!("{at}.{key}");
            match change {
                collectors::Change::Note(reason) => findings.note(&at, &reason),
                collectors::Change::LeftOut(reason) => findings.left_out(&at, &reason),
            }
        }
        let config = &config;
        match collectors::plan(name, config, run) {
            collectors::Plan::Unsupported(reason) => findings.left_out(&at, reason),
            collectors::Plan::SelfSection => {
                let mut section = config.clone();
                section.entry("interval").or_insert_with(|| json!(interval));
                match serde_json::from_value::<SelfConfig>(Value::Object(section.clone())) {
                    Ok(_) => self_section = Some(Value::Object(section)),
                    Err(e) => {
                        findings.left_out(&at, &format!("the agent's self section refuses it: {e}"))
                    }
                }
            }
            collectors::Plan::Plugin { capabilities } => {
                let mut config = config.clone();
                if name == "likwid" {
                    let duration = source.duration.as_deref();
                    for (key, change) in collectors::likwid_settings(&mut config, duration) {
                        if let collectors::Change::Note(reason) = change {
                            findings.note(&format!("{at}.{key}"), &reason);
                        }
                    }
                }
                if let Some(tags) = &meta_as_tags
                    && !config.contains_key("meta_as_tags")
                    && tags.as_slice() != ["unit"]
                {
                    config.insert("meta_as_tags".into(), json!(tags));
                }
                let text = Value::Object(config.clone()).to_string();
                if let Some(Err(e)) = collectors::check(name, &text) {
                    findings.left_out(&at, &format!("the plugin refuses its settings: {e}"));
                    continue;
                }
                plugins.push(json!({
                    "name": name,
                    "path": options.plugin_dir.join(format!("{name}.wasm")),
                    "collect-interval": interval,
                    "config": config,
                    "capabilities": capabilities,
                }));
            }
        }
    }
    if source.collectors.contains_key("likwid")
        && let Some(duration) = &source.duration
    {
        findings.note(
            "duration",
            &format!("{duration}: the measurement time of likwid, its plugin's `duration`"),
        );
    }
    for name in source.receivers.keys() {
        findings.left_out(
            &format!("receivers.{name}"),
            "the agent receives no metrics from other processes; they can send to cc-metric-store or NATS themselves",
        );
    }
    let router = router_section(source.router, &interval, &mut findings);

    let mut config = Map::new();
    config.insert("service-type".into(), json!("ccmc"));
    config.insert(
        "fleet".into(),
        json!({"url": options.fleet_url, "cluster": cluster}),
    );
    if let Some(nats) = converted.nats {
        config.insert("nats".into(), nats);
    }
    if converted.sinks.is_empty() {
        findings.note(
            "sinks",
            "no sink carried over: the agent writes metrics to standard output",
        );
        config.insert("metrics".into(), json!({"type": "stdout"}));
    } else {
        config.insert("sinks".into(), Value::Object(converted.sinks));
    }
    if !plugins.is_empty() {
        // The same collectors may then come from the fleet: the node grants what they need.
        let grants = plugins.iter().filter_map(|p| p.get("capabilities"));
        config.insert("fleet-ceiling".into(), ceiling::covering(grants));
    }
    config.insert("plugins".into(), Value::Array(plugins));
    if let Some(section) = self_section {
        config.insert("self".into(), section);
    }
    if let Some(router) = router {
        config.insert("router".into(), router);
    }
    let read = source
        .origins
        .iter()
        .filter_map(|(section, origin)| match origin {
            source::Origin::File(path) => Some((*section, path.clone())),
            _ => None,
        })
        .chain(std::iter::once(("main", source.main_file.clone())))
        .collect();
    Ok(Import {
        config: Value::Object(config),
        secrets: converted.secrets,
        left_out: findings.left_out,
        notes: findings.notes,
        read,
    })
}

#[cfg(test)]
mod tests;
