//! `nfs3stat` and `nfs4stat`: the NFS client's calls per operation since the previous round,
//! as cc-metric-collector reports them from `nfsstat -l --all`, read here straight from the
//! file `nfsstat` reads, `/proc/net/rpc/nfs` (so no nfs-utils are needed).
//!
//! The `proc3` and `proc4` lines of that file hold one counter per operation, in the order
//! of nfs-utils' operation names ([`NFS3_NAMES`], [`NFS4_NAMES`]; counters beyond the names
//! are not shown by nfsstat either). Each round sends `nfs3_<operation>` (or `nfs4_...`) as
//! an integer, the increase since the previous round (tags `type=node`, no unit), and
//! `nfs3_total`, the increase of the sum of all operations. As `nfsstat -l` lists only
//! operations whose count is not zero (and `total` only when the sum is not), an operation
//! is sent only when its counter was non-zero in both rounds, exactly the series
//! cc-metric-collector sends. The counters are 32-bit: an increase across a wrap is counted
//! as one.
//!
//! The names are those of current nfs-utils, which name every NFSv4 operation the kernel
//! counts (through `read_plus`). An older `nfsstat` that lacks the NFSv4.2 names (`copy`,
//! `offload_cancel`, `copy_notify`, the xattr operations) shows neither those counters nor
//! their calls in its `total`; they are sent here all the same, since the kernel counts
//! them, so `nfs4_total` can be larger than such an `nfsstat`'s by those calls.

use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;

use crate::{Collector, Files, Sample, Value, counter_delta, parse_u64};

/// The file read.
pub const PATH: &str = "/proc/net/rpc/nfs";

/// nfs-utils' names of the NFSv3 client operations, in the kernel's order.
pub const NFS3_NAMES: [&str; 22] = [
    "null",
    "getattr",
    "setattr",
    "lookup",
    "access",
    "readlink",
    "read",
    "write",
    "create",
    "mkdir",
    "symlink",
    "mknod",
    "remove",
    "rmdir",
    "rename",
    "link",
    "readdir",
    "readdirplus",
    "fsstat",
    "fsinfo",
    "pathconf",
    "commit",
];

/// nfs-utils' names of the NFSv4 client operations (4.0, 4.1, 4.2), in the kernel's order.
pub const NFS4_NAMES: [&str; 69] = [
    "null",
    "read",
    "write",
    "commit",
    "open",
    "open_conf",
    "open_noat",
    "open_dgrd",
    "close",
    "setattr",
    "fsinfo",
    "renew",
    "setclntid",
    "confirm",
    "lock",
    "lockt",
    "locku",
    "access",
    "getattr",
    "lookup",
    "lookup_root",
    "remove",
    "rename",
    "link",
    "symlink",
    "create",
    "pathconf",
    "statfs",
    "readlink",
    "readdir",
    "server_caps",
    "delegreturn",
    "getacl",
    "setacl",
    "fs_locations",
    "rel_lkowner",
    "secinfo",
    "fsid_present",
    "exchange_id",
    "create_session",
    "destroy_session",
    "sequence",
    "get_lease_time",
    "reclaim_comp",
    "layoutget",
    "getdevinfo",
    "layoutcommit",
    "layoutreturn",
    "secinfo_no",
    "test_stateid",
    "free_stateid",
    "getdevicelist",
    "bind_conn_to_ses",
    "destroy_clientid",
    "seek",
    "allocate",
    "deallocate",
    "layoutstats",
    "clone",
    "copy",
    "offload_cancel",
    "lookupp",
    "layouterror",
    "copy_notify",
    "getxattr",
    "setxattr",
    "listxattrs",
    "removexattr",
    "read_plus",
];

/// Which protocol version a collector reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    /// `nfs3stat`: the `proc3` line, metrics `nfs3_*`.
    V3,
    /// `nfs4stat`: the `proc4` line, metrics `nfs4_*`.
    V4,
}

impl Version {
    fn line(self) -> &'static str {
        match self {
            Version::V3 => "proc3",
            Version::V4 => "proc4",
        }
    }

    /// The metric prefix, `nfs3` or `nfs4`.
    pub fn prefix(self) -> &'static str {
        match self {
            Version::V3 => "nfs3",
            Version::V4 => "nfs4",
        }
    }

    /// nfs-utils' operation names.
    pub fn names(self) -> &'static [&'static str] {
        match self {
            Version::V3 => &NFS3_NAMES,
            Version::V4 => &NFS4_NAMES,
        }
    }
}

/// The counters of one version's line, one per name of [`Version::names`] (missing ones
/// read 0, as nfsstat reads them). `None` when the file has no such line (no client of
/// that version since boot).
pub fn parse(text: &str, version: Version) -> Result<Option<Vec<u64>>, String> {
    let Some(line) = text
        .lines()
        .find(|l| l.split_ascii_whitespace().next() == Some(version.line()))
    else {
        return Ok(None);
    };
    let mut fields = line.split_ascii_whitespace().skip(1);
    let count = fields
        .next()
        .ok_or_else(|| format!("{PATH}: {} has no counter count", version.line()))?;
    let count = parse_u64(count, "the counter count", PATH)?;
    let values: Vec<&str> = fields.collect();
    if values.len() as u64 != count {
        return Err(format!(
            "{PATH}: {} announces {count} counters but has {}",
            version.line(),
            values.len()
        ));
    }
    let names = version.names();
    let mut counters = alloc::vec![0u64; names.len()];
    for (slot, text) in counters.iter_mut().zip(&values) {
        *slot = parse_u64(text, version.line(), PATH)?;
    }
    Ok(Some(counters))
}

/// The `nfs3stat` / `nfs4stat` collector.
#[derive(Debug)]
pub struct Nfsstat {
    version: Version,
    previous: Option<Vec<u64>>,
}

impl Nfsstat {
    /// A collector of `version` with no baseline yet.
    pub fn new(version: Version) -> Nfsstat {
        Nfsstat {
            version,
            previous: None,
        }
    }
}

impl Collector for Nfsstat {
    fn name(&self) -> &'static str {
        match self.version {
            Version::V3 => "nfs3stat",
            Version::V4 => "nfs4stat",
        }
    }

    fn collect(
        &mut self,
        files: &mut dyn Files,
        _now_ns: i64,
        out: &mut Vec<Sample>,
    ) -> Result<(), String> {
        // A round that fails keeps the previous baseline: the next one counts from it.
        let current = parse(&files.read(PATH)?, self.version)?.unwrap_or_default();
        let prefix = self.version.prefix();
        let tags = [("type", "node")];
        if let Some(previous) = &self.previous {
            let mut total = 0u64;
            for (i, name) in self.version.names().iter().enumerate() {
                let (old, new) = (
                    previous.get(i).copied().unwrap_or(0),
                    current.get(i).copied().unwrap_or(0),
                );
                let delta = counter_delta(old, new).unwrap_or(0);
                total = total.saturating_add(delta);
                if old != 0 && new != 0 {
                    let delta = i64::try_from(delta).unwrap_or(i64::MAX);
                    out.push(Sample::new(
                        format!("{prefix}_{name}"),
                        &tags,
                        Value::Int(delta),
                    ));
                }
            }
            let old_total: u64 = previous.iter().sum();
            let new_total: u64 = current.iter().sum();
            if old_total != 0 && new_total != 0 {
                let total = i64::try_from(total).unwrap_or(i64::MAX);
                out.push(Sample::new(
                    format!("{prefix}_total"),
                    &tags,
                    Value::Int(total),
                ));
            }
        }
        self.previous = Some(current);
        Ok(())
    }
}

/// `nfs3stat`: [`Nfsstat`] of NFSv3.
#[derive(Debug)]
pub struct Nfs3stat(pub Nfsstat);

/// `nfs4stat`: [`Nfsstat`] of NFSv4.
#[derive(Debug)]
pub struct Nfs4stat(pub Nfsstat);

impl Default for Nfs3stat {
    fn default() -> Self {
        Nfs3stat(Nfsstat::new(Version::V3))
    }
}

impl Default for Nfs4stat {
    fn default() -> Self {
        Nfs4stat(Nfsstat::new(Version::V4))
    }
}

impl Collector for Nfs3stat {
    fn name(&self) -> &'static str {
        self.0.name()
    }

    fn collect(
        &mut self,
        files: &mut dyn Files,
        now_ns: i64,
        out: &mut Vec<Sample>,
    ) -> Result<(), String> {
        self.0.collect(files, now_ns, out)
    }
}

impl Collector for Nfs4stat {
    fn name(&self) -> &'static str {
        self.0.name()
    }

    fn collect(
        &mut self,
        files: &mut dyn Files,
        now_ns: i64,
        out: &mut Vec<Sample>,
    ) -> Result<(), String> {
        self.0.collect(files, now_ns, out)
    }
}
