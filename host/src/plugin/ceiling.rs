//! The node's ceiling on what the fleet may grant a plugin: `fleet-ceiling` in the agent's
//! own configuration, which only the node's administrator writes.
//!
//! ```json
//! {"fleet-ceiling": {
//!   "read-files": ["/proc/**", "/sys/**"],
//!   "mount-info": true,
//!   "run": {"ipmi-sensors": {"path": "/usr/bin/ipmitool", "args": ["sensor"], "timeout": "5s"}},
//!   "nvml": true,
//!   "nvml-library": "/opt/nvidia/lib/libnvidia-ml.so.1",
//!   "limits": {"memory-mb": 128},
//!   "min-collect-interval": "1s",
//!   "max-plugins": 16,
//!   "max-stored-mb": 1024
//! }}
//! ```
//!
//! The section has the shape of a plugin's `capabilities` plus the largest `limits` and
//! three figures of the rollout. A fleet plugin entry is checked against it with
//! [`Capabilities::within`] and [`Ceiling::admits_limits`]: every grant must lie within the
//! ceiling, or the entry is refused whole ([`Escalation`]); nothing is trimmed, so a plugin
//! never runs with less than it was written for without anyone noticing. The grant a
//! refused plugin asked for is named, never a secret of the node.
//!
//! Without the section the ceiling is [`Ceiling::default`]: files of `/proc` (never the
//! per-process entries, which are refused to every plugin anyway) and `/sys`, the mount
//! table, and the agent's default limits; no commands, no native library, no WASI, no
//! `files-root`. The agent's own plugins, configured by path, are the node administrator's
//! and are not held to it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use ccfleet::duration::serde_go;
use serde::{Deserialize, Serialize};

use super::capabilities::Capabilities;
use super::files::{Pattern, glob};
use super::spec::Limits;

/// The default least `collect-interval` of a fleet plugin.
pub const DEFAULT_MIN_COLLECT_INTERVAL: Duration = Duration::from_millis(100);
/// The default most plugins the fleet may name.
pub const DEFAULT_MAX_PLUGINS: usize = 32;
/// The default most MiB kept in `fleet-plugin-dir`.
pub const DEFAULT_MAX_STORED_MB: u64 = 1024;

/// A grant beyond the node's ceiling: the entry asking for it is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{grant} is beyond this node's fleet-ceiling")]
pub struct Escalation {
    /// The grant, as a key path with what was asked and what the node allows (fleet text,
    /// to be shown through [`ccfleet::untrusted::Untrusted`]).
    pub grant: String,
}

impl Escalation {
    /// The reason an agent reports to the server for this refusal
    /// ([`ccfleet::wire::ReportedPlugin::why`]): `beyond_ceiling/` and the key of the grant
    /// (`capabilities.run`, `limits.memory-mb`, `collect-interval`, `max-plugins`, ...), never
    /// what the fleet asked for (a command or file name is the fleet's own text) nor what
    /// the node allows.
    pub fn reason(&self) -> String {
        let key = self.grant.split_whitespace().next().unwrap_or_default();
        let key = if key.starts_with("plugins[") {
            "max-plugins"
        } else if key.starts_with("capabilities.run.") {
            "capabilities.run"
        } else {
            key
        };
        let key: String = key
            .chars()
            .take(ccfleet::wire::MAX_REASON_LEN - "beyond_ceiling/".len())
            .map(|c| {
                if c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.') {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        if key.is_empty() {
            "beyond_ceiling".to_owned()
        } else {
            format!("beyond_ceiling/{key}")
        }
    }
}

fn escalation(grant: impl Into<String>) -> Escalation {
    Escalation {
        grant: grant.into(),
    }
}

/// What the fleet may grant its plugins on this node.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "kebab-case")]
pub struct Ceiling {
    /// The widest capabilities; `run` defines the commands the fleet may name.
    #[serde(flatten)]
    pub capabilities: Capabilities,
    /// The largest limits; for `restart-backoff`, `max-restart-backoff` and `healthy-period`
    /// (where less is more) the least.
    pub limits: Limits,
    /// The shortest `collect-interval`.
    #[serde(with = "serde_go")]
    #[cfg_attr(feature = "schema", schemars(with = "String"))]
    pub min_collect_interval: Duration,
    /// The most plugins the fleet may name.
    pub max_plugins: usize,
    /// The most MiB of components kept in `fleet-plugin-dir`.
    pub max_stored_mb: u64,
}

impl Default for Ceiling {
    fn default() -> Self {
        Ceiling {
            capabilities: Capabilities {
                read_files: vec!["/proc/**".to_owned(), "/sys/**".to_owned()],
                mount_info: true,
                ..Capabilities::default()
            },
            limits: Limits::default(),
            min_collect_interval: DEFAULT_MIN_COLLECT_INTERVAL,
            max_plugins: DEFAULT_MAX_PLUGINS,
            max_stored_mb: DEFAULT_MAX_STORED_MB,
        }
    }
}

/// The keys of a ceiling beside those of `capabilities`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct Extras {
    #[serde(default)]
    limits: Limits,
    #[serde(default = "default_min_interval", with = "serde_go")]
    min_collect_interval: Duration,
    #[serde(default = "default_max_plugins")]
    max_plugins: usize,
    #[serde(default = "default_max_stored")]
    max_stored_mb: u64,
}

fn default_min_interval() -> Duration {
    DEFAULT_MIN_COLLECT_INTERVAL
}
fn default_max_plugins() -> usize {
    DEFAULT_MAX_PLUGINS
}
fn default_max_stored() -> u64 {
    DEFAULT_MAX_STORED_MB
}

const EXTRA_KEYS: [&str; 4] = [
    "limits",
    "min-collect-interval",
    "max-plugins",
    "max-stored-mb",
];

impl<'de> Deserialize<'de> for Ceiling {
    // `flatten` and `deny_unknown_fields` do not combine in serde: the section is split by
    // hand, so a misspelt key is still an error naming it.
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let value = serde_json::Value::deserialize(d)?;
        let serde_json::Value::Object(mut all) = value else {
            return Err(D::Error::custom("fleet-ceiling must be an object"));
        };
        let mut extras = serde_json::Map::new();
        for key in EXTRA_KEYS {
            if let Some(v) = all.remove(key) {
                extras.insert(key.to_owned(), v);
            }
        }
        let capabilities: Capabilities =
            serde_json::from_value(serde_json::Value::Object(all)).map_err(D::Error::custom)?;
        let extras: Extras =
            serde_json::from_value(serde_json::Value::Object(extras)).map_err(D::Error::custom)?;
        Ok(Ceiling {
            capabilities,
            limits: extras.limits,
            min_collect_interval: extras.min_collect_interval,
            max_plugins: extras.max_plugins,
            max_stored_mb: extras.max_stored_mb,
        })
    }
}

impl Ceiling {
    /// Checks the ceiling as the grants of a plugin are checked.
    pub fn validate(&self) -> Result<(), String> {
        self.capabilities
            .validate()
            .map_err(|e| e.replace("capabilities.", "fleet-ceiling."))
    }

    /// The most bytes kept in `fleet-plugin-dir`.
    pub fn max_stored_bytes(&self) -> u64 {
        self.max_stored_mb.saturating_mul(1 << 20)
    }

    /// Whether `limits` lie within the ceiling's.
    pub fn admits_limits(&self, limits: &Limits) -> Result<(), Escalation> {
        let top = &self.limits;
        let at_most = |key: &str, got: u64, max: u64| {
            if got > max {
                Err(escalation(format!(
                    "limits.{key} {got} (this node allows at most {max})"
                )))
            } else {
                Ok(())
            }
        };
        let time = |d: Duration| ccfleet::duration::format(d);
        let no_longer = |key: &str, got: Duration, max: Duration| {
            if got > max {
                Err(escalation(format!(
                    "limits.{key} {} (this node allows at most {})",
                    time(got),
                    time(max)
                )))
            } else {
                Ok(())
            }
        };
        let no_shorter = |key: &str, got: Duration, min: Duration| {
            if got < min {
                Err(escalation(format!(
                    "limits.{key} {} (this node allows no less than {})",
                    time(got),
                    time(min)
                )))
            } else {
                Ok(())
            }
        };
        // Exhaustive on purpose: a new limit does not compile until it is placed here.
        let Limits {
            memory_mb,
            call_timeout,
            max_points,
            max_emit_bytes,
            max_line_bytes,
            max_tags,
            max_fields,
            max_file_bytes,
            log_lines_per_second,
            log_burst,
            restart_budget,
            restart_backoff,
            max_restart_backoff,
            healthy_period,
        } = limits;
        at_most("memory-mb", (*memory_mb).into(), top.memory_mb.into())?;
        no_longer("call-timeout", *call_timeout, top.call_timeout)?;
        at_most("max-points", (*max_points).into(), top.max_points.into())?;
        at_most(
            "max-emit-bytes",
            (*max_emit_bytes).into(),
            top.max_emit_bytes.into(),
        )?;
        at_most(
            "max-line-bytes",
            (*max_line_bytes).into(),
            top.max_line_bytes.into(),
        )?;
        at_most("max-tags", (*max_tags).into(), top.max_tags.into())?;
        at_most("max-fields", (*max_fields).into(), top.max_fields.into())?;
        at_most(
            "max-file-bytes",
            (*max_file_bytes).into(),
            top.max_file_bytes.into(),
        )?;
        at_most(
            "log-lines-per-second",
            (*log_lines_per_second).into(),
            top.log_lines_per_second.into(),
        )?;
        at_most("log-burst", (*log_burst).into(), top.log_burst.into())?;
        at_most(
            "restart-budget",
            (*restart_budget).into(),
            top.restart_budget.into(),
        )?;
        no_shorter("restart-backoff", *restart_backoff, top.restart_backoff)?;
        no_shorter(
            "max-restart-backoff",
            *max_restart_backoff,
            top.max_restart_backoff,
        )?;
        no_shorter("healthy-period", *healthy_period, top.healthy_period)?;
        Ok(())
    }

    /// Whether a fleet plugin may be collected every `interval`.
    pub fn admits_interval(&self, interval: Option<Duration>) -> Result<(), Escalation> {
        match interval {
            Some(every) if every < self.min_collect_interval => Err(escalation(format!(
                "collect-interval {} (this node allows no less than {})",
                ccfleet::duration::format(every),
                ccfleet::duration::format(self.min_collect_interval)
            ))),
            _ => Ok(()),
        }
    }
}

/// The capability keys [`Capabilities::within`] checks one by one; any other key the fleet
/// sets is a flag that needs the ceiling's, or is refused.
const KNOWN_KEYS: [&str; 12] = [
    "wasi",
    "read-dirs",
    "read-files",
    "files-root",
    "mount-info",
    "run",
    "nvml",
    "nvml-library",
    "likwid",
    "likwid-library",
    "rocm-smi",
    "rocm-smi-library",
];

impl Capabilities {
    /// Whether these grants (a fleet plugin's) lie within `ceiling` (the node's): a flag
    /// needs the ceiling's flag; a `read-files` entry a ceiling pattern matching every path
    /// it matches (and a system secret named outright, the same name in the ceiling); a
    /// `read-dirs` entry a ceiling directory holding it; a `run` entry the same-named
    /// command of the ceiling, exactly as the node defines it; `files-root` the ceiling's
    /// own. Native libraries are never the fleet's to name. A key this check does not know
    /// is refused unless it is a flag the ceiling sets too.
    pub fn within(&self, ceiling: &Capabilities) -> Result<(), Escalation> {
        flag("wasi", self.wasi, ceiling.wasi)?;
        flag("mount-info", self.mount_info, ceiling.mount_info)?;
        flag("nvml", self.nvml, ceiling.nvml)?;
        flag("likwid", self.likwid, ceiling.likwid)?;
        flag("rocm-smi", self.rocm_smi, ceiling.rocm_smi)?;
        for native in self.native_libraries() {
            if let Some(library) = native.library {
                return Err(escalation(format!(
                    "capabilities.{} {} (native libraries come only from the node's own \
                     configuration)",
                    native.key,
                    library.display()
                )));
            }
        }
        for dir in &self.read_dirs {
            if !ceiling.read_dirs.iter().any(|top| dir_within(dir, top)) {
                return Err(escalation(format!(
                    "capabilities.read-dirs entry {}",
                    dir.display()
                )));
            }
        }
        for entry in &self.read_files {
            let secret = super::secrets::names_system_secret(entry);
            let covered = if secret {
                ceiling.read_files.iter().any(|top| top == entry)
            } else {
                ceiling
                    .read_files
                    .iter()
                    .any(|top| pattern_covers(top, entry))
            };
            if !covered {
                return Err(escalation(format!("capabilities.read-files entry {entry}")));
            }
        }
        if let Some(root) = &self.files_root
            && ceiling.files_root.as_ref() != Some(root)
        {
            return Err(escalation(format!(
                "capabilities.files-root {}",
                root.display()
            )));
        }
        for (name, grant) in &self.run {
            match ceiling.run.get(name) {
                Some(defined) if defined == grant => {}
                Some(_) => {
                    return Err(escalation(format!(
                        "capabilities.run.{name} with a definition of its own (the fleet \
                         names a command; its path, arguments and user are the node's)"
                    )));
                }
                None => return Err(escalation(format!("capabilities.run.{name}"))),
            }
        }
        unknown_keys(self, ceiling)
    }
}

fn flag(key: &str, asked: bool, allowed: bool) -> Result<(), Escalation> {
    if asked && !allowed {
        return Err(escalation(format!("capabilities.{key}")));
    }
    Ok(())
}

/// Grants added to [`Capabilities`] after this check was written: a flag needs the
/// ceiling's, anything else is refused until a rule for it is written here.
fn unknown_keys(asked: &Capabilities, ceiling: &Capabilities) -> Result<(), Escalation> {
    let (Ok(serde_json::Value::Object(asked)), Ok(serde_json::Value::Object(top))) =
        (serde_json::to_value(asked), serde_json::to_value(ceiling))
    else {
        return Err(escalation("capabilities (not readable as an object)"));
    };
    for (key, value) in asked {
        if KNOWN_KEYS.contains(&key.as_str()) {
            continue;
        }
        let granted = match value {
            serde_json::Value::Null | serde_json::Value::Bool(false) => true,
            serde_json::Value::Array(a) if a.is_empty() => true,
            serde_json::Value::Object(o) if o.is_empty() => true,
            serde_json::Value::Bool(true) => top.get(&key) == Some(&serde_json::Value::Bool(true)),
            _ => false,
        };
        if !granted {
            return Err(escalation(format!("capabilities.{key}")));
        }
    }
    Ok(())
}

/// Whether `dir` is `top` or lies below it, on the host as it is now when both exist (a
/// link below `top` may lead anywhere), else by name.
fn dir_within(dir: &Path, top: &Path) -> bool {
    let real = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
    let (dir, top): (PathBuf, PathBuf) = (real(dir), real(top));
    dir.starts_with(&top)
}

/// The components of a pattern that parses, `None` for one that does not.
fn pattern_parts(text: &str) -> Option<Vec<&str>> {
    Pattern::parse(text).ok()?;
    Some(text.split('/').filter(|n| !n.is_empty()).collect())
}

/// Whether the pattern `top` matches every path `asked` matches. Sound, not complete: a
/// pair it cannot decide counts as not covered, so the entry is refused, never widened.
pub fn pattern_covers(top: &str, asked: &str) -> bool {
    match (pattern_parts(top), pattern_parts(asked)) {
        (Some(top), Some(asked)) => covers(&top, &asked),
        _ => false,
    }
}

fn covers(top: &[&str], asked: &[&str]) -> bool {
    match (top.split_first(), asked.split_first()) {
        (None, None) => true,
        (Some((&"**", rest)), _) => {
            covers(rest, asked)
                || asked
                    .split_first()
                    .is_some_and(|(_, tail)| covers(top, tail))
        }
        (Some((name, rest)), Some((head, tail))) => {
            *head != "**" && name_covers(name, head) && covers(rest, tail)
        }
        _ => false,
    }
}

/// Whether the name pattern `top` matches every name `asked` matches.
fn name_covers(top: &str, asked: &str) -> bool {
    if !asked.contains('*') {
        return glob(top, asked);
    }
    top == "*" || top == asked
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plugin::commands::RunGrant;

    fn caps(json: serde_json::Value) -> Capabilities {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn a_refusal_is_reported_by_the_key_of_its_grant_never_by_the_fleets_text() {
        let top = Ceiling::default();
        let reason =
            |json: serde_json::Value| caps(json).within(&top.capabilities).unwrap_err().reason();
        assert_eq!(
            reason(serde_json::json!({"run": {"pwn": {"path": "/bin/sh"}}})),
            "beyond_ceiling/capabilities.run"
        );
        assert_eq!(
            reason(serde_json::json!({"read-files": ["/etc/shadow"]})),
            "beyond_ceiling/capabilities.read-files"
        );
        assert_eq!(
            reason(serde_json::json!({"nvml": true})),
            "beyond_ceiling/capabilities.nvml"
        );
        let limits = Limits {
            memory_mb: top.limits.memory_mb + 1,
            ..top.limits.clone()
        };
        assert_eq!(
            top.admits_limits(&limits).unwrap_err().reason(),
            "beyond_ceiling/limits.memory-mb"
        );
        assert_eq!(
            top.admits_interval(Some(Duration::from_millis(1)))
                .unwrap_err()
                .reason(),
            "beyond_ceiling/collect-interval"
        );
        for (grant, expected) in [
            (
                "plugins[40] (this node runs at most 32 fleet plugins)",
                "beyond_ceiling/max-plugins",
            ),
            ("capabilities.<x y>", "beyond_ceiling/capabilities._x"),
            ("", "beyond_ceiling"),
        ] {
            let reason = escalation(grant).reason();
            assert_eq!(reason, expected);
            assert!(ccfleet::wire::valid_reason(&reason), "{reason}");
        }
        let long = escalation(format!("capabilities.{}", "k".repeat(200))).reason();
        assert!(ccfleet::wire::valid_reason(&long), "{long}");
    }

    #[test]
    fn the_default_ceiling_admits_proc_sys_and_mount_info_only() {
        let top = Ceiling::default();
        let ok = caps(
            serde_json::json!({"read-files": ["/proc/loadavg", "/sys/class/hwmon/**",
                                                         "/proc/*/stat"], "mount-info": true}),
        );
        ok.within(&top.capabilities).unwrap();
        for (asked, grant) in [
            (serde_json::json!({"wasi": true}), "capabilities.wasi"),
            (
                serde_json::json!({"read-files": ["/etc/hostname"]}),
                "read-files entry /etc/hostname",
            ),
            (
                serde_json::json!({"read-files": ["/**"]}),
                "read-files entry /**",
            ),
            (serde_json::json!({"nvml": true}), "capabilities.nvml"),
            (serde_json::json!({"likwid": true}), "capabilities.likwid"),
            (
                serde_json::json!({"rocm-smi": true}),
                "capabilities.rocm-smi",
            ),
            (
                serde_json::json!({"files-root": "/srv/x"}),
                "capabilities.files-root",
            ),
            (
                serde_json::json!({"run": {"pwn": {"path": "/bin/sh"}}}),
                "capabilities.run.pwn",
            ),
            (
                serde_json::json!({"wasi": true, "read-dirs": ["/etc"]}),
                "capabilities.wasi",
            ),
        ] {
            let err = caps(asked.clone()).within(&top.capabilities).unwrap_err();
            assert!(err.grant.contains(grant), "{asked}: {err}");
        }
    }

    #[test]
    fn a_command_is_the_nodes_definition_named_by_the_fleet() {
        let mut top = Capabilities::default();
        let mut sensors = RunGrant::new("/usr/bin/ipmitool");
        sensors.args = vec!["sensor".into()];
        top.run.insert("ipmi-sensors".into(), sensors.clone());
        let mut asked = Capabilities::default();
        asked.run.insert("ipmi-sensors".into(), sensors.clone());
        asked.within(&top).unwrap();
        let mut other = sensors.clone();
        other.user = Some("root".into());
        asked.run.insert("ipmi-sensors".into(), other);
        let err = asked.within(&top).unwrap_err();
        assert!(err.grant.contains("definition of its own"), "{err}");
        let mut longer = sensors;
        longer.timeout = Duration::from_secs(86400);
        asked.run.insert("ipmi-sensors".into(), longer);
        assert!(asked.within(&top).is_err());
    }

    #[test]
    fn native_libraries_never_come_from_the_fleet() {
        for (flag, key) in [
            ("nvml", "nvml-library"),
            ("likwid", "likwid-library"),
            ("rocm-smi", "rocm-smi-library"),
        ] {
            let top = caps(serde_json::json!({flag: true, key: "/opt/lib.so"}));
            caps(serde_json::json!({flag: true})).within(&top).unwrap();
            // Even the very library the node names is refused when the fleet writes it.
            let err = caps(serde_json::json!({flag: true, key: "/opt/lib.so"}))
                .within(&top)
                .unwrap_err();
            assert!(
                err.grant.contains(key) && err.grant.contains("node's own configuration"),
                "{err}"
            );
            let err = caps(serde_json::json!({flag: true}))
                .within(&Capabilities::default())
                .unwrap_err();
            assert_eq!(err.grant, format!("capabilities.{flag}"));
        }
    }

    #[test]
    fn read_dirs_need_a_ceiling_directory_holding_them() {
        let top = caps(serde_json::json!({"wasi": true, "read-dirs": ["/var/lib/data"]}));
        caps(serde_json::json!({"wasi": true, "read-dirs": ["/var/lib/data/a"]}))
            .within(&top)
            .unwrap();
        assert!(
            caps(serde_json::json!({"wasi": true, "read-dirs": ["/var/lib"]}))
                .within(&top)
                .is_err()
        );
        assert!(
            caps(serde_json::json!({"wasi": true, "read-dirs": ["/var/lib/database"]}))
                .within(&top)
                .is_err()
        );
    }

    #[test]
    fn a_system_secret_named_outright_needs_the_same_name_in_the_ceiling() {
        let wide = caps(serde_json::json!({"read-files": ["/**"]}));
        let err = caps(serde_json::json!({"read-files": ["/etc/shadow"]}))
            .within(&wide)
            .unwrap_err();
        assert!(err.grant.contains("/etc/shadow"), "{err}");
        caps(serde_json::json!({"read-files": ["/etc/hostname"]}))
            .within(&wide)
            .unwrap();
        let named = caps(serde_json::json!({"read-files": ["/etc/shadow"]}));
        caps(serde_json::json!({"read-files": ["/etc/shadow"]}))
            .within(&named)
            .unwrap();
    }

    #[test]
    fn pattern_coverage_is_sound() {
        for (top, asked, covered) in [
            ("/proc/**", "/proc/loadavg", true),
            ("/proc/**", "/proc/**", true),
            ("/proc/**", "/proc/*/stat", true),
            ("/proc/**", "/**", false),
            ("/proc/**", "/sys/x", false),
            ("/proc/*", "/proc/loadavg", true),
            ("/proc/*", "/proc/a/b", false),
            ("/proc/*", "/proc/**", false),
            ("/proc/load*", "/proc/loadavg", true),
            ("/proc/load*", "/proc/*", false),
            ("/sys/**/temp", "/sys/a/b/temp", true),
            ("/sys/**/temp", "/sys/**/temp", true),
            ("/sys/**/temp", "/sys/**", false),
            ("/**", "/etc/hostname", true),
            ("/proc/loadavg", "/proc/loadavg", true),
            ("/proc/loadavg", "/proc/loadavg/x", false),
        ] {
            assert_eq!(pattern_covers(top, asked), covered, "{top} covers {asked}");
        }
    }

    #[test]
    fn limits_and_intervals_have_maxima() {
        let top = Ceiling::default();
        top.admits_limits(&Limits::default()).unwrap();
        let mut more = Limits {
            memory_mb: 768,
            ..Limits::default()
        };
        let err = top.admits_limits(&more).unwrap_err();
        assert!(err.grant.contains("limits.memory-mb 768"), "{err}");
        more.memory_mb = 32;
        top.admits_limits(&more).unwrap();
        for bad in [
            Limits {
                call_timeout: Duration::from_secs(5),
                ..Limits::default()
            },
            Limits {
                log_lines_per_second: 100_000,
                ..Limits::default()
            },
            Limits {
                log_burst: 100_000,
                ..Limits::default()
            },
            Limits {
                restart_budget: 1000,
                ..Limits::default()
            },
            Limits {
                restart_backoff: Duration::from_millis(1),
                ..Limits::default()
            },
            Limits {
                healthy_period: Duration::from_secs(1),
                ..Limits::default()
            },
        ] {
            assert!(top.admits_limits(&bad).is_err(), "{bad:?}");
        }
        assert!(top.admits_interval(Some(Duration::from_millis(1))).is_err());
        top.admits_interval(Some(Duration::from_secs(10))).unwrap();
        top.admits_interval(None).unwrap();
    }

    #[test]
    fn a_ceiling_parses_with_its_extras_and_refuses_unknown_keys() {
        let top: Ceiling = serde_json::from_value(serde_json::json!({
            "read-files": ["/proc/**"], "limits": {"memory-mb": 256},
            "min-collect-interval": "1s", "max-plugins": 4, "max-stored-mb": 10
        }))
        .unwrap();
        assert_eq!(top.limits.memory_mb, 256);
        assert_eq!(top.limits.call_timeout, Limits::default().call_timeout);
        assert_eq!(top.min_collect_interval, Duration::from_secs(1));
        assert_eq!(top.max_plugins, 4);
        assert_eq!(top.max_stored_bytes(), 10 << 20);
        assert!(!top.capabilities.mount_info);
        assert!(serde_json::from_value::<Ceiling>(serde_json::json!({"colour": 1})).is_err());
        assert!(
            serde_json::from_value::<Ceiling>(serde_json::json!({"limits": {"colour": 1}}))
                .is_err()
        );
    }
}
