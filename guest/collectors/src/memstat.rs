//! `memstat`: memory figures of the node (`/proc/meminfo`) and, optionally, of each NUMA
//! domain (`/sys/devices/system/node/node<n>/meminfo`, `type=memoryDomain`).
//!
//! Every known key present in the file is emitted under cc-metric-collector's name as a
//! float with the file's unit (`kB`) as `unit` meta; keys without a unit (the huge page
//! counts) have none. `mem_used` is derived as cc-metric-collector does: `MemTotal - MemFree`,
//! and when `Buffers` is known also minus `Buffers`, `Cached` and `Shmem` (those present).
//! The per-domain files have no `Buffers`, so there it is `MemTotal - MemFree`.

use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;

use crate::{Collector, Files, Sample, Value, index_after};

/// The node's file.
pub const PATH: &str = "/proc/meminfo";
/// Where the NUMA domains are listed.
pub const NODE_DIR: &str = "/sys/devices/system/node";

/// `/proc/meminfo` keys and their metric names.
pub const METRICS: [(&str, &str); 32] = [
    ("MemTotal", "mem_total"),
    ("SwapTotal", "swap_total"),
    ("SReclaimable", "mem_sreclaimable"),
    ("Slab", "mem_slab"),
    ("MemFree", "mem_free"),
    ("Buffers", "mem_buffers"),
    ("Cached", "mem_cached"),
    ("MemAvailable", "mem_available"),
    ("SwapFree", "swap_free"),
    ("Shmem", "mem_shared"),
    ("Active", "mem_active"),
    ("Inactive", "mem_inactive"),
    ("Dirty", "mem_dirty"),
    ("Writeback", "mem_writeback"),
    ("AnonPages", "mem_anon_pages"),
    ("Mapped", "mem_mapped"),
    ("VmallocTotal", "mem_vmalloc_total"),
    ("AnonHugePages", "mem_anon_hugepages"),
    ("ShmemHugePages", "mem_shared_hugepages"),
    ("ShmemPmdMapped", "mem_shared_pmd_mapped"),
    ("HugePages_Total", "mem_hugepages_total"),
    ("HugePages_Free", "mem_hugepages_free"),
    ("HugePages_Rsvd", "mem_hugepages_reserved"),
    ("HugePages_Surp", "mem_hugepages_surplus"),
    ("Hugepagesize", "mem_hugepages_size"),
    ("DirectMap4k", "mem_direct_mapped_4k"),
    ("DirectMap4M", "mem_direct_mapped_4m"),
    ("DirectMap2M", "mem_direct_mapped_2m"),
    ("DirectMap1G", "mem_direct_mapped_1g"),
    ("Mlocked", "mem_locked"),
    ("PageTables", "mem_pagetables"),
    ("KernelStack", "mem_kernelstack"),
];

/// Settings (cc-metric-collector's keys).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// `node_stats`: send the node's figures (default true).
    pub node_stats: bool,
    /// `numa_stats`: send each NUMA domain's figures (default false).
    pub numa_stats: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            node_stats: true,
            numa_stats: false,
        }
    }
}

/// The `memstat` collector.
#[derive(Debug, Default)]
pub struct Memstat {
    config: Config,
}

impl Memstat {
    /// A collector with these settings.
    pub fn new(config: Config) -> Memstat {
        Memstat { config }
    }
}

/// One `meminfo` entry: value and unit.
type Entry<'a> = (&'a str, f64, Option<&'a str>);

/// Parses `Key: value [unit]` lines, and the per-domain `Node <n> Key: value [unit]`.
fn parse<'a>(text: &'a str, path: &str) -> Result<Vec<Entry<'a>>, String> {
    let mut entries = Vec::new();
    for line in text.lines() {
        let mut fields: Vec<&str> = line.split_ascii_whitespace().collect();
        if fields.first() == Some(&"Node") {
            fields.drain(..2.min(fields.len()));
        }
        let (key, value, unit) = match fields[..] {
            [key, value] => (key, value, None),
            [key, value, unit] => (key, value, Some(unit)),
            [] => continue,
            _ => return Err(format!("{path}: unexpected line {line:?}")),
        };
        let key = key.trim_end_matches(':');
        let value: f64 = value
            .parse()
            .map_err(|_| format!("{path}: {key} is not a number: {value:?}"))?;
        entries.push((key, value, unit));
    }
    Ok(entries)
}

fn send(entries: &[Entry<'_>], tags: &[(&str, &str)], out: &mut Vec<Sample>) {
    let get = |key: &str| entries.iter().find(|e| e.0 == key);
    for (key, name) in METRICS {
        if let Some((_, value, unit)) = get(key) {
            let mut sample = Sample::new(name, tags, Value::Float(*value));
            if let Some(unit) = unit {
                sample = sample.unit(unit);
            }
            out.push(sample);
        }
    }
    if let (Some(total), Some(free)) = (get("MemTotal"), get("MemFree")) {
        let mut used = total.1 - free.1;
        let mut unit = total.2.or(free.2);
        if let Some(buffers) = get("Buffers") {
            used -= buffers.1;
            unit = unit.or(buffers.2);
            for key in ["Cached", "Shmem"] {
                if let Some(entry) = get(key) {
                    used -= entry.1;
                    unit = unit.or(entry.2);
                }
            }
        }
        let mut sample = Sample::new("mem_used", tags, Value::Float(used));
        if let Some(unit) = unit {
            sample = sample.unit(unit);
        }
        out.push(sample);
    }
}

impl Collector for Memstat {
    fn name(&self) -> &'static str {
        "memstat"
    }

    fn collect(
        &mut self,
        files: &mut dyn Files,
        _now_ns: i64,
        out: &mut Vec<Sample>,
    ) -> Result<(), String> {
        if self.config.node_stats {
            let text = files.read(PATH)?;
            send(&parse(&text, PATH)?, &[("type", "node")], out);
        }
        if self.config.numa_stats {
            for dir in files.list_dir(NODE_DIR)? {
                let Some(id) = index_after(&dir, "node") else {
                    continue;
                };
                let path = format!("{NODE_DIR}/{dir}/meminfo");
                let text = files.read(&path)?;
                let tags = [("type", "memoryDomain"), ("type-id", id)];
                send(&parse(&text, &path)?, &tags, out);
            }
        }
        Ok(())
    }
}
