//! `smartmon`: S.M.A.R.T. health of the node's disks from `smartctl`'s JSON output, as
//! cc-metric-collector reports it: for an NVMe device the values of its health log
//! (`nvme_smart_health_information_log`) as integers, tags `type=node`, `stype=disk`,
//! `stype-id=<device>` (e.g. `/dev/nvme0`):
//!
//! `smartmon_temp` (`degC`), `smartmon_percent_used`, `smartmon_avail_spare` (`percent`),
//! `smartmon_data_units_read`, `smartmon_data_units_write`, `smartmon_host_reads`,
//! `smartmon_host_writes`, `smartmon_power_cycles`, `smartmon_power_on` (`sec`, the log's
//! hours times 3600), `smartmon_unsafe_shutdowns`, `smartmon_media_errors`,
//! `smartmon_errlog_entries`, `smartmon_warn_temp_time`, `smartmon_crit_comp_time`.
//!
//! A device without that log (SATA, SAS) sends what `smartctl` reports for every kind of
//! device: `smartmon_temp` (`temperature.current`), `smartmon_power_on`
//! (`power_on_time.hours`) and `smartmon_power_cycles` (`power_cycle_count`), where
//! cc-metric-collector sends zeros for all fourteen. A value the device does not report is
//! left out rather than sent as 0.
//!
//! Devices come from `devices` (cc-metric-collector's list of `{"name", "type"}`) or, when
//! it is empty, from `smartctl --scan` run every round, so disks that appear or disappear
//! are followed; `exclude_devices` leaves devices out. A grant has fixed arguments, so each
//! device has a grant of its own (`capabilities.run`), by default named `smartctl-` and the
//! device's path after `/dev/` with `/` as `-` (`/dev/nvme0` → `smartctl-nvme0`), or the
//! name a `devices` entry gives in its `command`. With the scan grant (`scan_command`,
//! default `smartctl-scan`):
//!
//! ```json
//! {"smartctl-scan": {"path": "/usr/sbin/smartctl", "args": ["--scan", "--json=c"]},
//!  "smartctl-nvme0": {"path": "/usr/sbin/smartctl",
//!                     "args": ["--json=c", "--device=nvme", "--all", "/dev/nvme0"]}}
//! ```
//!
//! (`smartctl` needs root: the agent runs as root or the grant has a `user` allowed to open
//! the devices; cc-metric-collector's `use_sudo` is refused with that advice.)
//! `excludeMetrics`, cc-metric-collector's own key, leaves metrics out as the shared
//! `exclude_metrics` does, refusing names that are none of the fourteen as it does there.
//!
//! `smartctl`'s exit status is a bit mask: bits 0 and 1 (the command line was refused, the
//! device could not be opened) fail the device, quoting `smartctl`'s own messages; the
//! others report what it found (a failing disk, errors in its logs) about data it did
//! read, which is sent. (cc-metric-collector drops a device on any status but 0, so a disk
//! with an entry in its error log disappears from its metrics.) A device whose command
//! fails, whose output is not `smartctl`'s JSON or is the report of another device, and a
//! device the scan finds without a grant fail the round (after the other devices were
//! tried), naming the grant.

use alloc::borrow::ToOwned;
use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;

use serde_json::Value as Json;

use crate::{CommandCollector, Commands, Files, Sample, Value, quoted};

/// The default grant of `smartctl --scan --json=c`.
pub const SCAN_GRANT: &str = "smartctl-scan";

/// The metrics: name, key of the NVMe health log, unit (empty for none).
pub const METRICS: [(&str, &str, &str); 14] = [
    ("smartmon_temp", "temperature", "degC"),
    ("smartmon_percent_used", "percentage_used", "percent"),
    ("smartmon_avail_spare", "available_spare", "percent"),
    ("smartmon_data_units_read", "data_units_read", ""),
    ("smartmon_data_units_write", "data_units_written", ""),
    ("smartmon_host_reads", "host_reads", ""),
    ("smartmon_host_writes", "host_writes", ""),
    ("smartmon_power_cycles", "power_cycles", ""),
    ("smartmon_power_on", "power_on_hours", "sec"),
    ("smartmon_unsafe_shutdowns", "unsafe_shutdowns", ""),
    ("smartmon_media_errors", "media_errors", ""),
    ("smartmon_errlog_entries", "num_err_log_entries", ""),
    ("smartmon_warn_temp_time", "warning_temp_time", ""),
    ("smartmon_crit_comp_time", "critical_comp_time", ""),
];

/// One device to query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Device {
    /// Its name, e.g. `/dev/nvme0` (the `stype-id` tag).
    pub name: String,
    /// Its grant.
    pub command: String,
}

/// Settings (cc-metric-collector's keys; `scan_command` and `devices[].command` are grant
/// names).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// `scan_command`: the grant running `smartctl --scan --json=c`.
    pub scan_command: String,
    /// `devices`: the devices to query; scanned for every round when empty.
    pub devices: Vec<Device>,
    /// `exclude_devices`: device names not queried.
    pub exclude_devices: Vec<String>,
    /// `excludeMetrics`: metrics not sent.
    pub exclude_metrics: Vec<String>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            scan_command: SCAN_GRANT.to_owned(),
            devices: Vec::new(),
            exclude_devices: Vec::new(),
            exclude_metrics: Vec::new(),
        }
    }
}

/// The default grant of a device: `None` when it would be too long a name.
pub fn device_grant(name: &str) -> Option<String> {
    crate::derived_grant("smartctl", name.strip_prefix("/dev/").unwrap_or(name))
}

/// `smartctl`'s messages in its JSON report (`smartctl.messages[].string`), joined.
fn messages(report: &Json) -> String {
    let mut out = Vec::new();
    if let Some(list) = report
        .get("smartctl")
        .and_then(|s| s.get("messages"))
        .and_then(Json::as_array)
    {
        for message in list {
            if let Some(text) = message.get("string").and_then(Json::as_str) {
                out.push(text);
            }
        }
    }
    out.join("; ")
}

/// Runs the grant and returns `smartctl`'s JSON report: an error when it cannot run, was
/// ended by a signal, could not parse its command line or open the device (status bits 0
/// and 1), or wrote something that is not its JSON report.
pub fn run_json(commands: &mut dyn Commands, grant: &str) -> Result<Json, String> {
    let output = commands
        .run(grant)
        .map_err(|e| format!("command {grant}: {e}"))?;
    let Some(status) = output.status else {
        return Err(format!("command {grant} was ended by a signal"));
    };
    let text = String::from_utf8_lossy(&output.stdout);
    let report: Result<Json, _> = serde_json::from_str(&text);
    let stderr = || {
        let stderr = String::from_utf8_lossy(&output.stderr);
        quoted(stderr.trim(), 200)
    };
    let report = match report {
        Ok(report) if report.get("smartctl").is_some_and(Json::is_object) => report,
        Ok(_) if status == 0 => {
            return Err(format!(
                "command {grant}: not smartctl's JSON report (no `smartctl` object): {}",
                quoted(text.trim(), 120)
            ));
        }
        Err(e) if status == 0 => {
            return Err(format!(
                "command {grant}: its output is not JSON ({e}): {}",
                quoted(text.trim(), 120)
            ));
        }
        _ => {
            return Err(format!(
                "command {grant} exited with status {status}; standard error: {}",
                stderr()
            ));
        }
    };
    if status & 0b11 != 0 {
        let said = messages(&report);
        let said = if said.is_empty() {
            stderr()
        } else {
            quoted(&said, 200)
        };
        return Err(format!(
            "command {grant} exited with status {status} (the command line was refused or \
             the device could not be opened): {said}"
        ));
    }
    Ok(report)
}

/// The devices of a `smartctl --scan --json=c` report: name and type.
pub fn parse_scan(report: &Json) -> Result<Vec<(String, String)>, String> {
    let Some(devices) = report.get("devices") else {
        return Ok(Vec::new());
    };
    let devices = devices
        .as_array()
        .ok_or("`devices` is not a list".to_owned())?;
    let mut out = Vec::with_capacity(devices.len());
    for device in devices {
        let text = |key: &str| device.get(key).and_then(Json::as_str);
        match (text("name"), text("type")) {
            (Some(name), Some(kind)) if !name.is_empty() => {
                out.push((name.to_owned(), kind.to_owned()));
            }
            _ => {
                return Err(format!(
                    "a device without a name and type: {}",
                    quoted(&device.to_string(), 120)
                ));
            }
        }
    }
    Ok(out)
}

/// An integer of the report: `None` when absent, an error when not a number. Counters
/// beyond 64 bits (NVMe's are 128) are held at the largest integer.
fn integer(value: Option<&Json>, key: &str) -> Result<Option<i64>, String> {
    let Some(value) = value else {
        return Ok(None);
    };
    if let Some(v) = value.as_i64() {
        return Ok(Some(v));
    }
    if value.as_u64().is_some() {
        return Ok(Some(i64::MAX));
    }
    match value.as_f64() {
        // Beyond 2^53 every float is a whole number; below, one that converts back unchanged.
        Some(v)
            if v.is_finite() && (v.abs() >= 9_007_199_254_740_992.0 || (v as i64) as f64 == v) =>
        {
            Ok(Some(v as i64))
        }
        _ => Err(format!(
            "`{key}` is not an integer: {}",
            quoted(&value.to_string(), 60)
        )),
    }
}

/// The values of [`METRICS`] a device's report holds, by index; an error naming the device
/// when the report is of another device or holds a value that is not an integer.
pub fn parse_device(report: &Json, name: &str) -> Result<Vec<(usize, i64)>, String> {
    if let Some(reported) = report
        .get("device")
        .and_then(|d| d.get("name"))
        .and_then(Json::as_str)
        && reported != name
    {
        return Err(format!(
            "the report is of {}, not {}",
            quoted(reported, 80),
            quoted(name, 80)
        ));
    }
    let mut out = Vec::new();
    let hours_to_seconds = |v: i64| v.saturating_mul(3600);
    if let Some(log) = report.get("nvme_smart_health_information_log") {
        if !log.is_object() {
            return Err("`nvme_smart_health_information_log` is not an object".to_owned());
        }
        for (i, (metric, key, _)) in METRICS.iter().enumerate() {
            if let Some(v) = integer(log.get(key), key)? {
                let v = if *metric == "smartmon_power_on" {
                    hours_to_seconds(v)
                } else {
                    v
                };
                out.push((i, v));
            }
        }
        return Ok(out);
    }
    let at = |path: &[&str]| {
        let mut value = Some(report);
        for key in path {
            value = value.and_then(|v| v.get(key));
        }
        value
    };
    if let Some(v) = integer(at(&["temperature", "current"]), "temperature.current")? {
        out.push((0, v));
    }
    if let Some(v) = integer(at(&["power_cycle_count"]), "power_cycle_count")? {
        out.push((7, v));
    }
    if let Some(v) = integer(at(&["power_on_time", "hours"]), "power_on_time.hours")? {
        out.push((8, hours_to_seconds(v)));
    }
    Ok(out)
}

/// The `smartmon` collector.
#[derive(Debug, Default)]
pub struct Smartmon {
    config: Config,
}

impl Smartmon {
    /// A collector with these settings; an error when `exclude_metrics` names a metric
    /// that is not one of [`METRICS`].
    pub fn new(config: Config) -> Result<Smartmon, String> {
        for name in &config.exclude_metrics {
            if !METRICS.iter().any(|(m, ..)| m == name) {
                return Err(format!(
                    "smartmon: `excludeMetrics` names {}, which is not a smartmon metric",
                    quoted(name, 80)
                ));
            }
        }
        Ok(Smartmon { config })
    }

    /// The devices of this round: the configured ones or the scan's, less the excluded.
    fn devices(&self, commands: &mut dyn Commands) -> Result<Vec<Device>, String> {
        let excluded = |name: &str| self.config.exclude_devices.iter().any(|d| d == name);
        if !self.config.devices.is_empty() {
            return Ok(self
                .config
                .devices
                .iter()
                .filter(|d| !excluded(&d.name))
                .cloned()
                .collect());
        }
        let grant = &self.config.scan_command;
        let scan =
            parse_scan(&run_json(commands, grant)?).map_err(|e| format!("command {grant}: {e}"))?;
        let mut devices: Vec<Device> = Vec::new();
        for (name, _) in scan {
            // Disks behind a RAID controller share a name (with types `megaraid,N`); the
            // grant is per name, so the first is queried.
            if excluded(&name) || devices.iter().any(|d| d.name == name) {
                continue;
            }
            let command = device_grant(&name).ok_or_else(|| {
                format!(
                    "the scan found {}, whose name is too long for a grant: list it in \
                     `devices` with its `command`",
                    quoted(&name, 120)
                )
            })?;
            devices.push(Device { name, command });
        }
        Ok(devices)
    }
}

impl CommandCollector for Smartmon {
    fn name(&self) -> &'static str {
        "smartmon"
    }

    fn collect(
        &mut self,
        commands: &mut dyn Commands,
        _files: &mut dyn Files,
        _now_ns: i64,
        out: &mut Vec<Sample>,
    ) -> Result<(), String> {
        let devices = self.devices(commands)?;
        let mut round = Vec::new();
        let mut errors = Vec::new();
        for device in devices {
            let grant = &device.command;
            let values = run_json(commands, grant).and_then(|r| {
                parse_device(&r, &device.name).map_err(|e| format!("command {grant}: {e}"))
            });
            let values = match values {
                Ok(values) => values,
                Err(e) => {
                    let hint = if e.contains("not granted") {
                        " (grant it, or list the device in `exclude_devices`)"
                    } else {
                        ""
                    };
                    errors.push(format!("device {}: {e}{hint}", quoted(&device.name, 120)));
                    continue;
                }
            };
            let tags = [
                ("type", "node"),
                ("stype", "disk"),
                ("stype-id", device.name.as_str()),
            ];
            for (i, value) in values {
                let (metric, _, unit) = METRICS[i];
                if self.config.exclude_metrics.iter().any(|m| m == metric) {
                    continue;
                }
                let sample = Sample::new(metric, &tags, Value::Int(value));
                round.push(if unit.is_empty() {
                    sample
                } else {
                    sample.unit(unit)
                });
            }
        }
        if !errors.is_empty() {
            return Err(errors.join("; "));
        }
        out.append(&mut round);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn json(text: &str) -> Json {
        serde_json::from_str(text).unwrap()
    }

    #[test]
    fn nvme_health_log_and_the_fields_of_other_devices() {
        let nvme = json(
            r#"{"smartctl":{"exit_status":0},"device":{"name":"/dev/nvme0"},
               "nvme_smart_health_information_log":{"temperature":41,"percentage_used":3,
               "power_on_hours":10,"data_units_read":340282366920938463463374607431768211455}}"#,
        );
        assert_eq!(
            parse_device(&nvme, "/dev/nvme0").unwrap(),
            [(0, 41), (1, 3), (3, i64::MAX), (8, 36000)]
        );
        let sata = json(
            r#"{"smartctl":{},"device":{"name":"/dev/sda"},"temperature":{"current":30},
               "power_on_time":{"hours":2},"power_cycle_count":7}"#,
        );
        assert_eq!(
            parse_device(&sata, "/dev/sda").unwrap(),
            [(0, 30), (7, 7), (8, 7200)]
        );
        assert!(
            parse_device(&sata, "/dev/sdb")
                .unwrap_err()
                .contains("not \"/dev/sdb\"")
        );
        let bad = json(r#"{"nvme_smart_health_information_log":{"temperature":"hot"}}"#);
        assert!(
            parse_device(&bad, "/dev/nvme0")
                .unwrap_err()
                .contains("`temperature`")
        );
    }

    #[test]
    fn scan_lists_name_and_type() {
        let scan = json(
            r#"{"smartctl":{},"devices":[{"name":"/dev/sda","info_name":"/dev/sda","type":"sat"},
               {"name":"/dev/nvme0","type":"nvme"}]}"#,
        );
        assert_eq!(
            parse_scan(&scan).unwrap(),
            [
                ("/dev/sda".to_owned(), "sat".to_owned()),
                ("/dev/nvme0".to_owned(), "nvme".to_owned())
            ]
        );
        assert!(parse_scan(&json(r#"{"devices":[{"name":"/dev/sda"}]}"#)).is_err());
        assert!(parse_scan(&json(r#"{"devices":{}}"#)).is_err());
        assert_eq!(
            device_grant("/dev/nvme0").as_deref(),
            Some("smartctl-nvme0")
        );
        assert_eq!(
            device_grant("/dev/disk/by-id/nvme-X").as_deref(),
            Some("smartctl-disk-by-id-nvme-X")
        );
    }

    #[test]
    fn unknown_excluded_metrics_are_refused() {
        let config = Config {
            exclude_metrics: alloc::vec!["smartmon_temperature".to_owned()],
            ..Config::default()
        };
        assert!(Smartmon::new(config).is_err());
    }
}
