//! `nfsiostat`: bytes moved per NFS mount from `/proc/self/mountstats` (served by the agent
//! to a plugin granted `capabilities.mount-info`), as cc-metric-collector reports them.
//!
//! For each `device <server> mounted on <mount point> with fstype nfs[4] statvers=...`
//! block, the `bytes:` line's eight counters are sent as `nfsio_nread`, `nfsio_nwrite`,
//! `nfsio_dread`, `nfsio_dwrite`, `nfsio_nfsread`, `nfsio_nfswrite`, `nfsio_pageread`,
//! `nfsio_pagewrite` (integers, unit `bytes`; cc-metric-collector's documentation calls the
//! `O_DIRECT` pair `oread`/`owrite`, its code sends `dread`/`dwrite`, and so does this), with
//! tags `type=node`, `stype=filesystem`, `stype-id=<mount point>` (or the server, with
//! `use_server_as_stype`). With `send_derived_values` the rates since the previous round go
//! as `nfsio_<name>_bw` (floats, unit `bytes/sec`, `4K_pages/s` for the page counters).
//! As in cc-metric-collector, a mount is first only remembered: it is reported from the
//! round after it appeared. `exclude_metrics` takes the names without `nfsio_` (and drops
//! both forms); `exclude_filesystem` takes mount points (or servers).

use alloc::collections::BTreeMap;
use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;

use crate::{Collector, Files, Sample, Value, counter_delta, seconds_between};

/// The file read.
pub const PATH: &str = "/proc/self/mountstats";

/// The counters of a `bytes:` line, in order.
pub const COUNTERS: [&str; 8] = [
    "nread",
    "nwrite",
    "dread",
    "dwrite",
    "nfsread",
    "nfswrite",
    "pageread",
    "pagewrite",
];

/// Settings (cc-metric-collector's keys).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// `exclude_metrics`: counter names without the `nfsio_` prefix.
    pub exclude_metrics: Vec<String>,
    /// `exclude_filesystem`: mount points (or servers) not reported.
    pub exclude_filesystem: Vec<String>,
    /// `use_server_as_stype`: the `stype-id` is the server, not the mount point.
    pub use_server_as_stype: bool,
    /// `send_abs_values` (default true).
    pub send_abs_values: bool,
    /// `send_derived_values` (default false).
    pub send_derived_values: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            exclude_metrics: Vec::new(),
            exclude_filesystem: Vec::new(),
            use_server_as_stype: false,
            send_abs_values: true,
            send_derived_values: false,
        }
    }
}

/// One NFS mount of the file: server, mount point, the `bytes:` counters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NfsMount {
    /// `server:/export`.
    pub server: String,
    /// Where it is mounted.
    pub mount_point: String,
    /// The eight counters of [`COUNTERS`].
    pub bytes: [u64; 8],
}

/// The NFS mounts of a mountstats text that have a `bytes:` line. A `bytes:` line with
/// fewer than eight numbers is an error (a file cut short).
pub fn parse(text: &str) -> Result<Vec<NfsMount>, String> {
    let mut mounts = Vec::new();
    let mut current: Option<(String, String)> = None;
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("device ") {
            current = None;
            let fields: Vec<&str> = rest.split(' ').collect();
            // <server> mounted on <mount point> with fstype <type> statvers=<v>
            if fields.len() >= 7
                && fields[1] == "mounted"
                && fields[2] == "on"
                && fields[4] == "with"
                && fields[5] == "fstype"
                && fields[6].starts_with("nfs")
                && fields[6][3..].bytes().all(|b| b.is_ascii_digit())
                && fields.get(7).is_some_and(|f| f.starts_with("statvers="))
            {
                current = Some((
                    crate::mounts::unescape(fields[0]),
                    crate::mounts::unescape(fields[3]),
                ));
            }
            continue;
        }
        let Some(rest) = line.trim_start().strip_prefix("bytes:") else {
            continue;
        };
        let Some((server, mount_point)) = current.take() else {
            continue;
        };
        let numbers: Vec<&str> = rest.split_ascii_whitespace().collect();
        if numbers.len() < COUNTERS.len() {
            return Err(format!(
                "{PATH}: the bytes line of {mount_point} has {} counters, expected 8",
                numbers.len()
            ));
        }
        let mut bytes = [0u64; 8];
        for (slot, text) in bytes.iter_mut().zip(&numbers) {
            *slot = text
                .parse()
                .map_err(|_| format!("{PATH}: {mount_point}: {text:?} is not a number"))?;
        }
        mounts.push(NfsMount {
            server,
            mount_point,
            bytes,
        });
    }
    Ok(mounts)
}

/// The `nfsiostat` collector.
#[derive(Debug, Default)]
pub struct Nfsiostat {
    config: Config,
    previous: BTreeMap<String, [u64; 8]>,
    previous_ns: Option<i64>,
}

impl Nfsiostat {
    /// A collector with these settings and no baseline yet.
    pub fn new(config: Config) -> Nfsiostat {
        Nfsiostat {
            config,
            previous: BTreeMap::new(),
            previous_ns: None,
        }
    }

    /// Sets `exclude_metrics` (counter names without `nfsio_`).
    pub fn exclude_metrics(mut self, names: Vec<String>) -> Nfsiostat {
        self.config.exclude_metrics = names;
        self
    }
}

impl Collector for Nfsiostat {
    fn name(&self) -> &'static str {
        "nfsiostat"
    }

    fn collect(
        &mut self,
        files: &mut dyn Files,
        now_ns: i64,
        out: &mut Vec<Sample>,
    ) -> Result<(), String> {
        // A round that fails keeps the previous baseline: the next one counts from it.
        let mounts = parse(&files.read(PATH)?)?;
        let seconds = self
            .previous_ns
            .and_then(|old| seconds_between(old, now_ns));
        let mut current = BTreeMap::new();
        for mount in mounts {
            let key = if self.config.use_server_as_stype {
                mount.server
            } else {
                mount.mount_point
            };
            if self.config.exclude_filesystem.contains(&key) {
                continue;
            }
            if let Some(old) = self.previous.get(&key) {
                let tags = [
                    ("type", "node"),
                    ("stype", "filesystem"),
                    ("stype-id", key.as_str()),
                ];
                for (i, name) in COUNTERS.iter().enumerate() {
                    if self.config.exclude_metrics.iter().any(|e| e == name) {
                        continue;
                    }
                    let value = mount.bytes[i];
                    if self.config.send_abs_values {
                        let value = i64::try_from(value).unwrap_or(i64::MAX);
                        out.push(
                            Sample::new(format!("nfsio_{name}"), &tags, Value::Int(value))
                                .unit("bytes"),
                        );
                    }
                    if self.config.send_derived_values
                        && let (Some(seconds), Some(delta)) =
                            (seconds, counter_delta(old[i], value))
                    {
                        let unit = if name.starts_with("page") {
                            "4K_pages/s"
                        } else {
                            "bytes/sec"
                        };
                        out.push(
                            Sample::new(
                                format!("nfsio_{name}_bw"),
                                &tags,
                                Value::Float(delta as f64 / seconds),
                            )
                            .unit(unit),
                        );
                    }
                }
            }
            current.insert(key.to_string(), mount.bytes);
        }
        self.previous = current;
        self.previous_ns = Some(now_ns);
        Ok(())
    }
}
