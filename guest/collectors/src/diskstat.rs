//! `diskstat`: size and free space of file systems, through the host's `statvfs` (the
//! mount table is a per-process file that plugins may not read, so the mount points are
//! configured). Per mount point `disk_total` and `disk_free` (whole gigabytes, 10^9 bytes,
//! integers, unit `GBytes`, tags `type=node`, `device=<mount point>`), and `part_max_used`
//! (integer percent of the fullest one, unit `percent`, `type=node`). Free space is what
//! `statvfs` calls free (`f_bfree`, including the blocks reserved for root).

use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;

use crate::{Collector, Files, Sample, Value};

/// Settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// `mount_points`: the file systems to report (default `["/"]`); each must be granted.
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
}

const GB: u64 = 1_000_000_000;

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
        let mut max_used: Option<u64> = None;
        for mount in &self.config.mount_points {
            if self
                .config
                .exclude_mounts
                .iter()
                .any(|e| mount.contains(e.as_str()))
            {
                continue;
            }
            let stats = files
                .statvfs(mount)
                .map_err(|e| format!("statvfs {mount}: {e}"))?;
            if stats.blocks == 0 || stats.block_size == 0 {
                continue;
            }
            let total = stats.blocks.saturating_mul(stats.block_size) / GB;
            let free = stats.blocks_free.saturating_mul(stats.block_size) / GB;
            let tags = [("type", "node"), ("device", mount.as_str())];
            out.push(Sample::new("disk_total", &tags, Value::Int(total as i64)).unit("GBytes"));
            out.push(Sample::new("disk_free", &tags, Value::Int(free as i64)).unit("GBytes"));
            if let Some(used) = (100 * (total - free.min(total))).checked_div(total) {
                max_used = Some(max_used.map_or(used, |m| m.max(used)));
            }
        }
        if let Some(used) = max_used {
            out.push(
                Sample::new(
                    "part_max_used",
                    &[("type", "node")],
                    Value::Int(used as i64),
                )
                .unit("percent"),
            );
        }
        Ok(())
    }
}
