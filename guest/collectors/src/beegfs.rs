//! `beegfs_meta` and `beegfs_storage`: the operation counters BeeGFS's metadata and storage
//! servers keep for the clients of each BeeGFS on Demand (BeeOND) file system mounted here,
//! from `beegfs-ctl --clientstats`, as cc-metric-collector reports them: the summary line
//! (`Sum:`, over all clients) as one float per operation named `beegfs_cmeta_<op>` or
//! `beegfs_cstorage_<op>` with BeeGFS's name of the operation (`beegfs_cmeta_open`,
//! `beegfs_cstorage_ops-rd`, `beegfs_cstorage_MiB-rd/s`), tags `type=node`,
//! `filesystem=<mount point>`; no unit.
//!
//! The file systems are those of the mount table (`/proc/self/mounts`, which the agent
//! serves to a plugin granted `capabilities.mount-info`) whose source contains
//! `beegfs_ondemand`, as cc-metric-collector finds them, less `exclude_filesystem`. A
//! grant has fixed arguments while `beegfs-ctl` needs the mount point in them, so each mount
//! point has a grant of its own (`capabilities.run`), by default named after it:
//! `beegfs-meta-` / `beegfs-storage-` followed by the mount point's components joined by
//! `-` (`/mnt/beeond` → `beegfs-meta-mnt-beeond`; characters a grant name cannot hold become
//! `_`), or the name `mount_commands` gives it (`{"/mnt/beeond": "beeond-meta"}`):
//!
//! ```json
//! {"beegfs-meta-mnt-beeond": {"path": "/usr/bin/beegfs-ctl",
//!   "args": ["--clientstats", "--nodetype=meta", "--mount=/mnt/beeond", "--allstats"]}}
//! ```
//!
//! These are cc-metric-collector's arguments: `beegfs-ctl` prints the counters since the
//! servers started and, its standard input being empty, stops instead of repeating them
//! every interval. (`--interval=0` does the same without the banner; the storage byte
//! counters are then `MiB-rd`/`MiB-wr` rather than the `MiB-rd/s`/`MiB-wr/s` of the first
//! interval.) The statistics need root: the agent runs as root or the grant has a `user`
//! allowed to query them.
//!
//! `exclude_metrics` (the shared key) takes BeeGFS's operation names, as in
//! cc-metric-collector: those operations are summed into `<prefix>other` instead, with any
//! operation this version does not know (newer servers print a number for them); `other`
//! is sent when something was summed into it or something is excluded. Full metric names
//! in `exclude_metrics` drop the metric as for every collector. A mount point whose
//! command fails, prints something that is not `--clientstats` output, or stops inside a
//! line fails the round (after the other mount points were tried), naming its grant and
//! the line; so does a mount point without a grant, naming the grant to add. A file
//! system whose servers have no client statistics yet (no `Sum:` line) sends nothing.

use alloc::borrow::ToOwned;
use alloc::collections::BTreeMap;
use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;

use crate::{CommandCollector, Commands, Files, Sample, Value, mounts, quoted, run_text};

/// The metadata servers' operations, as `beegfs-ctl` names them.
pub const META_OPS: [&str; 39] = [
    "sum",
    "ack",
    "close",
    "entInf",
    "fndOwn",
    "mkdir",
    "create",
    "rddir",
    "refrEnt",
    "mdsInf",
    "rmdir",
    "rmLnk",
    "mvDirIns",
    "mvFiIns",
    "open",
    "ren",
    "sChDrct",
    "sAttr",
    "sDirPat",
    "stat",
    "statfs",
    "trunc",
    "symlnk",
    "unlnk",
    "lookLI",
    "statLI",
    "revalLI",
    "openLI",
    "createLI",
    "hardlnk",
    "flckAp",
    "flckEn",
    "flckRg",
    "dirparent",
    "listXA",
    "getXA",
    "rmXA",
    "setXA",
    "mirror",
];

/// The storage servers' operations, as `beegfs-ctl` names them; the byte counters in each
/// form its `--rwunit`, `--interval` and `--perinterval` give them.
pub const STORAGE_OPS: [&str; 24] = [
    "sum", "ack", "sChDrct", "getFSize", "sAttr", "statfs", "trunc", "close", "fsync", "ops-rd",
    "MiB-rd/s", "ops-wr", "MiB-wr/s", "gendbg", "hrtbeat", "remNode", "storInf", "unlnk", "MiB-rd",
    "MiB-wr", "B-rd", "B-wr", "B-rd/s", "B-wr/s",
];

/// Which servers' statistics a collector reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeType {
    /// Metadata servers (`beegfs_meta`).
    Meta,
    /// Storage servers (`beegfs_storage`).
    Storage,
}

impl NodeType {
    /// The collector's name.
    pub fn collector(self) -> &'static str {
        match self {
            NodeType::Meta => "beegfs_meta",
            NodeType::Storage => "beegfs_storage",
        }
    }

    /// The prefix of the metric names.
    pub fn prefix(self) -> &'static str {
        match self {
            NodeType::Meta => "beegfs_cmeta_",
            NodeType::Storage => "beegfs_cstorage_",
        }
    }

    /// The operations sent under their own name.
    pub fn ops(self) -> &'static [&'static str] {
        match self {
            NodeType::Meta => &META_OPS,
            NodeType::Storage => &STORAGE_OPS,
        }
    }

    /// The first part of the default grant names.
    pub fn grant_prefix(self) -> &'static str {
        match self {
            NodeType::Meta => "beegfs-meta",
            NodeType::Storage => "beegfs-storage",
        }
    }

    /// `beegfs-ctl`'s `--nodetype`.
    pub fn nodetype(self) -> &'static str {
        match self {
            NodeType::Meta => "meta",
            NodeType::Storage => "storage",
        }
    }

    /// The default grant of a mount point; `None` when it would be too long a name.
    pub fn default_grant(self, mount_point: &str) -> Option<String> {
        crate::derived_grant(self.grant_prefix(), mount_point)
    }
}

/// Settings (cc-metric-collector's keys; `mount_commands` is this collector's own).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Config {
    /// `exclude_filesystem`: mount points not reported.
    pub exclude_filesystem: Vec<String>,
    /// `exclude_metrics`: operations summed into `other` instead.
    pub exclude_metrics: Vec<String>,
    /// `mount_commands`: the grant of a mount point, where not the default one.
    pub mount_commands: BTreeMap<String, String>,
}

/// One line of counters: the operations and their values, in the order printed.
pub type Counters = Vec<(String, f64)>;

/// What `beegfs-ctl --clientstats` printed for its first batch.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Clientstats {
    /// The `Sum:` line, if there was one (none when no client has statistics).
    pub sum: Option<Counters>,
    /// The lines per client (IP address, or host name with `--names`).
    pub clients: Vec<(String, Counters)>,
}

/// A value as `beegfs-ctl` prints it: an integer, or a decimal or exponent form for the
/// byte counters; never `nan` or `inf`.
fn number(token: &str) -> Option<f64> {
    let plain = !token.is_empty()
        && token
            .bytes()
            .all(|b| b.is_ascii_digit() || matches!(b, b'.' | b'-' | b'+' | b'e'));
    plain
        .then(|| token.parse::<f64>().ok())
        .flatten()
        .filter(|v| v.is_finite())
}

/// Parses `beegfs-ctl --clientstats` output: the banner and `====== N s ======` line it
/// prints when running at an interval are skipped and only the first batch is read (the
/// counters since the servers started; later batches are increases).
pub fn parse(text: &str) -> Result<Clientstats, String> {
    crate::whole_lines(text)?;
    let mut out = Clientstats::default();
    let mut batches = 0;
    for line in text.lines() {
        let trimmed = line.trim();
        if trimmed.is_empty() || trimmed.starts_with('*') || trimmed.starts_with("Warning: ") {
            continue;
        }
        if trimmed.starts_with("======") && trimmed.ends_with("======") {
            batches += 1;
            if batches > 1 {
                break;
            }
            continue;
        }
        let bad = || {
            format!(
                "not a line of beegfs-ctl --clientstats: {}",
                quoted(line, 120)
            )
        };
        let tokens: Vec<&str> = trimmed.split_ascii_whitespace().collect();
        let (id, pairs) = tokens.split_first().ok_or_else(bad)?;
        if pairs.is_empty() || !pairs.len().is_multiple_of(2) {
            return Err(bad());
        }
        let mut counters = Vec::with_capacity(pairs.len() / 2);
        for pair in pairs.chunks(2) {
            let value = number(pair[0]).ok_or_else(bad)?;
            let name = pair[1]
                .strip_prefix('[')
                .and_then(|n| n.strip_suffix(']'))
                .filter(|n| !n.is_empty() && !n.contains(['[', ']']))
                .ok_or_else(bad)?;
            counters.push((name.to_owned(), value));
        }
        if *id == "Sum:" {
            if out.sum.is_some() {
                return Err(format!("a second Sum: line: {}", quoted(line, 120)));
            }
            out.sum = Some(counters);
        } else {
            out.clients.push(((*id).to_owned(), counters));
        }
    }
    Ok(out)
}

/// The BeeOND mount points of a mount table, in its order, each once.
pub fn beeond_mounts(table: &[mounts::Mount]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for mount in table {
        if mount.device.contains("beegfs_ondemand") && !out.contains(&mount.mount_point) {
            out.push(mount.mount_point.clone());
        }
    }
    out
}

/// The collector of one kind of server.
#[derive(Debug, Clone)]
pub struct Beegfs {
    kind: NodeType,
    config: Config,
}

impl Beegfs {
    /// A collector of `kind` with these settings.
    pub fn new(kind: NodeType, config: Config) -> Beegfs {
        Beegfs { kind, config }
    }

    /// Sets `exclude_metrics` (operation names).
    pub fn exclude_metrics(mut self, names: Vec<String>) -> Beegfs {
        self.config.exclude_metrics = names;
        self
    }

    /// The grant of a mount point.
    pub fn grant(&self, mount_point: &str) -> Result<String, String> {
        if let Some(name) = self.config.mount_commands.get(mount_point) {
            return Ok(name.clone());
        }
        self.kind.default_grant(mount_point).ok_or_else(|| {
            format!(
                "the mount point {} is too long for a grant name: name its grant in \
                 `mount_commands`",
                quoted(mount_point, 120)
            )
        })
    }

    /// The samples of one file system's `Sum:` line.
    pub fn samples(&self, mount_point: &str, sum: &[(String, f64)], out: &mut Vec<Sample>) {
        let tags = [("type", "node"), ("filesystem", mount_point)];
        let prefix = self.kind.prefix();
        let mut other = 0.0;
        let mut any_other = !self.config.exclude_metrics.is_empty();
        for (op, value) in sum {
            let known = self.kind.ops().contains(&op.as_str());
            if known && !self.config.exclude_metrics.contains(op) {
                out.push(Sample::new(
                    format!("{prefix}{op}"),
                    &tags,
                    Value::Float(*value),
                ));
            } else {
                other += value;
                any_other = true;
            }
        }
        if any_other {
            out.push(Sample::new(
                format!("{prefix}other"),
                &tags,
                Value::Float(other),
            ));
        }
    }

    fn collect_all(
        &mut self,
        commands: &mut dyn Commands,
        files: &mut dyn Files,
        out: &mut Vec<Sample>,
    ) -> Result<(), String> {
        let table = files.read(mounts::PATH).map_err(|e| {
            format!("{e} (the plugin needs capabilities.mount-info to find the BeeOND mounts)")
        })?;
        let table = mounts::parse(&table)?;
        let mut round = Vec::new();
        let mut errors = Vec::new();
        for mount_point in beeond_mounts(&table) {
            if self.config.exclude_filesystem.contains(&mount_point) {
                continue;
            }
            let result = self.grant(&mount_point).and_then(|grant| {
                let text = run_text(commands, &grant)
                    .map_err(|e| format!("{e} (the grant of {})", quoted(&mount_point, 120)))?;
                parse(&text).map_err(|e| format!("command {grant}: {e}"))
            });
            match result {
                Ok(stats) => {
                    if let Some(sum) = stats.sum {
                        self.samples(&mount_point, &sum, &mut round);
                    }
                }
                Err(e) if e.contains("not granted") => errors.push(format!(
                    "{e} (grant it, or list the mount point in `exclude_filesystem`)"
                )),
                Err(e) => errors.push(e),
            }
        }
        if !errors.is_empty() {
            return Err(errors.join("; "));
        }
        out.append(&mut round);
        Ok(())
    }
}

/// The `beegfs_meta` collector.
#[derive(Debug, Clone)]
pub struct BeegfsMeta(pub Beegfs);

/// The `beegfs_storage` collector.
#[derive(Debug, Clone)]
pub struct BeegfsStorage(pub Beegfs);

impl Default for BeegfsMeta {
    fn default() -> Self {
        BeegfsMeta(Beegfs::new(NodeType::Meta, Config::default()))
    }
}

impl Default for BeegfsStorage {
    fn default() -> Self {
        BeegfsStorage(Beegfs::new(NodeType::Storage, Config::default()))
    }
}

impl CommandCollector for BeegfsMeta {
    fn name(&self) -> &'static str {
        "beegfs_meta"
    }

    fn collect(
        &mut self,
        commands: &mut dyn Commands,
        files: &mut dyn Files,
        _now_ns: i64,
        out: &mut Vec<Sample>,
    ) -> Result<(), String> {
        self.0.collect_all(commands, files, out)
    }
}

impl CommandCollector for BeegfsStorage {
    fn name(&self) -> &'static str {
        "beegfs_storage"
    }

    fn collect(
        &mut self,
        commands: &mut dyn Commands,
        files: &mut dyn Files,
        _now_ns: i64,
        out: &mut Vec<Sample>,
    ) -> Result<(), String> {
        self.0.collect_all(commands, files, out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const META: &str = "\n          *************************\n          \
        * PRESS ANY KEY TO QUIT *\n          *************************\n\n\
        ====== 0 s ======\n\
        Sum:            1520 [sum]  12 [ack]  310 [close]  2 [40]\n\
        10.10.0.11      1000 [sum]  12 [ack]  200 [close]\n\
        10.10.0.12      520 [sum]  110 [close]  2 [40]\n";

    #[test]
    fn the_first_batch_with_its_sum_and_clients() {
        let got = parse(META).unwrap();
        let sum = got.sum.unwrap();
        assert_eq!(sum[0], ("sum".to_owned(), 1520.0));
        assert_eq!(sum[3], ("40".to_owned(), 2.0));
        assert_eq!(got.clients.len(), 2);
        assert_eq!(got.clients[1].0, "10.10.0.12");
        let second = format!("{META}\n====== 10 s ======\nSum:  5 [sum]\n");
        assert_eq!(parse(&second).unwrap().sum.unwrap()[0].1, 1520.0);
        assert_eq!(
            parse("Sum:   1.5e+06 [MiB-rd/s]\n").unwrap().sum.unwrap()[0].1,
            1.5e6
        );
        assert_eq!(parse("\n").unwrap(), Clientstats::default());
    }

    #[test]
    fn excluded_and_unknown_operations_are_summed_as_other() {
        let sum = parse(META).unwrap().sum.unwrap();
        let collector = Beegfs::new(NodeType::Meta, Config::default())
            .exclude_metrics(alloc::vec!["ack".to_owned()]);
        let mut out = Vec::new();
        collector.samples("/mnt/beeond", &sum, &mut out);
        let names: Vec<&str> = out.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "beegfs_cmeta_sum",
                "beegfs_cmeta_close",
                "beegfs_cmeta_other"
            ]
        );
        assert_eq!(out[2].value, Value::Float(14.0));
    }

    #[test]
    fn garbage_and_cut_lines_are_errors() {
        for (text, needle) in [
            ("Sum: 12 [sum\n", "not a line"),
            ("Sum: 12\n", "not a line"),
            ("Sum: nan [sum]\n", "not a line"),
            ("Error: unable to connect\n", "not a line"),
            ("Sum: 1 [sum]\nSum: 2 [sum]\n", "second Sum:"),
            ("Sum: 1 [sum]", "cut short"),
        ] {
            let err = parse(text).unwrap_err();
            assert!(err.contains(needle), "{text:?}: {err}");
        }
    }
}
