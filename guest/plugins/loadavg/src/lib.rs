//! Collector plugin: reads `/proc/loadavg` and emits `load_one`, `load_five` and
//! `load_fifteen` in cc-metric-store's shape (`value` field, tags `hostname`, `type=node` and,
//! when known, `cluster`).
//!
//! It reads through the agent's `cc:fleet/files` interface and needs no WASI: grant it
//! `"capabilities": {"read-files": ["/proc/loadavg", "/proc/sys/kernel/hostname"]}`. Its own
//! configuration (`init`) may set `hostname`, `cluster` and `path` (default `/proc/loadavg`);
//! without a hostname it reads `/proc/sys/kernel/hostname`. The service configuration may
//! carry `{"loadavg": {"tags": {"rack": "r1"}}}`: extra tags added to every point, applied
//! live.
#![no_std]

extern crate alloc;

use alloc::borrow::ToOwned;
use alloc::collections::BTreeMap;
use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;

use ccfleet_guest::{ConfigUpdate, FieldValue, Level, Plugin, Point, emit, log, read_to_string};
use serde_json::Value;

const METRICS: [&str; 3] = ["load_one", "load_five", "load_fifteen"];

struct LoadAvg {
    path: String,
    hostname: String,
    cluster: Option<String>,
    extra_tags: BTreeMap<String, String>,
}

fn string_key(object: &Value, key: &str) -> Result<Option<String>, String> {
    match object.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(format!("loadavg: `{key}` must be a string")),
    }
}

/// Parses the first three fields of `/proc/loadavg`.
fn parse_loadavg(text: &str) -> Result<[f64; 3], String> {
    let mut fields = text.split_ascii_whitespace();
    let mut out = [0.0; 3];
    for (slot, name) in out.iter_mut().zip(METRICS) {
        let raw = fields
            .next()
            .ok_or_else(|| format!("loadavg: missing {name} in {text:?}"))?;
        *slot = raw
            .parse()
            .map_err(|_| format!("loadavg: {name} is not a number: {raw:?}"))?;
    }
    Ok(out)
}

impl Plugin for LoadAvg {
    fn init(config: &str) -> Result<Self, String> {
        let config: Value =
            serde_json::from_str(config).map_err(|e| format!("loadavg: bad config: {e}"))?;
        let path = string_key(&config, "path")?.unwrap_or_else(|| "/proc/loadavg".to_owned());
        let hostname = match string_key(&config, "hostname")? {
            Some(name) => name,
            None => match read_to_string("/proc/sys/kernel/hostname") {
                Ok(name) => name.trim().to_owned(),
                Err(e) => {
                    log!(
                        Level::Warn,
                        "cannot read the hostname ({e}); using `localhost`"
                    );
                    "localhost".to_owned()
                }
            },
        };
        let cluster = string_key(&config, "cluster")?;
        log!(
            Level::Info,
            "loadavg ready: reading {path} as host {hostname}"
        );
        Ok(LoadAvg {
            path,
            hostname,
            cluster,
            extra_tags: BTreeMap::new(),
        })
    }

    fn on_config(&mut self, update: ConfigUpdate) -> Result<(), String> {
        let Some(text) = update.config else {
            return Ok(());
        };
        let config: Value = serde_json::from_str(&text)
            .map_err(|e| format!("loadavg: service config is not JSON: {e}"))?;
        let mut tags = BTreeMap::new();
        if let Some(Value::Object(extra)) = config.pointer("/loadavg/tags") {
            for (key, value) in extra {
                match value {
                    Value::String(s) => tags.insert(key.clone(), s.clone()),
                    other => tags.insert(key.clone(), other.to_string()),
                };
            }
        }
        if tags != self.extra_tags {
            let shown: Vec<String> = tags.iter().map(|(k, v)| format!("{k}={v}")).collect();
            log!(
                Level::Info,
                "config revision {}: extra tags [{}]",
                update.revision,
                shown.join(", ")
            );
            self.extra_tags = tags;
        }
        Ok(())
    }

    fn collect(&mut self, now_ns: i64) -> Result<(), String> {
        let text = read_to_string(&self.path)
            .map_err(|e| format!("loadavg: cannot read {}: {e}", self.path))?;
        let values = parse_loadavg(&text)?;
        let points: Vec<Point> = METRICS
            .iter()
            .zip(values)
            .map(|(name, value)| {
                let mut point = Point::new(*name)
                    .tag("hostname", self.hostname.as_str())
                    .tag("type", "node");
                if let Some(cluster) = &self.cluster {
                    point = point.tag("cluster", cluster.as_str());
                }
                for (key, value) in &self.extra_tags {
                    point = point.tag(key.as_str(), value.as_str());
                }
                point.field("value", FieldValue::Float(value)).at(now_ns)
            })
            .collect();
        emit(&points)
    }
}

ccfleet_guest::export_plugin!(LoadAvg);
