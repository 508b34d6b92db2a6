//! How a plugin is declared in the agent configuration (one entry of its `plugins` list).
//!
//! ```json
//! {
//!   "name": "loadavg",
//!   "path": "guest/target/components/loadavg.wasm",
//!   "config": {"cluster": "fritz"},
//!   "collect-interval": "10s",
//!   "limits": {"memory-mb": 32, "call-timeout": "500ms"},
//!   "capabilities": {
//!     "read-files": ["/proc/loadavg", "/proc/sys/kernel/hostname"],
//!     "run": {"sensors": {"path": "/usr/bin/ipmitool", "args": ["sensor"], "timeout": "3s"}}
//!   }
//! }
//! ```

use std::path::{Path, PathBuf};
use std::time::Duration;

use ccfleet::duration::serde_go;
use serde::{Deserialize, Serialize};

pub use super::capabilities::Capabilities;
use crate::plugin::HostError;

/// One plugin of the agent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct PluginSpec {
    /// The name used in logs and events; defaults to the file's stem.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The component file (`.wasm`). It is watched and reloaded when it changes.
    pub path: PathBuf,
    /// The plugin's own configuration, handed to its `init` as JSON text.
    #[serde(default = "empty_object")]
    pub config: serde_json::Value,
    /// How often `collect` is called; never when absent.
    #[serde(
        default,
        with = "optional_go_duration",
        skip_serializing_if = "Option::is_none"
    )]
    #[cfg_attr(feature = "schema", schemars(with = "Option<String>"))]
    pub collect_interval: Option<Duration>,
    /// Resource limits.
    #[serde(default)]
    pub limits: Limits,
    /// Granted capabilities beyond the `cc:fleet/host` interface.
    #[serde(default)]
    pub capabilities: Capabilities,
}

fn empty_object() -> serde_json::Value {
    serde_json::Value::Object(serde_json::Map::new())
}

impl PluginSpec {
    /// A specification with default limits, no capabilities and no collect interval.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        PluginSpec {
            name: None,
            path: path.into(),
            config: empty_object(),
            collect_interval: None,
            limits: Limits::default(),
            capabilities: Capabilities::default(),
        }
    }

    /// The plugin's name: `name`, or the file stem of `path`.
    pub fn display_name(&self) -> String {
        match &self.name {
            Some(name) => name.clone(),
            None => self
                .path
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_else(|| "plugin".to_owned()),
        }
    }

    /// Checks the specification for contradictions.
    pub fn validate(&self) -> Result<(), HostError> {
        let fail = |reason: String| {
            Err(HostError::Spec {
                plugin: self.display_name(),
                reason,
            })
        };
        if let Err(reason) = self.capabilities.validate() {
            return fail(reason);
        }
        if self.collect_interval == Some(Duration::ZERO) {
            return fail("collect-interval must be positive".to_owned());
        }
        let l = &self.limits;
        if l.memory_mb == 0
            || l.max_points == 0
            || l.max_emit_bytes == 0
            || l.max_line_bytes == 0
            || l.max_fields == 0
            || l.log_burst == 0
        {
            return fail("limits must be positive".to_owned());
        }
        if l.call_timeout.is_zero() {
            return fail("limits.call-timeout must be positive".to_owned());
        }
        Ok(())
    }

    /// Resolves a relative `path` against `base` (the directory of the agent configuration).
    pub fn resolve_path(&mut self, base: &Path) {
        if self.path.is_relative() {
            self.path = base.join(&self.path);
        }
    }
}

/// Per-plugin resource limits.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct Limits {
    /// Linear memory, summed over the component's memories, in MiB.
    pub memory_mb: u32,
    /// CPU deadline of one call into the plugin (epoch interruption), also bounding the
    /// call's wall-clock time.
    #[serde(with = "serde_go")]
    #[cfg_attr(feature = "schema", schemars(with = "String"))]
    pub call_timeout: Duration,
    /// The most points one `emit` call may carry.
    pub max_points: u32,
    /// The most line-protocol bytes one `emit` call may produce (for `emit-lines`: the bytes
    /// the plugin hands over); copying a typed batch to the host may allocate twice this
    /// before the batch is refused.
    pub max_emit_bytes: u32,
    /// The most bytes of one emitted line (one point, without its newline).
    pub max_line_bytes: u32,
    /// The most tags of one emitted point.
    pub max_tags: u32,
    /// The most fields of one emitted point.
    pub max_fields: u32,
    /// The most bytes one `cc:fleet/files` read returns.
    pub max_file_bytes: u32,
    /// Log lines (and logged call errors) a plugin may write per second on average; the
    /// rest are dropped and counted.
    pub log_lines_per_second: u32,
    /// Log lines a plugin may write in a burst above its rate.
    pub log_burst: u32,
    /// Restarts allowed before the plugin is quarantined until its file changes.
    pub restart_budget: u32,
    /// Delay before the first restart; it doubles with each further restart.
    #[serde(with = "serde_go")]
    #[cfg_attr(feature = "schema", schemars(with = "String"))]
    pub restart_backoff: Duration,
    /// The longest delay between restarts.
    #[serde(with = "serde_go")]
    #[cfg_attr(feature = "schema", schemars(with = "String"))]
    pub max_restart_backoff: Duration,
    /// A plugin that has run this long without failing gets its restart budget back.
    #[serde(with = "serde_go")]
    #[cfg_attr(feature = "schema", schemars(with = "String"))]
    pub healthy_period: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            memory_mb: 64,
            call_timeout: Duration::from_secs(1),
            max_points: 10_000,
            max_emit_bytes: 4 << 20,
            max_line_bytes: 1 << 20,
            max_tags: 64,
            max_fields: 1024,
            max_file_bytes: 4 << 20,
            log_lines_per_second: 20,
            log_burst: 200,
            restart_budget: 5,
            restart_backoff: Duration::from_millis(500),
            max_restart_backoff: Duration::from_secs(30),
            healthy_period: Duration::from_secs(60),
        }
    }
}

impl Limits {
    /// The memory limit in bytes.
    pub fn memory_bytes(&self) -> usize {
        (self.memory_mb as usize) << 20
    }

    /// What one emitted batch may hold.
    pub fn batch_limits(&self) -> ccfleet::lineproto::BatchLimits {
        ccfleet::lineproto::BatchLimits {
            max_points: self.max_points as usize,
            max_bytes: self.max_emit_bytes as usize,
            max_line_len: self.max_line_bytes as usize,
            max_tags: self.max_tags as usize,
            max_fields: self.max_fields as usize,
        }
    }
}

mod optional_go_duration {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        match Option::<String>::deserialize(d)? {
            None => Ok(None),
            Some(s) => ccfleet::duration::parse(&s)
                .map(Some)
                .map_err(serde::de::Error::custom),
        }
    }

    pub fn serialize<S: Serializer>(v: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(d) => s.collect_str(&ccfleet::duration::format(*d)),
            None => s.serialize_none(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_full_entry() {
        let spec: PluginSpec = serde_json::from_str(
            r#"{"name":"l","path":"p.wasm","config":{"a":1},"collect-interval":"10s",
                "limits":{"memory-mb":8,"call-timeout":"250ms"},
                "capabilities":{"wasi":true,"read-dirs":["/var/lib/data"],
                                "read-files":["/proc/loadavg","/sys/class/hwmon/**"]}}"#,
        )
        .unwrap();
        assert_eq!(spec.collect_interval, Some(Duration::from_secs(10)));
        assert_eq!(spec.limits.memory_bytes(), 8 << 20);
        assert_eq!(spec.limits.call_timeout, Duration::from_millis(250));
        assert_eq!(spec.limits.max_points, Limits::default().max_points);
        assert!(spec.capabilities.wasi);
        spec.validate().unwrap();
    }

    #[test]
    fn rejects_unknown_keys_and_ungranted_dirs() {
        assert!(serde_json::from_str::<PluginSpec>(r#"{"path":"p","colour":1}"#).is_err());
        let spec: PluginSpec =
            serde_json::from_str(r#"{"path":"p","capabilities":{"read-dirs":["/data"]}}"#).unwrap();
        let err = spec.validate().unwrap_err().to_string();
        assert!(err.contains("needs capabilities.wasi"), "{err}");
    }

    #[test]
    fn granted_commands_parse_and_a_relative_one_is_refused() {
        let spec: PluginSpec = serde_json::from_str(
            r#"{"path":"p.wasm","capabilities":{"run":{
                "sensors":{"path":"/usr/bin/ipmitool","args":["sensor"],"user":"nobody",
                           "timeout":"2s","max-output-bytes":65536}}}}"#,
        )
        .unwrap();
        spec.validate().unwrap();
        let sensors = &spec.capabilities.run["sensors"];
        assert_eq!(sensors.args, ["sensor"]);
        assert_eq!(sensors.timeout, Duration::from_secs(2));
        assert_eq!(sensors.max_output_bytes, 65536);
        let spec: PluginSpec = serde_json::from_str(
            r#"{"path":"p.wasm","capabilities":{"run":{"x":{"path":"ipmitool"}}}}"#,
        )
        .unwrap();
        let err = spec.validate().unwrap_err().to_string();
        assert!(
            err.contains("capabilities.run.x: path ipmitool must be an absolute path"),
            "{err}"
        );
    }

    #[test]
    fn name_defaults_to_the_file_stem() {
        assert_eq!(
            PluginSpec::new("/x/roster-logger.wasm").display_name(),
            "roster-logger"
        );
    }
}
