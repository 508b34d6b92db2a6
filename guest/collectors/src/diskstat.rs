//! `diskstat`: size and free space of the mounted block-device file systems, as
//! cc-metric-collector reports them. The mount table (`/proc/self/mounts`, served by the
//! agent to a plugin granted `capabilities.mount-info`) names the file systems: lines whose
//! device starts with `/dev`, not a loop device, not mounted on a path containing `boot`,
//! and not matching `exclude_mounts`; the host's `statvfs` measures each. Per file system
//! `disk_total` and `disk_free` (whole gigabytes, 10^9 bytes, unsigned as Go's `uint64`,
//! unit `GBytes`, tags `type=node`, `device=<device path>`, e.g. `/dev/vda1`), then
//! `part_max_used` (integer percent of the fullest one, 0 when there is none, unit
//! `percent`, `type=node`). Free space is what `statvfs` calls free (`f_bfree`, including
//! the blocks reserved for root).
//!
//! Without the mount table (an agent or configuration without the grant), the collector
//! falls back to its earlier form: the configured `mount_points` (default `/`), each granted
//! in `capabilities.read-files` and tagged `device=<mount point>`.

use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;

use crate::{Collector, Files, FsStats, Sample, Value, mounts};

/// Settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// `mount_points`: the file systems to report when the mount table is not granted
    /// (default `["/"]`); each must be granted in `capabilities.read-files`.
    pub mount_points: Vec<String>,
    /// `exclude_mounts`: mount points containing one of these strings are skipped.
    pub exclude_mounts: Vec<String>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            mount_points: alloc::vec!["/".to_string()],
            exclude_mounts: Vec::new(),
        }
    }
}

/// The `diskstat` collector.
#[derive(Debug, Default)]
pub struct Diskstat {
    config: Config,
}

impl Diskstat {
    /// A collector with these settings.
    pub fn new(config: Config) -> Diskstat {
        Diskstat { config }
    }

    fn excluded(&self, mount_point: &str) -> bool {
        self.config
            .exclude_mounts
            .iter()
            .any(|e| mount_point.contains(e.as_str()))
    }
}

const GB: u64 = 1_000_000_000;

/// `(total, free)` in whole gigabytes, `None` for a file system without blocks.
fn gigabytes(stats: &FsStats) -> Option<(u64, u64)> {
    if stats.blocks == 0 || stats.block_size == 0 {
        return None;
    }
    let total = stats.blocks.saturating_mul(stats.block_size) / GB;
    let free = stats.blocks_free.saturating_mul(stats.block_size) / GB;
    Some((total, free))
}

/// Whether cc-metric-collector reports a mount table entry (before `exclude_mounts`).
pub fn reported(mount: &mounts::Mount) -> bool {
    mount.device.starts_with("/dev")
        && !mount.device.contains("loop")
        && !mount.mount_point.contains("boot")
}

impl Collector for Diskstat {
    fn name(&self) -> &'static str {
        "diskstat"
    }

    fn collect(
        &mut self,
        files: &mut dyn Files,
        _now_ns: i64,
        out: &mut Vec<Sample>,
    ) -> Result<(), String> {
        // (device tag, mount point), and whether they come from the mount table.
        let (targets, from_table): (Vec<(String, String)>, bool) = match files.read(mounts::PATH) {
            Ok(text) => (
                mounts::parse(&text)?
                    .into_iter()
                    .filter(|m| reported(m) && !self.excluded(&m.mount_point))
                    .map(|m| (m.device, m.mount_point))
                    .collect(),
                true,
            ),
            Err(_) => (
                self.config
                    .mount_points
                    .iter()
                    .filter(|m| !self.excluded(m))
                    .map(|m| (m.clone(), m.clone()))
                    .collect(),
                false,
            ),
        };
        let mut max_used = 0u64;
        for (device, mount_point) in &targets {
            let stats = match files.statvfs(mount_point) {
                Ok(stats) => stats,
                // As cc-metric-collector does, a file system of the table that statfs
                // fails on (unmounted since, not accessible) is skipped; a configured one
                // is the operator's mistake and named.
                Err(_) if from_table => continue,
                Err(e) => return Err(format!("statvfs {mount_point}: {e}")),
            };
            let Some((total, free)) = gigabytes(&stats) else {
                continue;
            };
            let tags = [("type", "node"), ("device", device.as_str())];
            out.push(Sample::new("disk_total", &tags, Value::Uint(total)).unit("GBytes"));
            out.push(Sample::new("disk_free", &tags, Value::Uint(free)).unit("GBytes"));
            if let Some(used) = (100 * (total - free.min(total))).checked_div(total) {
                max_used = max_used.max(used);
            }
        }
        let max_used = i64::try_from(max_used).map_err(|_| format!("{max_used} percent"))?;
        out.push(
            Sample::new("part_max_used", &[("type", "node")], Value::Int(max_used)).unit("percent"),
        );
        Ok(())
    }
}
