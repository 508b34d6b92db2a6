//! The node collectors of ccfleet's collector plugins, as plain Rust.
//!
//! Each collector takes the contents of `/proc` and `/sys` files (through [`Files`]) and its
//! own previous state, and returns [`Sample`]s named, tagged and typed as ClusterCockpit's
//! `cc-metric-collector` emits them, so cc-metric-store and cc-backend know them. Nothing here
//! depends on WebAssembly: the plugins in `guest/plugins/` wrap a [`Runner`] around
//! [`Files`] backed by the agent's `cc:fleet/files` interface, and the host's benchmarks run
//! the very same code natively over a directory of fixtures.
//!
//! Rates are computed from counter deltas between two calls, over the time between the two
//! `now_ns` values the caller passes, so the first call only records a baseline. A counter
//! that went backwards is taken as a 32-bit wrap when the old value fits in 32 bits, and as
//! a reset otherwise (no rate that round, the new value is the baseline). Devices, CPUs and
//! NUMA domains that appear get a baseline; those that disappear are forgotten.
//!
//! Collectors of what only a vendor tool reports (`ipmitool`, `lctl`, `mmpmon`, `ps`, ...)
//! implement [`CommandCollector`] instead: they run the commands the agent's configuration
//! grants the plugin, by grant name, through [`Commands`], and parse what they wrote.
//!
//! `nvidia` reads NVIDIA GPUs through [`nvidia::Gpus`], which the agent serves from the NVML
//! library it loads for the plugin (a native library a plugin cannot call); `rocm_smi` reads
//! AMD GPUs through [`rocm_smi::AmdGpus`], served from the ROCm SMI library likewise.
#![no_std]
#![warn(missing_docs)]

extern crate alloc;

use alloc::borrow::ToOwned;
use alloc::string::String;
use alloc::vec::Vec;

pub mod beegfs;
#[cfg(feature = "json")]
pub mod config;
pub mod cpufreq;
pub mod cpufreq_cpuinfo;
pub mod cpustat;
pub mod customcmd;
pub mod diskstat;
pub mod gpfs;
pub mod ibstat;
pub mod iostat;
pub mod ipmistat;
pub mod likwid;
pub mod lineproto;
pub mod loadavg;
pub mod lustrestat;
pub mod memstat;
pub mod mounts;
pub mod netstat;
pub mod nfsiostat;
pub mod nfsstat;
pub mod numastats;
pub mod nvidia;
pub mod rapl;
#[cfg(test)]
mod robustness;
pub mod rocm_smi;
pub mod schedstat;
pub mod slurm_cgroup;
pub mod smartmon;
pub mod tempstat;
pub mod topprocs;

/// What `statvfs(3)` says about a file system, as the host's `cc:fleet/files` returns it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FsStats {
    /// The fragment size (`f_frsize`), the unit of the block counts.
    pub block_size: u64,
    /// Size of the file system in blocks.
    pub blocks: u64,
    /// Free blocks.
    pub blocks_free: u64,
    /// Free blocks available to unprivileged users.
    pub blocks_available: u64,
}

/// Where a collector reads host files from: the agent's `cc:fleet/files` in a plugin, a
/// directory of fixtures natively. Paths are absolute host paths such as `/proc/stat`.
pub trait Files {
    /// The whole file as text.
    fn read(&mut self, path: &str) -> Result<String, String>;
    /// The names in a directory, sorted.
    fn list_dir(&mut self, path: &str) -> Result<Vec<String>, String>;
    /// `statvfs(3)` of the file system holding `path`.
    fn statvfs(&mut self, path: &str) -> Result<FsStats, String>;
}

/// What a granted command wrote, as the agent's `cc:fleet/commands` returns it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CommandOutput {
    /// The exit status; `None` when a signal ended the command.
    pub status: Option<i32>,
    /// Standard output.
    pub stdout: Vec<u8>,
    /// Standard error.
    pub stderr: Vec<u8>,
}

/// Where a collector runs commands: the agent's `cc:fleet/commands` in a plugin (each name
/// a grant of the plugin's `capabilities.run`: a fixed executable and arguments the operator
/// chose), recorded outputs natively.
pub trait Commands {
    /// Runs the command granted as `name`; an error when it is not granted, cannot start,
    /// times out or writes more than its cap. A command that ran and failed is an `Ok`
    /// with its status.
    fn run(&mut self, name: &str) -> Result<CommandOutput, String>;
}

/// The most bytes of a command's standard error quoted in an error message.
const STDERR_QUOTED: usize = 200;

/// `text` cut to at most `max` bytes (at a character boundary), escaped for a message.
pub fn quoted(text: &str, max: usize) -> String {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let more = if end < text.len() { "..." } else { "" };
    alloc::format!("{:?}{more}", &text[..end])
}

/// Runs the command granted as `name` and returns its standard output as text: an error
/// naming the grant when it cannot run, exits with a status other than 0 (quoting the
/// start of its standard error) or writes something that is not UTF-8.
pub fn run_text(commands: &mut dyn Commands, name: &str) -> Result<String, String> {
    let output = commands
        .run(name)
        .map_err(|e| alloc::format!("command {name}: {e}"))?;
    if output.status != Some(0) {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let status = match output.status {
            Some(code) => alloc::format!("exited with status {code}"),
            None => "was ended by a signal".to_owned(),
        };
        return Err(alloc::format!(
            "command {name} {status}; standard error: {}",
            quoted(stderr.trim(), STDERR_QUOTED)
        ));
    }
    String::from_utf8(output.stdout)
        .map_err(|e| alloc::format!("command {name}: its output is not UTF-8 ({e})"))
}

/// Refuses output that ends inside a line: the tools the collectors read end every line,
/// so a last line without its newline was cut short (and would pass for a shorter value).
pub fn whole_lines(text: &str) -> Result<(), String> {
    if text.is_empty() || text.ends_with('\n') {
        Ok(())
    } else {
        let last = text.rsplit('\n').next().unwrap_or_default();
        Err(alloc::format!(
            "the output ends inside a line (cut short): {}",
            quoted(last, 80)
        ))
    }
}

/// The longest grant name the agent accepts, in bytes.
pub const MAX_GRANT_NAME: usize = 64;

/// The grant name a collector derives for one of several like things it finds at run time
/// (a disk, a mount point): `prefix` and the components of `path` joined by `-`, with each
/// character a grant name cannot hold (anything but letters, digits, `-`, `_`, `.`) as `_`.
/// `None` when the result is longer than a grant name may be.
pub fn derived_grant(prefix: &str, path: &str) -> Option<String> {
    let mut name = String::from(prefix);
    for part in path.split('/').filter(|p| !p.is_empty()) {
        name.push('-');
        name.extend(part.chars().map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '_'
            }
        }));
    }
    (name.len() <= MAX_GRANT_NAME).then_some(name)
}

/// A metric value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// A float (line protocol without suffix).
    Float(f64),
    /// An integer (line protocol `i`).
    Int(i64),
    /// An unsigned integer (line protocol `u`), where cc-metric-collector sends Go's
    /// `uint64`.
    Uint(u64),
    /// A string (line protocol string field), where cc-metric-collector sends one, as
    /// `topprocs` does.
    Str(String),
}

/// One metric sample: a cc-metric-collector message without its timestamp (the caller's
/// `now_ns` is the time of all samples of one call).
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// The metric name, e.g. `cpu_user`.
    pub name: String,
    /// Tags, e.g. `type=hwthread`, `type-id=3`.
    pub tags: Vec<(String, String)>,
    /// The `unit` meta, e.g. `kB`; a [`Runner`] turns it into a `unit` tag when its
    /// `meta_as_tags` says so. (Collectors that put the unit in a tag, as `cpustat` does,
    /// leave this empty.)
    pub unit: Option<String>,
    /// The value.
    pub value: Value,
}

impl Sample {
    /// A sample with the given tags and no unit.
    pub fn new(name: impl Into<String>, tags: &[(&str, &str)], value: Value) -> Sample {
        Sample {
            name: name.into(),
            tags: tags
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            unit: None,
            value,
        }
    }

    /// Adds a tag.
    pub fn with_tag(mut self, key: &str, value: &str) -> Sample {
        self.tags.push((key.to_owned(), value.to_owned()));
        self
    }

    /// Sets the `unit` meta.
    pub fn unit(mut self, unit: &str) -> Sample {
        self.unit = Some(unit.to_owned());
        self
    }
}

/// One collector: reads its files and appends its samples.
pub trait Collector {
    /// The collector's name as cc-metric-collector spells it, e.g. `cpustat`.
    fn name(&self) -> &'static str;

    /// One collection round at `now_ns` (Unix nanoseconds).
    fn collect(
        &mut self,
        files: &mut dyn Files,
        now_ns: i64,
        out: &mut Vec<Sample>,
    ) -> Result<(), String>;
}

/// One collector of what commands report: runs its granted commands (and reads its files)
/// and appends its samples.
pub trait CommandCollector {
    /// The collector's name as cc-metric-collector spells it, e.g. `ipmistat`.
    fn name(&self) -> &'static str;

    /// One collection round at `now_ns` (Unix nanoseconds).
    fn collect(
        &mut self,
        commands: &mut dyn Commands,
        files: &mut dyn Files,
        now_ns: i64,
        out: &mut Vec<Sample>,
    ) -> Result<(), String>;
}

/// The settings every collector plugin shares.
#[derive(Debug, Clone, PartialEq)]
pub struct Common {
    /// The `hostname` tag; read from `/proc/sys/kernel/hostname` when `None`.
    pub hostname: Option<String>,
    /// The `cluster` tag, if any.
    pub cluster: Option<String>,
    /// Metrics not to send (cc-metric-collector's `exclude_metrics`).
    pub exclude_metrics: Vec<String>,
    /// Meta keys sent as tags (cc-metric-collector's sinks' `meta_as_tags`); only `unit`
    /// exists here. Default: `["unit"]`.
    pub meta_as_tags: Vec<String>,
    /// Extra tags added to every sample (from the service configuration).
    pub extra_tags: Vec<(String, String)>,
}

impl Default for Common {
    fn default() -> Self {
        Common {
            hostname: None,
            cluster: None,
            exclude_metrics: Vec::new(),
            meta_as_tags: alloc::vec!["unit".to_owned()],
            extra_tags: Vec::new(),
        }
    }
}

/// A collector with the shared settings applied: host and cluster tags, excluded metrics,
/// units as tags.
pub struct Runner<C> {
    /// The shared settings.
    pub common: Common,
    /// The collector.
    pub collector: C,
    hostname: Option<String>,
}

impl<C: Collector> Runner<C> {
    /// Wraps `collector`.
    pub fn new(common: Common, collector: C) -> Runner<C> {
        Runner::wrap(common, collector)
    }

    /// One round: the collector's samples, filtered and tagged.
    pub fn collect(&mut self, files: &mut dyn Files, now_ns: i64) -> Result<Vec<Sample>, String> {
        let hostname = self.hostname(files)?.to_owned();
        let mut samples = Vec::new();
        let name = self.collector.name();
        self.collector
            .collect(files, now_ns, &mut samples)
            .map_err(|e| alloc::format!("{name}: {e}"))?;
        Ok(self.finish(hostname, samples))
    }
}

impl<C: CommandCollector> Runner<C> {
    /// One round of a command collector: its samples, filtered and tagged.
    pub fn collect_commands(
        &mut self,
        commands: &mut dyn Commands,
        files: &mut dyn Files,
        now_ns: i64,
    ) -> Result<Vec<Sample>, String> {
        let hostname = self.hostname(files)?.to_owned();
        let mut samples = Vec::new();
        let name = self.collector.name();
        self.collector
            .collect(commands, files, now_ns, &mut samples)
            .map_err(|e| alloc::format!("{name}: {e}"))?;
        Ok(self.finish(hostname, samples))
    }
}

impl<C: nvidia::GpuCollector> Runner<C> {
    /// One round of a GPU collector: its samples, filtered and tagged.
    pub fn collect_gpus(
        &mut self,
        gpus: &mut dyn nvidia::Gpus,
        files: &mut dyn Files,
        now_ns: i64,
    ) -> Result<Vec<Sample>, String> {
        let hostname = self.hostname(files)?.to_owned();
        let mut samples = Vec::new();
        let name = self.collector.name();
        self.collector
            .collect(gpus, now_ns, &mut samples)
            .map_err(|e| alloc::format!("{name}: {e}"))?;
        Ok(self.finish(hostname, samples))
    }
}

impl<C: rocm_smi::AmdGpuCollector> Runner<C> {
    /// One round of an AMD GPU collector: its samples, filtered and tagged; `warn` reports a
    /// GPU left out of the round.
    pub fn collect_amd_gpus(
        &mut self,
        gpus: &mut dyn rocm_smi::AmdGpus,
        files: &mut dyn Files,
        warn: &mut dyn FnMut(&str),
    ) -> Result<Vec<Sample>, String> {
        let hostname = self.hostname(files)?.to_owned();
        let mut samples = Vec::new();
        let name = self.collector.name();
        self.collector
            .collect(gpus, &mut samples, warn)
            .map_err(|e| alloc::format!("{name}: {e}"))?;
        Ok(self.finish(hostname, samples))
    }
}

impl<C: likwid::CounterCollector> Runner<C> {
    /// One round of a performance counter collector: its samples, filtered and tagged.
    pub fn collect_counters(
        &mut self,
        counters: &mut dyn likwid::Counters,
        files: &mut dyn Files,
        warn: &mut dyn FnMut(&str),
    ) -> Result<Vec<Sample>, String> {
        let hostname = self.hostname(files)?.to_owned();
        let mut samples = Vec::new();
        let name = self.collector.name();
        self.collector
            .collect(counters, &mut samples, warn)
            .map_err(|e| alloc::format!("{name}: {e}"))?;
        Ok(self.finish(hostname, samples))
    }
}

impl<C> Runner<C> {
    /// A runner of any collector (the [`Collector`], [`CommandCollector`] and
    /// [`nvidia::GpuCollector`] methods are on the impls bound by them).
    pub fn wrap(common: Common, collector: C) -> Runner<C> {
        let hostname = common.hostname.clone();
        Runner {
            common,
            collector,
            hostname,
        }
    }

    /// The hostname the samples are tagged with, reading it on first use.
    pub fn hostname(&mut self, files: &mut dyn Files) -> Result<&str, String> {
        if self.hostname.is_none() {
            let text = files
                .read("/proc/sys/kernel/hostname")
                .map_err(|e| alloc::format!("cannot read the hostname (give `hostname`): {e}"))?;
            self.hostname = Some(text.trim().to_owned());
        }
        Ok(self.hostname.as_deref().unwrap_or_default())
    }

    /// Applies the shared settings to a round's samples.
    fn finish(&self, hostname: String, mut samples: Vec<Sample>) -> Vec<Sample> {
        let unit_as_tag = self.common.meta_as_tags.iter().any(|k| k == "unit");
        samples.retain(|s| !self.common.exclude_metrics.contains(&s.name));
        for sample in &mut samples {
            let mut tags = Vec::with_capacity(sample.tags.len() + 4);
            tags.push(("hostname".to_owned(), hostname.clone()));
            if let Some(cluster) = &self.common.cluster {
                tags.push(("cluster".to_owned(), cluster.clone()));
            }
            tags.append(&mut sample.tags);
            if unit_as_tag && let Some(unit) = &sample.unit {
                tags.push(("unit".to_owned(), unit.clone()));
            }
            for (k, v) in &self.common.extra_tags {
                if !tags.iter().any(|(have, _)| have == k) {
                    tags.push((k.clone(), v.clone()));
                }
            }
            sample.tags = tags;
        }
        samples
    }
}

/// The increase of a counter from `old` to `new`: a 32-bit wrap when `old` fits in 32 bits,
/// `None` (a reset) when it went backwards otherwise.
pub fn counter_delta(old: u64, new: u64) -> Option<u64> {
    if new >= old {
        Some(new - old)
    } else if old <= u64::from(u32::MAX) && new <= u64::from(u32::MAX) {
        Some(u64::from(u32::MAX) - old + new + 1)
    } else {
        None
    }
}

/// Seconds between two `now_ns` values; `None` unless time moved forward.
pub fn seconds_between(old_ns: i64, new_ns: i64) -> Option<f64> {
    (new_ns > old_ns).then(|| (new_ns - old_ns) as f64 / 1e9)
}

/// The number after `prefix` in a name such as `cpu12` or `node0`, if it is all digits.
pub fn index_after<'a>(name: &'a str, prefix: &str) -> Option<&'a str> {
    let rest = name.strip_prefix(prefix)?;
    (!rest.is_empty() && rest.bytes().all(|b| b.is_ascii_digit())).then_some(rest)
}

/// Parses an unsigned decimal, naming the file and what was expected on failure.
pub(crate) fn parse_u64(text: &str, what: &str, path: &str) -> Result<u64, String> {
    text.parse()
        .map_err(|_| alloc::format!("{path}: {what} is not a number: {text:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derived_grants_join_the_path_and_replace_what_a_name_cannot_hold() {
        assert_eq!(
            derived_grant("beegfs-meta", "/mnt/beeond").as_deref(),
            Some("beegfs-meta-mnt-beeond")
        );
        assert_eq!(
            derived_grant("smartctl", "nvme0").as_deref(),
            Some("smartctl-nvme0")
        );
        assert_eq!(
            derived_grant("x", "/a b/c:d//").as_deref(),
            Some("x-a_b-c_d")
        );
        assert_eq!(derived_grant("x", &"y".repeat(63)), None);
        assert!(derived_grant("x", &"y".repeat(62)).is_some());
    }

    #[test]
    fn counters_wrap_at_32_bits_and_reset_above() {
        assert_eq!(counter_delta(10, 15), Some(5));
        assert_eq!(counter_delta(u64::from(u32::MAX) - 1, 3), Some(5));
        assert_eq!(counter_delta(1 << 40, 5), None);
    }
}
