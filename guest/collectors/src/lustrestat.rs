//! `lustrestat`: Lustre client (`llite`) statistics from `lctl get_param llite.*.stats`, as
//! cc-metric-collector reports them, per mounted file system instance (tag `device`, e.g.
//! `scratch-ffff8a1c2e6b5000`; `type=node`).
//!
//! Grant the operator configures (`capabilities.run`), by default named
//!
//! ```json
//! {"lctl-llite-stats": {"path": "/usr/sbin/lctl", "args": ["get_param", "llite.*.stats"]}}
//! ```
//!
//! (`lctl_command` names another; the statistics are readable by root only, so the agent
//! runs as root or the grant has a `user` allowed to read them).
//!
//! - `send_abs_values`: `lustre_read_requests`, `lustre_write_requests` (the `read_bytes` and
//!   `write_bytes` sample counts, unit `requests`), `lustre_read_bytes`,
//!   `lustre_write_bytes` (their sums, unit `bytes`), `lustre_open`, `lustre_close`,
//!   `lustre_setattr`, `lustre_getattr`, `lustre_statfs`, `lustre_inode_permission` (no
//!   unit); integers.
//! - `send_diff_values`: the same with `_diff`: the increase since the previous round.
//! - `send_derived_values`: `lustre_read_requests_rate`, `lustre_write_requests_rate`
//!   (`requests/sec`), `lustre_read_bw`, `lustre_write_bw` (`bytes/sec`), floats.
//!
//! All three default to false as in cc-metric-collector, which refuses a configuration that
//! enables none. Lustre leaves out counters that are 0, so a missing line counts 0. The
//! first round (and a device's first round) is a baseline for increases and rates; a counter
//! that went backwards (statistics cleared, file system remounted) is a reset: no increase
//! or rate for it that round, where cc-metric-collector sends 0. A line that is not a
//! statistic, a count that is not a number, or a `read_bytes`/`write_bytes` line without its
//! sum fails the round, quoting the line.

use alloc::borrow::ToOwned;
use alloc::collections::BTreeMap;
use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;

use crate::{CommandCollector, Commands, Files, Sample, Value, quoted, run_text, seconds_between};

/// The default grant.
pub const LCTL_GRANT: &str = "lctl-llite-stats";

/// The counters: metric name (without `lustre_`), statistic line, whether the sum (field 6)
/// rather than the count (field 1), unit.
pub const COUNTERS: [(&str, &str, bool, &str); 10] = [
    ("read_requests", "read_bytes", false, "requests"),
    ("write_requests", "write_bytes", false, "requests"),
    ("read_bytes", "read_bytes", true, "bytes"),
    ("write_bytes", "write_bytes", true, "bytes"),
    ("open", "open", false, ""),
    ("close", "close", false, ""),
    ("setattr", "setattr", false, ""),
    ("getattr", "getattr", false, ""),
    ("statfs", "statfs", false, ""),
    ("inode_permission", "inode_permission", false, ""),
];

/// The rates: metric name, index into [`COUNTERS`], unit.
pub const RATES: [(&str, usize, &str); 4] = [
    ("lustre_read_requests_rate", 0, "requests/sec"),
    ("lustre_write_requests_rate", 1, "requests/sec"),
    ("lustre_read_bw", 2, "bytes/sec"),
    ("lustre_write_bw", 3, "bytes/sec"),
];

/// Settings (cc-metric-collector's keys; `lctl_command` is a grant name here).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// `lctl_command`: the grant running `lctl get_param llite.*.stats`.
    pub lctl_command: String,
    /// `send_abs_values` (default false).
    pub send_abs_values: bool,
    /// `send_diff_values` (default false).
    pub send_diff_values: bool,
    /// `send_derived_values` (default false).
    pub send_derived_values: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            lctl_command: LCTL_GRANT.to_owned(),
            send_abs_values: false,
            send_diff_values: false,
            send_derived_values: false,
        }
    }
}

/// The counters of [`COUNTERS`] per device, in the order of the output.
pub fn parse(text: &str) -> Result<Vec<(String, [u64; 10])>, String> {
    crate::whole_lines(text)?;
    let mut devices: Vec<(String, [u64; 10])> = Vec::new();
    for line in text.lines() {
        if line.trim().is_empty() {
            continue;
        }
        if let Some(rest) = line.strip_prefix("llite.") {
            let device = rest
                .strip_suffix(".stats=")
                .ok_or_else(|| format!("not an llite stats header: {}", quoted(line, 120)))?;
            if device.is_empty() || devices.iter().any(|(d, _)| d == device) {
                return Err(format!(
                    "an empty or repeated device: {}",
                    quoted(line, 120)
                ));
            }
            devices.push((device.to_owned(), [0; 10]));
            continue;
        }
        let Some((_, counters)) = devices.last_mut() else {
            return Err(format!(
                "a statistic before any llite.<device>.stats= header: {}",
                quoted(line, 120)
            ));
        };
        let fields: Vec<&str> = line.split_ascii_whitespace().collect();
        let name = fields[0];
        let first = fields.get(1).copied().unwrap_or_default();
        // `snapshot_time`, `start_time`, `elapsed_time`: seconds with a fraction, no counter.
        if name.ends_with("_time")
            && first.contains('.')
            && first.parse::<f64>().is_ok_and(f64::is_finite)
        {
            continue;
        }
        let count: u64 = first
            .parse()
            .map_err(|_| format!("the count is not a number: {}", quoted(line, 120)))?;
        for (i, (_, stat, sum, _)) in COUNTERS.iter().enumerate() {
            if *stat != name {
                continue;
            }
            counters[i] = if *sum {
                fields
                    .get(6)
                    .and_then(|s| s.parse().ok())
                    .ok_or_else(|| format!("no byte sum in: {}", quoted(line, 120)))?
            } else {
                count
            };
        }
    }
    Ok(devices)
}

/// The `lustrestat` collector.
#[derive(Debug, Default)]
pub struct Lustrestat {
    config: Config,
    previous: BTreeMap<String, [u64; 10]>,
    previous_ns: Option<i64>,
}

impl Lustrestat {
    /// A collector with these settings; an error when they send nothing.
    pub fn new(config: Config) -> Result<Lustrestat, String> {
        if !(config.send_abs_values || config.send_diff_values || config.send_derived_values) {
            return Err(
                "lustrestat: no metrics to collect: enable send_abs_values, send_diff_values \
                 or send_derived_values"
                    .to_owned(),
            );
        }
        Ok(Lustrestat {
            config,
            previous: BTreeMap::new(),
            previous_ns: None,
        })
    }
}

impl CommandCollector for Lustrestat {
    fn name(&self) -> &'static str {
        "lustrestat"
    }

    fn collect(
        &mut self,
        commands: &mut dyn Commands,
        _files: &mut dyn Files,
        now_ns: i64,
        out: &mut Vec<Sample>,
    ) -> Result<(), String> {
        let grant = &self.config.lctl_command;
        // A round that fails keeps the previous baseline: the next one counts from it.
        let devices =
            parse(&run_text(commands, grant)?).map_err(|e| format!("command {grant}: {e}"))?;
        let seconds = self
            .previous_ns
            .and_then(|old| seconds_between(old, now_ns));
        let mut current = BTreeMap::new();
        for (device, counters) in devices {
            let tags = [("type", "node"), ("device", device.as_str())];
            let old = self.previous.get(&device);
            let deltas: [Option<u64>; 10] =
                core::array::from_fn(|i| old.and_then(|old| counters[i].checked_sub(old[i])));
            for (i, (name, _, _, unit)) in COUNTERS.iter().enumerate() {
                let with_unit = |s: Sample| if unit.is_empty() { s } else { s.unit(unit) };
                if self.config.send_abs_values {
                    let value = i64::try_from(counters[i]).unwrap_or(i64::MAX);
                    out.push(with_unit(Sample::new(
                        format!("lustre_{name}"),
                        &tags,
                        Value::Int(value),
                    )));
                }
                if self.config.send_diff_values
                    && let Some(delta) = deltas[i]
                {
                    let value = i64::try_from(delta).unwrap_or(i64::MAX);
                    out.push(with_unit(Sample::new(
                        format!("lustre_{name}_diff"),
                        &tags,
                        Value::Int(value),
                    )));
                }
            }
            if self.config.send_derived_values
                && let Some(seconds) = seconds
            {
                for (name, i, unit) in RATES {
                    if let Some(delta) = deltas[i] {
                        out.push(
                            Sample::new(name, &tags, Value::Float(delta as f64 / seconds))
                                .unit(unit),
                        );
                    }
                }
            }
            current.insert(device, counters);
        }
        self.previous = current;
        self.previous_ns = Some(now_ns);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ROUND: &str = "llite.scratch-ffff8a1c2e6b5000.stats=\n\
        snapshot_time             1700000000.123456789 secs.nsecs\n\
        read_bytes                17 samples [bytes] 0 4194304 16777216\n\
        write_bytes               3 samples [bytes] 4096 4194304 4198400\n\
        open                      12 samples [usecs]\n\
        close                     12 samples [usecs]\n\
        llite.home-ffff8a1c2e6b6000.stats=\n\
        getattr                   5 samples [usecs] 1 20 40 600\n";

    #[test]
    fn counts_sums_and_missing_counters_per_device() {
        let got = parse(ROUND).unwrap();
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].0, "scratch-ffff8a1c2e6b5000");
        assert_eq!(got[0].1, [17, 3, 16777216, 4198400, 12, 12, 0, 0, 0, 0]);
        assert_eq!(got[1].0, "home-ffff8a1c2e6b6000");
        assert_eq!(got[1].1, [0, 0, 0, 0, 0, 0, 0, 5, 0, 0]);
    }

    #[test]
    fn garbage_and_cut_lines_are_errors() {
        for (text, needle) in [
            ("read_bytes 17 samples\n", "before any llite"),
            (
                "llite.x.stats=\nread_bytes 17 samples [bytes] 0 4\n",
                "no byte sum",
            ),
            ("llite.x.stats=\nopen many samples\n", "not a number"),
            ("llite.x.stat\n", "not an llite stats header"),
            ("llite.x.stats=\nllite.x.stats=\n", "repeated device"),
        ] {
            let err = parse(text).unwrap_err();
            assert!(err.contains(needle), "{text:?}: {err}");
        }
    }
}
