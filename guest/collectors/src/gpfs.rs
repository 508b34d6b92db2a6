//! `gpfs`: I/O statistics per mounted GPFS (IBM Storage Scale) file system from `mmpmon`'s
//! `fs_io_s` request in parseable form (`-p`), as cc-metric-collector reports them, tags
//! `type=node`, `filesystem=<name>`.
//!
//! Grant the operator configures (`capabilities.run`), by default named `mmpmon-fs-io`. A
//! granted command gets no standard input, so the request comes from a file given with
//! `-i` holding the line `fs_io_s`:
//!
//! ```json
//! {"mmpmon-fs-io": {"path": "/usr/lpp/mmfs/bin/mmpmon",
//!                   "args": ["-p", "-s", "-i", "/etc/ccfleet/mmpmon-fs_io_s"]}}
//! ```
//!
//! (`mmpmon_command` names another grant; `mmpmon` needs root, so the agent runs as root or
//! the grant's `user` may run it).
//!
//! - `send_abs_values`: `gpfs_num_opens`, `gpfs_num_closes`, `gpfs_num_reads`,
//!   `gpfs_num_writes`, `gpfs_num_readdirs`, `gpfs_num_inode_updates` (unit `requests`),
//!   `gpfs_bytes_read`, `gpfs_bytes_written` (`bytes`), integers;
//! - `send_diff_values`: the same with `_diff`, the increase since the previous round;
//! - `send_derived_values`: `gpfs_opens_rate`, `gpfs_closes_rate`, `gpfs_reads_rate`,
//!   `gpfs_writes_rate`, `gpfs_readdirs_rate`, `gpfs_inode_updates_rate` (`requests/sec`),
//!   `gpfs_bw_read`, `gpfs_bw_write` (`bytes/sec`), floats; `send_bandwidths` sends only the
//!   byte rates (and `gpfs_bw_total`);
//! - `send_total_values`: for each of the kinds above that is enabled, `gpfs_bytes_total`
//!   (read plus written), `gpfs_iops` (reads plus writes), `gpfs_metaops` (opens, closes,
//!   readdirs and inode updates), with `_diff` / `gpfs_bw_total`, `gpfs_iops_rate`,
//!   `gpfs_metaops_rate`.
//!
//! All default to false, as in cc-metric-collector, which refuses a configuration that
//! enables none. Rates are over `mmpmon`'s own timestamps (`_t_`, `_tu_`), as there. A
//! file system's first round is a baseline for increases and rates; a counter that went
//! backwards is a reset (no increase or rate that round, where cc-metric-collector sends 0).
//! A record with a return code other than 0 is skipped, keeping its file system's baseline.
//! A line that is not an `mmpmon -p` record, a record cut short or a counter that is not a
//! number fails the round, quoting the line. `gpfs_closes_rate` is the rate of closes
//! (cc-metric-collector computes it from the opens).

use alloc::borrow::ToOwned;
use alloc::collections::BTreeMap;
use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;

use crate::{CommandCollector, Commands, Files, Sample, Value, quoted, run_text};

/// The default grant.
pub const MMPMON_GRANT: &str = "mmpmon-fs-io";

/// The quantities: key of `fs_io_s` (or of a total), absolute name, rate name, whether bytes.
/// The last three are totals of the first eight.
pub const QUANTITIES: [(&str, &str, &str, bool); 11] = [
    ("_oc_", "gpfs_num_opens", "gpfs_opens_rate", false),
    ("_cc_", "gpfs_num_closes", "gpfs_closes_rate", false),
    ("_rdc_", "gpfs_num_reads", "gpfs_reads_rate", false),
    ("_wc_", "gpfs_num_writes", "gpfs_writes_rate", false),
    ("_dir_", "gpfs_num_readdirs", "gpfs_readdirs_rate", false),
    (
        "_iu_",
        "gpfs_num_inode_updates",
        "gpfs_inode_updates_rate",
        false,
    ),
    ("_br_", "gpfs_bytes_read", "gpfs_bw_read", true),
    ("_bw_", "gpfs_bytes_written", "gpfs_bw_write", true),
    ("bytesTotal", "gpfs_bytes_total", "gpfs_bw_total", true),
    ("iops", "gpfs_iops", "gpfs_iops_rate", false),
    ("metaops", "gpfs_metaops", "gpfs_metaops_rate", false),
];

/// How many of [`QUANTITIES`] are read (the rest are totals).
const READ: usize = 8;

/// Settings (cc-metric-collector's keys; `mmpmon_command` is a grant name here).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// `mmpmon_command`: the grant running `mmpmon -p` with the `fs_io_s` request.
    pub mmpmon_command: String,
    /// `exclude_filesystem`: file systems not reported.
    pub exclude_filesystem: Vec<String>,
    /// `send_abs_values` (default false).
    pub send_abs_values: bool,
    /// `send_diff_values` (default false).
    pub send_diff_values: bool,
    /// `send_derived_values` (default false).
    pub send_derived_values: bool,
    /// `send_total_values` (default false).
    pub send_total_values: bool,
    /// `send_bandwidths` (default false).
    pub send_bandwidths: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            mmpmon_command: MMPMON_GRANT.to_owned(),
            exclude_filesystem: Vec::new(),
            send_abs_values: false,
            send_diff_values: false,
            send_derived_values: false,
            send_total_values: false,
            send_bandwidths: false,
        }
    }
}

/// One `_fs_io_s_` record with return code 0.
#[derive(Debug, Clone, PartialEq)]
pub struct FsIo {
    /// The file system (`_fs_`).
    pub filesystem: String,
    /// `_t_` and `_tu_` as seconds.
    pub time: f64,
    /// The quantities of [`QUANTITIES`], totals included.
    pub values: [u64; 11],
}

/// What `mmpmon -p` wrote: the `_fs_io_s_` records with return code 0, and the file systems
/// whose record had another; other record types are ignored.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Parsed {
    /// The records with return code 0.
    pub records: Vec<FsIo>,
    /// The file systems whose record had a return code other than 0.
    pub failed: Vec<String>,
}

/// Parses `mmpmon -p` output.
pub fn parse(text: &str) -> Result<Parsed, String> {
    crate::whole_lines(text)?;
    let mut out = Parsed::default();
    for line in text.lines() {
        let tokens: Vec<&str> = line.split_ascii_whitespace().collect();
        let Some(kind) = tokens.first() else {
            continue;
        };
        let is_key = |t: &str| t.len() > 2 && t.starts_with('_') && t.ends_with('_');
        if !is_key(kind) {
            return Err(format!("not an mmpmon -p record: {}", quoted(line, 120)));
        }
        if *kind != "_fs_io_s_" {
            continue;
        }
        let pairs = &tokens[1..];
        if !pairs.len().is_multiple_of(2) || pairs.chunks(2).any(|p| !is_key(p[0])) {
            return Err(format!(
                "a record cut short or garbled: {}",
                quoted(line, 120)
            ));
        }
        let get = |key: &str| pairs.chunks(2).find(|p| p[0] == key).map(|p| p[1]);
        let number = |key: &str| -> Result<u64, String> {
            get(key)
                .ok_or_else(|| format!("no {key} in: {}", quoted(line, 120)))?
                .parse()
                .map_err(|_| format!("{key} is not a number in: {}", quoted(line, 120)))
        };
        let filesystem = get("_fs_").ok_or_else(|| format!("no _fs_ in: {}", quoted(line, 120)))?;
        if number("_rc_")? != 0 {
            out.failed.push(filesystem.to_owned());
            continue;
        }
        let micros = number("_tu_")?;
        let time = number("_t_")? as f64 + micros as f64 / 1e6;
        let mut values = [0u64; 11];
        for (slot, (key, ..)) in values.iter_mut().zip(&QUANTITIES[..READ]) {
            *slot = number(key)?;
        }
        let sum =
            |v: &[u64; 11], idx: &[usize]| idx.iter().fold(0u64, |a, i| a.wrapping_add(v[*i]));
        values[8] = sum(&values, &[6, 7]);
        values[9] = sum(&values, &[2, 3]);
        values[10] = sum(&values, &[0, 1, 4, 5]);
        out.records.push(FsIo {
            filesystem: filesystem.to_owned(),
            time,
            values,
        });
    }
    Ok(out)
}

/// The `gpfs` collector.
#[derive(Debug, Default)]
pub struct Gpfs {
    config: Config,
    /// Time and values per file system.
    previous: BTreeMap<String, (f64, [u64; 11])>,
}

impl Gpfs {
    /// A collector with these settings; an error when they send nothing.
    pub fn new(config: Config) -> Result<Gpfs, String> {
        let c = &config;
        if !(c.send_abs_values || c.send_diff_values || c.send_derived_values || c.send_bandwidths)
        {
            return Err(
                "gpfs: no metrics to collect: enable send_abs_values, send_diff_values, \
                 send_derived_values or send_bandwidths"
                    .to_owned(),
            );
        }
        Ok(Gpfs {
            config,
            previous: BTreeMap::new(),
        })
    }
}

impl CommandCollector for Gpfs {
    fn name(&self) -> &'static str {
        "gpfs"
    }

    fn collect(
        &mut self,
        commands: &mut dyn Commands,
        _files: &mut dyn Files,
        _now_ns: i64,
        out: &mut Vec<Sample>,
    ) -> Result<(), String> {
        let grant = &self.config.mmpmon_command;
        // A round that fails keeps the previous baselines: the next one counts from them.
        let parsed =
            parse(&run_text(commands, grant)?).map_err(|e| format!("command {grant}: {e}"))?;
        let c = &self.config;
        let mut current = BTreeMap::new();
        for record in parsed.records {
            if c.exclude_filesystem.contains(&record.filesystem) {
                continue;
            }
            let tags = [("type", "node"), ("filesystem", record.filesystem.as_str())];
            let old = self.previous.get(&record.filesystem);
            for (i, (_, name, rate_name, bytes)) in QUANTITIES.iter().enumerate() {
                let total = i >= READ;
                let unit = if *bytes { "bytes" } else { "requests" };
                let value = record.values[i];
                if c.send_abs_values && (!total || c.send_total_values) {
                    let v = i64::try_from(value).unwrap_or(i64::MAX);
                    out.push(Sample::new(*name, &tags, Value::Int(v)).unit(unit));
                }
                let Some((old_time, old_values)) = old else {
                    continue;
                };
                let Some(delta) = value.checked_sub(old_values[i]) else {
                    continue;
                };
                if c.send_diff_values && (!total || c.send_total_values) {
                    let v = i64::try_from(delta).unwrap_or(i64::MAX);
                    out.push(Sample::new(format!("{name}_diff"), &tags, Value::Int(v)).unit(unit));
                }
                let rate = (c.send_derived_values && (!total || c.send_total_values))
                    || (c.send_bandwidths && *bytes);
                let seconds = record.time - old_time;
                if rate && seconds > 0.0 {
                    out.push(
                        Sample::new(*rate_name, &tags, Value::Float(delta as f64 / seconds))
                            .unit(if *bytes { "bytes/sec" } else { "requests/sec" }),
                    );
                }
            }
            current.insert(record.filesystem, (record.time, record.values));
        }
        // File systems whose record failed keep their baseline; the others that are gone
        // are forgotten.
        for (fs, state) in core::mem::take(&mut self.previous) {
            if parsed.failed.contains(&fs) {
                current.entry(fs).or_insert(state);
            }
        }
        self.previous = current;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TWO: &str = "_fs_io_s_ _n_ 199.18.1.8 _nn_ node1 _rc_ 0 _t_ 1066660148 _tu_ 407431 _cl_ myCluster.xxx.com _fs_ gpfs2 _d_ 2 _br_ 6291456 _bw_ 314572800 _oc_ 10 _cc_ 16 _rdc_ 101 _wc_ 300 _dir_ 7 _iu_ 2\n\
        _fs_io_s_ _n_ 199.18.1.8 _nn_ node1 _rc_ 0 _t_ 1066660148 _tu_ 407455 _cl_ myCluster.xxx.com _fs_ gpfs1 _d_ 3 _br_ 5431636 _bw_ 173342800 _oc_ 6 _cc_ 8 _rdc_ 54 _wc_ 156 _dir_ 3 _iu_ 6\n";

    #[test]
    fn records_with_totals() {
        let got = parse(TWO).unwrap().records;
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].filesystem, "gpfs2");
        assert!((got[0].time - 1066660148.407431).abs() < 1e-6);
        assert_eq!(
            got[0].values,
            [
                10,
                16,
                101,
                300,
                7,
                2,
                6291456,
                314572800,
                6291456 + 314572800,
                401,
                35
            ]
        );
    }

    #[test]
    fn failed_records_are_skipped_and_garbage_is_an_error() {
        let failed = "_fs_io_s_ _n_ 1.2.3.4 _nn_ n _rc_ 19 _t_ 1 _tu_ 2 _cl_ c _fs_ gone\n";
        let got = parse(failed).unwrap();
        assert_eq!(got.records, []);
        assert_eq!(got.failed, ["gone"]);
        for (text, needle) in [
            ("Segmentation fault\n", "not an mmpmon -p record"),
            ("_fs_io_s_ _n_ 1.2.3.4 _nn_\n", "cut short"),
            ("_fs_io_s_ _rc_ 0 _t_ 1 _tu_ 2 _fs_ a _br_ 1\n", "no _oc_"),
            (
                "_fs_io_s_ _rc_ 0 _t_ 1 _tu_ x _fs_ a\n",
                "_tu_ is not a number",
            ),
            ("_fs_io_s_ _rc_ 0 _t_ 1 _tu_ 2\n", "no _fs_"),
        ] {
            let err = parse(text).unwrap_err();
            assert!(err.contains(needle), "{text:?}: {err}");
        }
    }
}
