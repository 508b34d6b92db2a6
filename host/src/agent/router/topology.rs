//! The local CPU topology for the conditions' topology functions (`getCpuListOfType`,
//! `getCpuCore`, ...), read once from `/sys/devices/system/cpu` as cc-metric-collector's
//! `ccTopology` reads it: each hardware thread's `core_id`, `physical_package_id` and
//! `die_id`, and its NUMA node from the `nodeN` entry of its directory.
//!
//! A file that cannot be read counts as 0, as in `ccTopology`: on a machine without NUMA
//! information every thread is in domain 0.

use std::path::Path;
use std::sync::{Arc, LazyLock};

/// One hardware thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HwThread {
    /// The CPU number (`cpuN`).
    pub cpu: i64,
    /// `topology/core_id`.
    pub core: i64,
    /// `topology/physical_package_id`.
    pub socket: i64,
    /// `topology/die_id`.
    pub die: i64,
    /// The NUMA node (`nodeN` in the CPU's directory).
    pub numa: i64,
}

/// The hardware threads of this machine, by CPU number.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Topology {
    threads: Vec<HwThread>,
}

/// A level of the topology, as `getCpuListOfType` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    /// The whole node.
    Node,
    /// A socket (package).
    Socket,
    /// A die.
    Die,
    /// A NUMA domain.
    NumaDomain,
    /// A core.
    Core,
    /// One hardware thread.
    HwThread,
}

impl Level {
    /// Reads a level name (`node`, `socket`, `die`, `numadomain`, `core`, `hwthread`).
    pub fn parse(s: &str) -> Option<Level> {
        Some(match s {
            "node" => Level::Node,
            "socket" => Level::Socket,
            "die" => Level::Die,
            "numadomain" | "memoryDomain" => Level::NumaDomain,
            "core" => Level::Core,
            "hwthread" | "cpu" => Level::HwThread,
            _ => return None,
        })
    }

    fn of(self, t: &HwThread) -> i64 {
        match self {
            Level::Node => 0,
            Level::Socket => t.socket,
            Level::Die => t.die,
            Level::NumaDomain => t.numa,
            Level::Core => t.core,
            Level::HwThread => t.cpu,
        }
    }
}

/// Sysfs numbers are small; anything longer is not one.
const MAX_NUMBER_FILE: usize = 64;

fn read_number(path: &Path) -> i64 {
    std::fs::read_to_string(path)
        .ok()
        .filter(|s| s.len() <= MAX_NUMBER_FILE)
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

/// Hardware threads read at most (a bound on a damaged or hostile sysfs tree).
const MAX_THREADS: usize = 1 << 16;

impl Topology {
    /// A topology of the given threads (sorted by CPU number).
    pub fn new(mut threads: Vec<HwThread>) -> Topology {
        threads.sort_by_key(|t| t.cpu);
        threads.dedup_by_key(|t| t.cpu);
        Topology { threads }
    }

    /// Reads the topology under `cpu_dir` (normally `/sys/devices/system/cpu`); an
    /// unreadable directory gives an empty topology, whose lists are empty.
    pub fn read(cpu_dir: &Path) -> Topology {
        let mut threads = Vec::new();
        let Ok(entries) = std::fs::read_dir(cpu_dir) else {
            return Topology::default();
        };
        for entry in entries.flatten().take(MAX_THREADS) {
            let name = entry.file_name();
            let Some(cpu) = name
                .to_str()
                .and_then(|n| n.strip_prefix("cpu"))
                .and_then(|n| n.parse::<i64>().ok())
            else {
                continue;
            };
            let dir = entry.path();
            let topo = dir.join("topology");
            let numa = std::fs::read_dir(&dir)
                .into_iter()
                .flatten()
                .flatten()
                .find_map(|e| {
                    e.file_name()
                        .to_str()?
                        .strip_prefix("node")?
                        .parse::<i64>()
                        .ok()
                })
                .unwrap_or(0);
            threads.push(HwThread {
                cpu,
                core: read_number(&topo.join("core_id")),
                socket: read_number(&topo.join("physical_package_id")),
                die: read_number(&topo.join("die_id")),
                numa,
            });
        }
        Topology::new(threads)
    }

    /// This machine's topology, read on first use.
    pub fn local() -> Arc<Topology> {
        static LOCAL: LazyLock<Arc<Topology>> =
            LazyLock::new(|| Arc::new(Topology::read(Path::new("/sys/devices/system/cpu"))));
        LOCAL.clone()
    }

    /// The CPUs in `level` number `id` (every CPU for [`Level::Node`]).
    pub fn cpus_of(&self, level: Level, id: i64) -> Vec<i64> {
        self.threads
            .iter()
            .filter(|t| level == Level::Node || level.of(t) == id)
            .map(|t| t.cpu)
            .collect()
    }

    /// The number of `level` that CPU `cpu` belongs to; `None` for an unknown CPU.
    pub fn level_of(&self, cpu: i64, level: Level) -> Option<i64> {
        self.threads
            .iter()
            .find(|t| t.cpu == cpu)
            .map(|t| level.of(t))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sysfs_tree_is_read_into_threads() {
        let dir = tempfile::tempdir().unwrap();
        for (cpu, core, socket, numa) in [(0, 0, 0, 0), (1, 1, 0, 0), (2, 0, 1, 1), (3, 1, 1, 1)] {
            let topo = dir.path().join(format!("cpu{cpu}")).join("topology");
            std::fs::create_dir_all(&topo).unwrap();
            std::fs::write(topo.join("core_id"), format!("{core}\n")).unwrap();
            std::fs::write(topo.join("physical_package_id"), format!("{socket}\n")).unwrap();
            std::fs::create_dir_all(dir.path().join(format!("cpu{cpu}/node{numa}"))).unwrap();
        }
        std::fs::create_dir_all(dir.path().join("cpufreq")).unwrap();
        std::fs::write(dir.path().join("online"), "0-3\n").unwrap();
        let t = Topology::read(dir.path());
        assert_eq!(t.cpus_of(Level::Node, 7), [0, 1, 2, 3]);
        assert_eq!(t.cpus_of(Level::Socket, 1), [2, 3]);
        assert_eq!(t.cpus_of(Level::NumaDomain, 0), [0, 1]);
        assert_eq!(t.cpus_of(Level::Die, 0), [0, 1, 2, 3]);
        assert_eq!(t.cpus_of(Level::Core, 1), [1, 3]);
        assert_eq!(t.level_of(2, Level::Socket), Some(1));
        assert_eq!(t.level_of(9, Level::Socket), None);
        assert_eq!(
            Topology::read(&dir.path().join("missing")),
            Topology::default()
        );
    }
}
