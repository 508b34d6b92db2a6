//! `netstat`: bytes and packets per network device from `/proc/net/dev`, as totals
//! (`net_bytes_in`, `net_bytes_out`, `net_pkts_in`, `net_pkts_out`, integers, unit `bytes` or
//! `packets`) and as rates since the previous call (the same names with `_bw`, floats, unit
//! `bytes/sec` or `packets/sec`). Tags: `type=node`, `stype=network`, `stype-id=<device>`.

use alloc::collections::BTreeMap;
use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;

use crate::{Collector, Files, Sample, Value, counter_delta, parse_u64, seconds_between};

/// The file read.
pub const PATH: &str = "/proc/net/dev";

/// The metrics: name, column after the device name, unit, rate unit.
pub const METRICS: [(&str, usize, &str, &str); 4] = [
    ("net_bytes_in", 0, "bytes", "bytes/sec"),
    ("net_pkts_in", 1, "packets", "packets/sec"),
    ("net_bytes_out", 8, "bytes", "bytes/sec"),
    ("net_pkts_out", 9, "packets", "packets/sec"),
];

/// Settings (cc-metric-collector's keys, plus `exclude_devices`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// `include_devices`: only these devices (or their aliases); all when empty.
    pub include_devices: Vec<String>,
    /// `exclude_devices`: never these devices (default `["lo"]`).
    pub exclude_devices: Vec<String>,
    /// `send_abs_values`: send the totals (default true).
    pub send_abs_values: bool,
    /// `send_derived_values`: send the rates (default true).
    pub send_derived_values: bool,
    /// `interface_aliases`: canonical device name to the names the system may report.
    pub interface_aliases: BTreeMap<String, Vec<String>>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            include_devices: Vec::new(),
            exclude_devices: alloc::vec!["lo".to_string()],
            send_abs_values: true,
            send_derived_values: true,
            interface_aliases: BTreeMap::new(),
        }
    }
}

/// The `netstat` collector.
#[derive(Debug, Default)]
pub struct Netstat {
    config: Config,
    previous: BTreeMap<String, [u64; 4]>,
    previous_ns: Option<i64>,
}

impl Netstat {
    /// A collector with these settings and no baseline yet.
    pub fn new(config: Config) -> Netstat {
        Netstat {
            config,
            previous: BTreeMap::new(),
            previous_ns: None,
        }
    }

    fn canonical<'a>(&'a self, device: &'a str) -> &'a str {
        self.config
            .interface_aliases
            .iter()
            .find(|(_, aliases)| aliases.iter().any(|a| a == device))
            .map_or(device, |(canonical, _)| canonical.as_str())
    }

    fn wanted(&self, device: &str) -> bool {
        let name = self.canonical(device);
        let listed = |list: &[String]| list.iter().any(|d| d == name || d == device);
        (self.config.include_devices.is_empty() || listed(&self.config.include_devices))
            && !listed(&self.config.exclude_devices)
    }
}

impl Collector for Netstat {
    fn name(&self) -> &'static str {
        "netstat"
    }

    fn collect(
        &mut self,
        files: &mut dyn Files,
        now_ns: i64,
        out: &mut Vec<Sample>,
    ) -> Result<(), String> {
        let text = files.read(PATH)?;
        let seconds = self
            .previous_ns
            .and_then(|old| seconds_between(old, now_ns));
        let mut current = BTreeMap::new();
        for line in text.lines() {
            // The two header lines have no `:`; old kernels glue the first number to it.
            let Some((device, counters)) = line.split_once(':') else {
                continue;
            };
            let device = device.trim();
            if !self.wanted(device) {
                continue;
            }
            let columns: Vec<&str> = counters.split_ascii_whitespace().collect();
            if columns.len() < 10 {
                return Err(format!("{PATH}: too few columns for {device}"));
            }
            let mut values = [0u64; 4];
            for (slot, (name, column, _, _)) in values.iter_mut().zip(METRICS) {
                *slot = parse_u64(columns[column], name, PATH)?;
            }
            let tags = [("type", "node"), ("stype", "network"), ("stype-id", device)];
            if self.config.send_abs_values {
                for (value, (name, _, unit, _)) in values.iter().zip(METRICS) {
                    out.push(Sample::new(name, &tags, Value::Int(*value as i64)).unit(unit));
                }
            }
            if self.config.send_derived_values
                && let (Some(seconds), Some(old)) = (seconds, self.previous.get(device))
            {
                for i in 0..METRICS.len() {
                    let (name, _, _, rate_unit) = METRICS[i];
                    if let Some(delta) = counter_delta(old[i], values[i]) {
                        let rate = delta as f64 / seconds;
                        out.push(
                            Sample::new(format!("{name}_bw"), &tags, Value::Float(rate))
                                .unit(rate_unit),
                        );
                    }
                }
            }
            current.insert(device.to_string(), values);
        }
        self.previous = current;
        self.previous_ns = Some(now_ns);
        Ok(())
    }
}
