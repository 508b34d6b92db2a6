//! `schedstat`: `cpu_load_core` per hwthread from `/proc/schedstat`, as cc-metric-collector
//! derives it: the increase of the time spent running plus the time spent waiting on the
//! run queue (the `cpu<N>` line's 7th and 8th numbers, in nanoseconds) over the seconds
//! since the previous round, divided by 10^9. A float without unit; tags `type=hwthread`,
//! `type-id=<N>`. A hwthread's first round (and the first round after it came back) only
//! records its baseline.

use alloc::collections::BTreeMap;
use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;

use crate::{Collector, Files, Sample, Value, index_after, parse_u64, seconds_between};

/// The file read.
pub const PATH: &str = "/proc/schedstat";

/// `(hwthread, running ns, waiting ns)` of each `cpu<N>` line.
pub fn parse(text: &str) -> Result<Vec<(String, u64, u64)>, String> {
    let mut rows = Vec::new();
    for line in text.lines() {
        let fields: Vec<&str> = line.split_ascii_whitespace().collect();
        let Some(cpu) = fields.first().and_then(|f| index_after(f, "cpu")) else {
            continue;
        };
        if fields.len() < 9 {
            return Err(format!(
                "{PATH}: cpu{cpu} has {} numbers, expected at least 8",
                fields.len() - 1
            ));
        }
        let running = parse_u64(fields[7], "the running time", PATH)?;
        let waiting = parse_u64(fields[8], "the waiting time", PATH)?;
        rows.push((cpu.to_string(), running, waiting));
    }
    Ok(rows)
}

/// The `schedstat` collector.
#[derive(Debug, Default)]
pub struct Schedstat {
    previous: BTreeMap<String, (u64, u64)>,
    previous_ns: Option<i64>,
}

impl Schedstat {
    /// A collector with no baseline yet.
    pub fn new() -> Schedstat {
        Schedstat::default()
    }
}

impl Collector for Schedstat {
    fn name(&self) -> &'static str {
        "schedstat"
    }

    fn collect(
        &mut self,
        files: &mut dyn Files,
        now_ns: i64,
        out: &mut Vec<Sample>,
    ) -> Result<(), String> {
        // A round that fails keeps the previous baseline: the next one counts from it.
        let rows = parse(&files.read(PATH)?)?;
        let seconds = self
            .previous_ns
            .and_then(|old| seconds_between(old, now_ns));
        let mut current = BTreeMap::new();
        for (cpu, running, waiting) in rows {
            if let (Some(seconds), Some(&(old_running, old_waiting))) =
                (seconds, self.previous.get(&cpu))
            {
                // Nanosecond sums of a 64-bit kernel counter: going back is a reset (no
                // value that round), not a wrap.
                if running >= old_running && waiting >= old_waiting {
                    let load = (running - old_running) as f64 / seconds / 1e9
                        + (waiting - old_waiting) as f64 / seconds / 1e9;
                    out.push(Sample::new(
                        "cpu_load_core",
                        &[("type", "hwthread"), ("type-id", cpu.as_str())],
                        Value::Float(load),
                    ));
                }
            }
            current.insert(cpu, (running, waiting));
        }
        self.previous = current;
        self.previous_ns = Some(now_ns);
        Ok(())
    }
}
