//! `slurm_cgroup`: memory and CPU use of the Slurm jobs on this node from their cgroups,
//! per hwthread, as cc-metric-collector reports them, for cgroup v2 (as cc-metric-collector)
//! and cgroup v1.
//!
//! cgroup v2: the job directories under `cgroup_base` (default
//! `/sys/fs/cgroup/system.slice/slurmstepd.scope`) named `job_<number>` or a Slurm SLUID
//! (`s` and 13 Crockford base-32 characters); per job `memory.current`, `memory.peak`,
//! `memory.max` (`max`, no limit, reads as 0), `cpu.stat` (`usage_usec`, `user_usec`,
//! `system_usec`) and `cpuset.cpus`. cgroup v1: the `job_<number>` directories under
//! `<cgroup_v1_root>/memory/slurm/uid_<uid>/`, with `memory.usage_in_bytes`,
//! `memory.max_usage_in_bytes`, `memory.limit_in_bytes`, and beside them in the `cpuacct`
//! and `cpuset` hierarchies `cpuacct.stat` (`user`, `system`) and `cpuset.cpus`.
//! `cgroup_version` picks `v1`, `v2` or `auto` (default: v2 when
//! `<cgroup_v1_root>/cgroup.controllers` exists).
//!
//! For every hwthread of a job's cpuset: `job_mem_used`, `job_max_mem_used`,
//! `job_mem_limit` (the job's bytes divided by its number of hwthreads, floats, unit
//! `Bytes`), `job_user_cpu` and `job_sys_cpu` (the job's user and system shares of its CPU
//! time since it started, in percent, divided by its number of hwthreads, floats, unit `%`).
//! Every other online hwthread (`/sys/devices/system/cpu/online`) gets the five metrics as
//! integer 0, as cc-metric-collector sends them. Tags `type=hwthread`, `type-id=<cpu>`.
//! A file of a job that is missing (the job is ending) counts as 0, as in
//! cc-metric-collector; one that reads but does not parse fails the round with its name.

use alloc::collections::BTreeSet;
use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;

use crate::{Collector, Files, Sample, Value};

/// cc-metric-collector's default `cgroup_base`.
pub const DEFAULT_BASE: &str = "/sys/fs/cgroup/system.slice/slurmstepd.scope";
/// The default root of the cgroup file systems.
pub const DEFAULT_ROOT: &str = "/sys/fs/cgroup";
/// The online hwthreads.
pub const ONLINE: &str = "/sys/devices/system/cpu/online";

/// The metrics, in the order sent, with their units.
pub const METRICS: [(&str, &str); 5] = [
    ("job_mem_used", "Bytes"),
    ("job_max_mem_used", "Bytes"),
    ("job_mem_limit", "Bytes"),
    ("job_user_cpu", "%"),
    ("job_sys_cpu", "%"),
];

/// Which cgroup layout to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CgroupVersion {
    /// v2 when the root has `cgroup.controllers`, else v1.
    Auto,
    /// The legacy per-controller hierarchies.
    V1,
    /// The unified hierarchy.
    V2,
}

/// Settings (cc-metric-collector's keys, plus `cgroup_version` and `cgroup_v1_root`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// `cgroup_base`: where the v2 job directories are.
    pub cgroup_base: String,
    /// `cgroup_v1_root`: where the cgroup file systems are mounted.
    pub cgroup_root: String,
    /// `cgroup_version`.
    pub version: CgroupVersion,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            cgroup_base: DEFAULT_BASE.to_string(),
            cgroup_root: DEFAULT_ROOT.to_string(),
            version: CgroupVersion::Auto,
        }
    }
}

/// Parses a CPU list such as `0-3,8,10-11`.
pub fn parse_cpus(text: &str) -> Result<Vec<u32>, String> {
    let mut cpus = Vec::new();
    for range in text.trim().split(',').filter(|r| !r.trim().is_empty()) {
        let number = |s: &str| {
            s.trim()
                .parse::<u32>()
                .map_err(|_| format!("{:?} is not a CPU list", text.trim()))
        };
        match range.split_once('-') {
            Some((first, last)) => {
                let (first, last) = (number(first)?, number(last)?);
                if last < first || last - first > 65_535 {
                    return Err(format!("{:?} is not a CPU list", text.trim()));
                }
                cpus.extend(first..=last);
            }
            None => cpus.push(number(range)?),
        }
    }
    Ok(cpus)
}

/// Whether a v2 directory name is a Slurm job's.
pub fn is_job_dir(name: &str) -> bool {
    if let Some(id) = name.strip_prefix("job_") {
        return !id.is_empty() && id.bytes().all(|b| b.is_ascii_digit());
    }
    let bytes = name.as_bytes();
    bytes.len() == 14
        && bytes[0].eq_ignore_ascii_case(&b's')
        && bytes[1..].iter().all(|b| {
            let b = b.to_ascii_uppercase();
            b.is_ascii_digit()
                || (b.is_ascii_uppercase() && !matches!(b, b'I' | b'L' | b'O' | b'U'))
        })
}

/// One job's figures.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Job {
    /// Bytes in use.
    pub mem_used: f64,
    /// Peak bytes.
    pub max_mem_used: f64,
    /// The limit in bytes (0: none).
    pub mem_limit: f64,
    /// User share of the CPU time, in percent.
    pub user_cpu: f64,
    /// System share of the CPU time, in percent.
    pub sys_cpu: f64,
    /// Its hwthreads.
    pub cpus: Vec<u32>,
}

/// A number file: missing reads 0, `max` reads 0, anything else must parse.
fn number(files: &mut dyn Files, path: &str) -> Result<f64, String> {
    let Ok(text) = files.read(path) else {
        return Ok(0.0);
    };
    let text = text.trim();
    if text == "max" {
        return Ok(0.0);
    }
    text.parse::<f64>()
        .map_err(|_| format!("{path}: {text:?} is not a number"))
}

/// `key value` lines: the values of `keys` (0 when absent).
fn keyed(files: &mut dyn Files, path: &str, keys: &[&str]) -> Result<Vec<f64>, String> {
    let mut values = alloc::vec![0.0; keys.len()];
    let Ok(text) = files.read(path) else {
        return Ok(values);
    };
    for line in text.lines() {
        let mut fields = line.split_ascii_whitespace();
        let (Some(key), Some(value)) = (fields.next(), fields.next()) else {
            continue;
        };
        if let Some(i) = keys.iter().position(|k| *k == key) {
            values[i] = value
                .parse()
                .map_err(|_| format!("{path}: {key} {value:?} is not a number"))?;
        }
    }
    Ok(values)
}

fn cpuset(files: &mut dyn Files, path: &str) -> Result<Vec<u32>, String> {
    match files.read(path) {
        Ok(text) => parse_cpus(&text).map_err(|e| format!("{path}: {e}")),
        Err(_) => Ok(Vec::new()),
    }
}

fn share(part: f64, whole: f64) -> f64 {
    if whole > 0.0 {
        part * 100.0 / whole
    } else {
        0.0
    }
}

/// The `slurm_cgroup` collector.
#[derive(Debug, Default)]
pub struct SlurmCgroup {
    config: Config,
}

impl SlurmCgroup {
    /// A collector with these settings.
    pub fn new(config: Config) -> SlurmCgroup {
        SlurmCgroup { config }
    }

    fn v2(&self, files: &mut dyn Files) -> Result<bool, String> {
        Ok(match self.config.version {
            CgroupVersion::V1 => false,
            CgroupVersion::V2 => true,
            CgroupVersion::Auto => files
                .read(&format!("{}/cgroup.controllers", self.config.cgroup_root))
                .is_ok(),
        })
    }

    fn jobs_v2(&self, files: &mut dyn Files) -> Result<Vec<Job>, String> {
        let base = &self.config.cgroup_base;
        let mut jobs = Vec::new();
        for name in files.list_dir(base)? {
            if !is_job_dir(&name) {
                continue;
            }
            let dir = format!("{base}/{name}");
            let stat = keyed(
                files,
                &format!("{dir}/cpu.stat"),
                &["usage_usec", "user_usec", "system_usec"],
            )?;
            jobs.push(Job {
                mem_used: number(files, &format!("{dir}/memory.current"))?,
                max_mem_used: number(files, &format!("{dir}/memory.peak"))?,
                mem_limit: number(files, &format!("{dir}/memory.max"))?,
                user_cpu: share(stat[1], stat[0]),
                sys_cpu: share(stat[2], stat[0]),
                cpus: cpuset(files, &format!("{dir}/cpuset.cpus"))?,
            });
        }
        Ok(jobs)
    }

    fn jobs_v1(&self, files: &mut dyn Files) -> Result<Vec<Job>, String> {
        let root = &self.config.cgroup_root;
        let slurm = format!("{root}/memory/slurm");
        let mut jobs = Vec::new();
        for uid in files.list_dir(&slurm)? {
            if !uid.starts_with("uid_") {
                continue;
            }
            let Ok(names) = files.list_dir(&format!("{slurm}/{uid}")) else {
                continue;
            };
            for name in names {
                if !(name.starts_with("job_") && is_job_dir(&name)) {
                    continue;
                }
                let rel = format!("slurm/{uid}/{name}");
                let memory = format!("{root}/memory/{rel}");
                let stat = keyed(
                    files,
                    &format!("{root}/cpuacct/{rel}/cpuacct.stat"),
                    &["user", "system"],
                )?;
                let usage = stat[0] + stat[1];
                jobs.push(Job {
                    mem_used: number(files, &format!("{memory}/memory.usage_in_bytes"))?,
                    max_mem_used: number(files, &format!("{memory}/memory.max_usage_in_bytes"))?,
                    mem_limit: number(files, &format!("{memory}/memory.limit_in_bytes"))?,
                    user_cpu: share(stat[0], usage),
                    sys_cpu: share(stat[1], usage),
                    cpus: cpuset(files, &format!("{root}/cpuset/{rel}/cpuset.cpus"))?,
                });
            }
        }
        Ok(jobs)
    }
}

impl Collector for SlurmCgroup {
    fn name(&self) -> &'static str {
        "slurm_cgroup"
    }

    fn collect(
        &mut self,
        files: &mut dyn Files,
        _now_ns: i64,
        out: &mut Vec<Sample>,
    ) -> Result<(), String> {
        let online = files.read(ONLINE)?;
        let online = parse_cpus(&online).map_err(|e| format!("{ONLINE}: {e}"))?;
        let jobs = if self.v2(files)? {
            self.jobs_v2(files)?
        } else {
            self.jobs_v1(files)?
        };
        let mut used = BTreeSet::new();
        for job in &jobs {
            if job.cpus.is_empty() {
                continue;
            }
            let count = job.cpus.len() as f64;
            let values = [
                job.mem_used,
                job.max_mem_used,
                job.mem_limit,
                job.user_cpu,
                job.sys_cpu,
            ];
            for cpu in &job.cpus {
                let id = cpu.to_string();
                let tags = [("type", "hwthread"), ("type-id", id.as_str())];
                for ((name, unit), value) in METRICS.iter().zip(values) {
                    out.push(Sample::new(*name, &tags, Value::Float(value / count)).unit(unit));
                }
                used.insert(*cpu);
            }
        }
        for cpu in online {
            if used.contains(&cpu) {
                continue;
            }
            let id = cpu.to_string();
            let tags = [("type", "hwthread"), ("type-id", id.as_str())];
            for (name, unit) in METRICS {
                out.push(Sample::new(name, &tags, Value::Int(0)).unit(unit));
            }
        }
        Ok(())
    }
}
