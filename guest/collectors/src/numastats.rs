//! `numastats`: the kernel's NUMA allocation counters per domain, from
//! `/sys/devices/system/node/node<n>/numastat` (`type=memoryDomain`, `type-id=<n>`): each
//! counter as `numastats_<key>` (integer) and its rate per second since the previous call as
//! `numastats_<key>_rate` (float).

use alloc::collections::BTreeMap;
use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;

use crate::{
    Collector, Files, Sample, Value, counter_delta, index_after, parse_u64, seconds_between,
};

/// Where the domains are listed.
pub const NODE_DIR: &str = "/sys/devices/system/node";

/// Settings (cc-metric-collector's keys).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// `send_abs_values`: send the counters (default true).
    pub send_abs_values: bool,
    /// `send_derived_values`: send the rates (default true).
    pub send_derived_values: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            send_abs_values: true,
            send_derived_values: true,
        }
    }
}

/// The `numastats` collector.
#[derive(Debug, Default)]
pub struct Numastats {
    config: Config,
    previous: BTreeMap<(String, String), u64>,
    previous_ns: Option<i64>,
}

impl Numastats {
    /// A collector with these settings and no baseline yet.
    pub fn new(config: Config) -> Numastats {
        Numastats {
            config,
            previous: BTreeMap::new(),
            previous_ns: None,
        }
    }
}

impl Collector for Numastats {
    fn name(&self) -> &'static str {
        "numastats"
    }

    fn collect(
        &mut self,
        files: &mut dyn Files,
        now_ns: i64,
        out: &mut Vec<Sample>,
    ) -> Result<(), String> {
        let seconds = self
            .previous_ns
            .and_then(|old| seconds_between(old, now_ns));
        let mut current = BTreeMap::new();
        for dir in files.list_dir(NODE_DIR)? {
            let Some(id) = index_after(&dir, "node") else {
                continue;
            };
            let path = format!("{NODE_DIR}/{dir}/numastat");
            let text = files.read(&path)?;
            let tags = [("type", "memoryDomain"), ("type-id", id)];
            for line in text.lines() {
                let Some((key, raw)) = line.split_once(' ') else {
                    continue;
                };
                let value = parse_u64(raw.trim(), key, &path)?;
                let name = format!("numastats_{key}");
                if self.config.send_abs_values {
                    out.push(Sample::new(name.clone(), &tags, Value::Int(value as i64)));
                }
                let slot = (id.to_string(), key.to_string());
                if self.config.send_derived_values
                    && let (Some(seconds), Some(old)) = (seconds, self.previous.get(&slot))
                    && let Some(delta) = counter_delta(*old, value)
                {
                    out.push(Sample::new(
                        format!("{name}_rate"),
                        &tags,
                        Value::Float(delta as f64 / seconds),
                    ));
                }
                current.insert(slot, value);
            }
        }
        self.previous = current;
        self.previous_ns = Some(now_ns);
        Ok(())
    }
}
