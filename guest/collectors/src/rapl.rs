//! `rapl`: average power of the running-average-power-limit zones of
//! `/sys/devices/virtual/powercap/intel-rapl/` (what `/sys/class/powercap/intel-rapl:*`
//! links to), as cc-metric-collector reports it.
//!
//! A zone `intel-rapl:<N>` and its sub-zones `intel-rapl:<N>:<M>` are reported when their
//! `name`, `energy_uj` and `max_energy_range_uj` read, and neither their id (`0`, `0:1`) is
//! in `exclude_device_by_id` nor their name (`package-0`, `dram`, `psys`, ...) in
//! `exclude_device_by_name`. `rapl_average_power` is the energy used since the previous
//! round over the time between them, in Watt (a float, unit `Watt`); a counter that went
//! back wrapped at `max_energy_range_uj`, which is added as cc-metric-collector adds it.
//! Tags: `id=<N>` or `<N>:<M>`, `zone_name=<zone's name>` and, for a sub-zone,
//! `sub_zone_name=<its name>` (cc-metric-collector sends no `type` tag here). Zones are
//! looked up every round: a zone's first round only records its baseline.

use alloc::collections::BTreeMap;
use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;

use crate::{Collector, Files, Sample, Value, parse_u64, seconds_between};

/// The control type's directory.
pub const BASE: &str = "/sys/devices/virtual/powercap/intel-rapl";

/// Settings (cc-metric-collector's keys).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Config {
    /// `exclude_device_by_id`: zone ids such as `0` or `0:1`.
    pub exclude_device_by_id: Vec<String>,
    /// `exclude_device_by_name`: zone names such as `psys`.
    pub exclude_device_by_name: Vec<String>,
}

/// One zone read this round.
struct Zone {
    id: String,
    zone_name: String,
    sub_zone_name: Option<String>,
    energy: u64,
    max_range: u64,
}

/// A zone's `(name, energy, max range)`, `None` when one is missing (as cc-metric-collector
/// skips such a zone); a file that reads but is not a number is an error.
fn read_zone(files: &mut dyn Files, dir: &str) -> Result<Option<(String, u64, u64)>, String> {
    let (Ok(name), Ok(energy), Ok(range)) = (
        files.read(&format!("{dir}/name")),
        files.read(&format!("{dir}/energy_uj")),
        files.read(&format!("{dir}/max_energy_range_uj")),
    ) else {
        return Ok(None);
    };
    let energy = parse_u64(energy.trim(), "energy_uj", dir)?;
    let range = parse_u64(range.trim(), "max_energy_range_uj", dir)?;
    Ok(Some((String::from(name.trim()), energy, range)))
}

/// The `rapl` collector.
#[derive(Debug, Default)]
pub struct Rapl {
    config: Config,
    /// Energy in µJ by zone id.
    previous: BTreeMap<String, u64>,
    previous_ns: Option<i64>,
}

impl Rapl {
    /// A collector with these settings and no baseline yet.
    pub fn new(config: Config) -> Rapl {
        Rapl {
            config,
            previous: BTreeMap::new(),
            previous_ns: None,
        }
    }

    fn excluded(&self, id: &str, name: &str) -> bool {
        self.config.exclude_device_by_id.iter().any(|e| e == id)
            || self.config.exclude_device_by_name.iter().any(|e| e == name)
    }

    fn zones(&self, files: &mut dyn Files) -> Result<Vec<Zone>, String> {
        let mut zones = Vec::new();
        for entry in files.list_dir(BASE)? {
            let Some(id) = entry.strip_prefix("intel-rapl:") else {
                continue;
            };
            let dir = format!("{BASE}/{entry}");
            let zone = read_zone(files, &dir)?;
            if let Some((name, energy, max_range)) = &zone
                && !self.excluded(id, name)
            {
                zones.push(Zone {
                    id: String::from(id),
                    zone_name: name.clone(),
                    sub_zone_name: None,
                    energy: *energy,
                    max_range: *max_range,
                });
            }
            // Sub-zones are named after a zone whose name read.
            let Some((zone_name, _, _)) = zone else {
                continue;
            };
            let Ok(children) = files.list_dir(&dir) else {
                continue;
            };
            let prefix = format!("{entry}:");
            for child in children {
                let Some(sub) = child.strip_prefix(prefix.as_str()) else {
                    continue;
                };
                let sub_id = format!("{id}:{sub}");
                if let Some((name, energy, max_range)) =
                    read_zone(files, &format!("{dir}/{child}"))?
                    && !self.excluded(&sub_id, &name)
                {
                    zones.push(Zone {
                        id: sub_id,
                        zone_name: zone_name.clone(),
                        sub_zone_name: Some(name),
                        energy,
                        max_range,
                    });
                }
            }
        }
        Ok(zones)
    }
}

impl Collector for Rapl {
    fn name(&self) -> &'static str {
        "rapl"
    }

    fn collect(
        &mut self,
        files: &mut dyn Files,
        now_ns: i64,
        out: &mut Vec<Sample>,
    ) -> Result<(), String> {
        // A round that fails keeps the previous baseline: the next one counts from it.
        let zones = self.zones(files)?;
        let seconds = self
            .previous_ns
            .and_then(|old| seconds_between(old, now_ns));
        let mut current = BTreeMap::new();
        for zone in zones {
            if let (Some(seconds), Some(&old)) = (seconds, self.previous.get(&zone.id)) {
                let used = if zone.energy >= old {
                    zone.energy - old
                } else {
                    zone.energy.wrapping_sub(old).wrapping_add(zone.max_range)
                };
                let watts = used as f64 / (seconds * 1e6);
                let mut tags = alloc::vec![
                    ("id", zone.id.as_str()),
                    ("zone_name", zone.zone_name.as_str())
                ];
                if let Some(sub) = &zone.sub_zone_name {
                    tags.push(("sub_zone_name", sub.as_str()));
                }
                out.push(
                    Sample::new("rapl_average_power", &tags, Value::Float(watts)).unit("Watt"),
                );
            }
            current.insert(zone.id, zone.energy);
        }
        self.previous = current;
        self.previous_ns = Some(now_ns);
        Ok(())
    }
}
