//! `cpustat`: CPU time shares per hwthread and for the node, from `/proc/stat`.
//!
//! Emits `cpu_user`, `cpu_nice`, `cpu_system`, `cpu_idle`, `cpu_iowait`, `cpu_irq`,
//! `cpu_softirq`, `cpu_steal`, `cpu_guest`, `cpu_guest_nice` and `cpu_used` (everything but
//! idle) with the tag `unit=Percent`, for the node (`type=node`) and every hwthread
//! (`type=hwthread`, `type-id=<n>`), plus `num_cpus` for the node. A share is the counter's
//! increase over the increase of all CPU time (user to steal; guest time is already counted
//! in user time) since the previous call, so the first call emits only `num_cpus`.

use alloc::collections::BTreeMap;
use alloc::string::{String, ToString};
use alloc::vec::Vec;

use crate::{Collector, Files, Sample, Value, counter_delta, index_after, parse_u64};

/// The file read.
pub const PATH: &str = "/proc/stat";

/// The metrics, in the order of the columns of a `cpu` line.
pub const METRICS: [&str; 10] = [
    "cpu_user",
    "cpu_nice",
    "cpu_system",
    "cpu_idle",
    "cpu_iowait",
    "cpu_irq",
    "cpu_softirq",
    "cpu_steal",
    "cpu_guest",
    "cpu_guest_nice",
];

const IDLE: usize = 3;
/// Columns that add up to all CPU time (user to steal).
const TOTAL_COLUMNS: usize = 8;

/// The `cpustat` collector.
#[derive(Debug, Default)]
pub struct Cpustat {
    previous: BTreeMap<String, [u64; 10]>,
}

impl Cpustat {
    /// A collector with no baseline yet.
    pub fn new() -> Cpustat {
        Cpustat::default()
    }
}

fn shares(old: &[u64; 10], new: &[u64; 10], tags: &[(&str, &str)], out: &mut Vec<Sample>) {
    let mut delta = [0u64; 10];
    for (i, slot) in delta.iter_mut().enumerate() {
        match counter_delta(old[i], new[i]) {
            Some(d) => *slot = d,
            // A reset: the new values are the next baseline.
            None => return,
        }
    }
    let total: u64 = delta[..TOTAL_COLUMNS].iter().sum();
    if total == 0 {
        return;
    }
    let total = total as f64;
    for (name, d) in METRICS.iter().zip(delta) {
        out.push(
            Sample::new(*name, tags, Value::Float(d as f64 / total * 100.0))
                .with_tag("unit", "Percent"),
        );
    }
    let used = (total - delta[IDLE] as f64) / total * 100.0;
    out.push(Sample::new("cpu_used", tags, Value::Float(used)).with_tag("unit", "Percent"));
}

impl Collector for Cpustat {
    fn name(&self) -> &'static str {
        "cpustat"
    }

    fn collect(
        &mut self,
        files: &mut dyn Files,
        _now_ns: i64,
        out: &mut Vec<Sample>,
    ) -> Result<(), String> {
        let text = files.read(PATH)?;
        let mut current = BTreeMap::new();
        let mut num_cpus = 0i64;
        for line in text.lines() {
            let mut fields = line.split_ascii_whitespace();
            let Some(label) = fields.next() else { continue };
            let id = if label == "cpu" {
                None
            } else if let Some(id) = index_after(label, "cpu") {
                num_cpus += 1;
                Some(id)
            } else {
                continue;
            };
            // Older kernels have fewer columns; the missing ones stay zero.
            let mut values = [0u64; 10];
            for (slot, raw) in values.iter_mut().zip(fields) {
                *slot = parse_u64(raw, label, PATH)?;
            }
            if let Some(old) = self.previous.get(label) {
                match id {
                    None => shares(old, &values, &[("type", "node")], out),
                    Some(id) => shares(old, &values, &[("type", "hwthread"), ("type-id", id)], out),
                }
            }
            current.insert(label.to_string(), values);
        }
        if current.is_empty() {
            return Err(String::from("/proc/stat has no cpu lines"));
        }
        // CPUs that went offline are forgotten; new ones start from this baseline.
        self.previous = current;
        out.push(Sample::new(
            "num_cpus",
            &[("type", "node")],
            Value::Int(num_cpus),
        ));
        Ok(())
    }
}
