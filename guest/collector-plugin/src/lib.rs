//! The plugin side of the collectors: [`CollectorPlugin`] runs a collector of
//! `ccfleet-collectors` inside a ccfleet plugin, and [`export_collector!`] exports it.
//!
//! The plugin's `init` configuration holds cc-metric-collector's keys for the collector plus
//! `hostname`, `cluster`, `exclude_metrics` and `meta_as_tags` (default `["unit"]`); the
//! service configuration may add tags under `{"<collector>": {"tags": {...}}}`, applied live.
//! Files are read through the agent's `cc:fleet/files`, which maps them under the plugin's
//! `capabilities.files-root` when one is set (fixtures), so the collector always asks for
//! `/proc/...` and `/sys/...`.
#![no_std]
#![warn(missing_docs)]

extern crate alloc;

use alloc::string::String;
use alloc::vec::Vec;

use ccfleet_collectors::config::{FromOptions, Options, common, extra_tags};
use ccfleet_collectors::{Collector, Files, FsStats, Runner, Sample, Value};
use ccfleet_guest::lineproto::FieldRef;
use ccfleet_guest::{ConfigUpdate, Level, Lines, log};

pub use ccfleet_guest;

/// [`Files`] through the agent's `cc:fleet/files`.
pub struct HostFiles;

impl Files for HostFiles {
    fn read(&mut self, path: &str) -> Result<String, String> {
        ccfleet_guest::read_to_string(path).map_err(|e| alloc::format!("cannot read {path}: {e}"))
    }

    fn list_dir(&mut self, path: &str) -> Result<Vec<String>, String> {
        ccfleet_guest::list_dir(path).map_err(|e| alloc::format!("cannot list {path}: {e}"))
    }

    fn statvfs(&mut self, path: &str) -> Result<FsStats, String> {
        let s = ccfleet_guest::statvfs(path)?;
        Ok(FsStats {
            block_size: s.block_size,
            blocks: s.blocks,
            blocks_free: s.blocks_free,
            blocks_available: s.blocks_available,
        })
    }
}

/// A collector as a plugin.
pub struct CollectorPlugin<C> {
    runner: Runner<C>,
    /// The round's points as line protocol, kept (empty) for the next round.
    lines: Lines,
}

/// Encodes a sample at `now_ns` into `lines`.
pub fn encode(lines: &mut Lines, sample: &Sample, now_ns: i64) -> Result<(), String> {
    let value = match sample.value {
        Value::Float(v) => FieldRef::Float(v),
        Value::Int(v) => FieldRef::Int(v),
        Value::Uint(v) => FieldRef::Uint(v),
    };
    lines.point(
        &sample.name,
        &sample.tags,
        &[("value", value)],
        Some(now_ns),
    )
}

impl<C: Collector + FromOptions> ccfleet_guest::Plugin for CollectorPlugin<C> {
    fn init(config: &str) -> Result<Self, String> {
        let mut options = Options::parse(C::NAME, config)?;
        let shared = common(&mut options)?;
        let collector = C::from_options(&mut options)?.with_common(&shared);
        options.finish()?;
        let mut runner = Runner::new(shared, collector);
        let hostname = runner.hostname(&mut HostFiles)?;
        log!(Level::Info, "{} ready as host {hostname}", C::NAME);
        Ok(CollectorPlugin {
            runner,
            lines: Lines::new(),
        })
    }

    fn on_config(&mut self, update: ConfigUpdate) -> Result<(), String> {
        let Some(text) = update.config else {
            return Ok(());
        };
        let tags = extra_tags(C::NAME, &text)?;
        if tags != self.runner.common.extra_tags {
            let shown: Vec<String> = tags
                .iter()
                .map(|(k, v)| alloc::format!("{k}={v}"))
                .collect();
            log!(
                Level::Info,
                "config revision {}: extra tags [{}]",
                update.revision,
                shown.join(", ")
            );
            self.runner.common.extra_tags = tags;
        }
        Ok(())
    }

    fn collect(&mut self, now_ns: i64) -> Result<(), String> {
        let samples = self.runner.collect(&mut HostFiles, now_ns)?;
        for sample in &samples {
            if let Err(reason) = encode(&mut self.lines, sample, now_ns) {
                self.lines.clear();
                return Err(reason);
            }
        }
        self.lines.emit()
    }
}

/// Exports a collector type of `ccfleet-collectors` as this component's plugin:
/// `ccfleet_collector_plugin::export_collector!(ccfleet_collectors::cpustat::Cpustat);`.
#[macro_export]
macro_rules! export_collector {
    ($collector:ty) => {
        type __Exported = $crate::CollectorPlugin<$collector>;
        $crate::ccfleet_guest::export_plugin!(__Exported);
    };
}
