//! `tempstat`: temperatures from hwmon, `/sys/class/hwmon/<dev>/temp<n>_input` (millidegrees
//! Celsius, sent as whole degrees, integer, unit `degC`, tags `type=node` or the device's
//! `tag_override`). The metric is named as cc-metric-collector names it: from the device's
//! `name` and the sensor's `temp<n>_label` (`temp_core_0` for coretemp's `Core 0`,
//! `<name>_<label>` otherwise), lower case, spaces as `_`, `temp_` in front unless the name
//! holds `temp`. With `report_max_temperature` / `report_critical_temperature` the sensor's
//! `_max` / `_crit` values follow as `max_temp…` / `crit_temp…`.

use alloc::borrow::ToOwned;
use alloc::collections::BTreeMap;
use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;

use crate::{Collector, Files, Sample, Value};

/// Where the hwmon devices are listed.
pub const HWMON_DIR: &str = "/sys/class/hwmon";

/// Settings (cc-metric-collector's keys).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Config {
    /// `tag_override`: hwmon device name (e.g. `hwmon1`) to the tags its sensors get instead
    /// of `type=node`.
    pub tag_override: BTreeMap<String, BTreeMap<String, String>>,
    /// `report_max_temperature`.
    pub report_max_temperature: bool,
    /// `report_critical_temperature`.
    pub report_critical_temperature: bool,
}

/// The `tempstat` collector.
#[derive(Debug, Default)]
pub struct Tempstat {
    config: Config,
}

impl Tempstat {
    /// A collector with these settings.
    pub fn new(config: Config) -> Tempstat {
        Tempstat { config }
    }
}

/// The metric name for a device `name` and sensor `label`, as cc-metric-collector builds it.
pub fn metric_name(name: &str, label: &str) -> Option<String> {
    let raw = match (name, label) {
        ("", "") => return None,
        ("coretemp", label) if label.starts_with("Core ") || label.starts_with("Package id ") => {
            format!("temp_{label}")
        }
        ("", label) => label.to_owned(),
        (name, "") => name.to_owned(),
        (name, label) => format!("{name}_{label}"),
    };
    let name = raw.to_lowercase().replace(' ', "_");
    Some(if name.contains("temp") {
        name
    } else {
        format!("temp_{name}")
    })
}

fn millidegrees(files: &mut dyn Files, path: &str) -> Option<i64> {
    files.read(path).ok()?.trim().parse().ok()
}

impl Collector for Tempstat {
    fn name(&self) -> &'static str {
        "tempstat"
    }

    fn collect(
        &mut self,
        files: &mut dyn Files,
        _now_ns: i64,
        out: &mut Vec<Sample>,
    ) -> Result<(), String> {
        for device in files.list_dir(HWMON_DIR)? {
            let base = format!("{HWMON_DIR}/{device}");
            let Ok(entries) = files.list_dir(&base) else {
                continue;
            };
            let name = files
                .read(&format!("{base}/name"))
                .map(|n| n.trim().to_owned())
                .unwrap_or_default();
            let tags: Vec<(String, String)> = match self.config.tag_override.get(&device) {
                Some(tags) => tags.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
                None => alloc::vec![("type".to_owned(), "node".to_owned())],
            };
            let tags: Vec<(&str, &str)> =
                tags.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            for entry in &entries {
                let Some(sensor) = entry
                    .strip_suffix("_input")
                    .filter(|s| s.starts_with("temp"))
                else {
                    continue;
                };
                let label = files
                    .read(&format!("{base}/{sensor}_label"))
                    .map(|l| l.trim().to_owned())
                    .unwrap_or_default();
                let Some(metric) = metric_name(&name, &label) else {
                    continue;
                };
                // A sensor that cannot be read now (e.g. a device asleep) is skipped.
                let Some(value) = millidegrees(files, &format!("{base}/{entry}")) else {
                    continue;
                };
                out.push(Sample::new(metric.clone(), &tags, Value::Int(value / 1000)).unit("degC"));
                let extras = [
                    (self.config.report_max_temperature, "max", "max_temp"),
                    (self.config.report_critical_temperature, "crit", "crit_temp"),
                ];
                for (wanted, suffix, prefix) in extras {
                    if !wanted {
                        continue;
                    }
                    if let Some(limit) = millidegrees(files, &format!("{base}/{sensor}_{suffix}"))
                        && limit != 0
                    {
                        let extra = metric.replacen("temp", prefix, 1);
                        out.push(Sample::new(extra, &tags, Value::Int(limit / 1000)).unit("degC"));
                    }
                }
            }
        }
        Ok(())
    }
}
