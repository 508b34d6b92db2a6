//! `iostat`: block device activity from `/proc/diskstats`, as the increase of each counter
//! since the previous call (integers, tags `type=node`, `device=<name>`), except `io_ioops`,
//! the I/Os in flight, which is sent as read. Loop devices are skipped. The first call only
//! records a baseline, as does a device's first appearance.
//!
//! The columns after the device name (see the kernel's `Documentation/admin-guide/iostats`):
//! reads, reads merged, sectors read, ms reading, writes, writes merged, sectors written, ms
//! writing, I/Os in flight, ms doing I/O, weighted ms, then (4.18+) discards, discards
//! merged, sectors discarded, ms discarding and (5.5+) flushes, ms flushing. Older kernels'
//! shorter lines yield only the metrics they have.

use alloc::collections::BTreeMap;
use alloc::string::{String, ToString};
use alloc::vec::Vec;

use crate::{Collector, Files, Sample, Value, counter_delta, parse_u64};

/// The file read.
pub const PATH: &str = "/proc/diskstats";

/// The metrics in column order (after major, minor and name).
pub const METRICS: [&str; 17] = [
    "io_reads",
    "io_reads_merged",
    "io_read_sectors",
    "io_read_ms",
    "io_writes",
    "io_writes_merged",
    "io_writes_sectors",
    "io_writes_ms",
    "io_ioops",
    "io_ioops_ms",
    "io_ioops_weighted_ms",
    "io_discards",
    "io_discards_merged",
    "io_discards_sectors",
    "io_discards_ms",
    "io_flushes",
    "io_flushes_ms",
];

/// The one column that is a gauge, not a counter.
const IN_FLIGHT: usize = 8;

/// Settings (cc-metric-collector's keys).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Config {
    /// `exclude_devices`: devices not reported.
    pub exclude_devices: Vec<String>,
}

/// The `iostat` collector.
#[derive(Debug, Default)]
pub struct Iostat {
    config: Config,
    previous: BTreeMap<String, Vec<u64>>,
}

impl Iostat {
    /// A collector with these settings and no baseline yet.
    pub fn new(config: Config) -> Iostat {
        Iostat {
            config,
            previous: BTreeMap::new(),
        }
    }
}

impl Collector for Iostat {
    fn name(&self) -> &'static str {
        "iostat"
    }

    fn collect(
        &mut self,
        files: &mut dyn Files,
        _now_ns: i64,
        out: &mut Vec<Sample>,
    ) -> Result<(), String> {
        let text = files.read(PATH)?;
        let mut current = BTreeMap::new();
        for line in text.lines() {
            let fields: Vec<&str> = line.split_ascii_whitespace().collect();
            if fields.len() < 4 {
                continue;
            }
            let device = fields[2];
            if device.contains("loop") || self.config.exclude_devices.iter().any(|d| d == device) {
                continue;
            }
            let values = fields[3..]
                .iter()
                .take(METRICS.len())
                .zip(METRICS)
                .map(|(raw, name)| parse_u64(raw, name, PATH))
                .collect::<Result<Vec<u64>, String>>()?;
            if let Some(old) = self.previous.get(device) {
                let tags = [("type", "node"), ("device", device)];
                for (i, (name, new)) in METRICS.iter().zip(&values).enumerate() {
                    let value = if i == IN_FLIGHT {
                        Some(*new)
                    } else {
                        old.get(i).and_then(|old| counter_delta(*old, *new))
                    };
                    if let Some(value) = value {
                        out.push(Sample::new(*name, &tags, Value::Int(value as i64)));
                    }
                }
            }
            current.insert(device.to_string(), values);
        }
        self.previous = current;
        Ok(())
    }
}
