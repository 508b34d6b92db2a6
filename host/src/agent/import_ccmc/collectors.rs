//! cc-metric-collector's collectors, and the plugin and grants each becomes.
//!
//! A collector's settings are handed to its plugin as they are (the plugins take
//! cc-metric-collector's keys), after the plugin's own parser has accepted them here, so a
//! setting a plugin would refuse at start is reported now. Grants are the narrowest each
//! plugin needs: the files it reads (and the host name file unless `hostname` is set), the
//! mount information for the two that read the mount table.

use ccfleet_collectors::config::{FromOptions, Options, common};
use ccfleet_collectors::{
    cpufreq, cpufreq_cpuinfo, cpustat, diskstat, ibstat, iostat, loadavg, memstat, netstat,
    nfsiostat, nfsstat, numastats, rapl, schedstat, slurm_cgroup, tempstat,
};
use serde_json::{Map, Value, json};

/// The file a plugin reads the host name from when its configuration names none.
const HOSTNAME_FILE: &str = "/proc/sys/kernel/hostname";

/// What becomes of one collector.
#[derive(Debug, PartialEq)]
pub enum Plan {
    /// A plugin of that name with these capabilities.
    Plugin {
        /// `capabilities`.
        capabilities: Value,
    },
    /// The agent's own `self` section.
    SelfSection,
    /// Not carried over, for this reason.
    Unsupported(&'static str),
}

/// Runs the plugin's own parser over `config`, as its `init` will.
fn parse<C: FromOptions>(config: &str) -> Result<(), String> {
    let mut options = Options::parse(C::NAME, config)?;
    let shared = common(&mut options)?;
    let _ = C::from_options(&mut options)?.with_common(&shared);
    options.finish()
}

/// Whether the plugin of `name` accepts `config`; `None` for a name without a plugin.
pub fn check(name: &str, config: &str) -> Option<Result<(), String>> {
    Some(match name {
        "cpustat" => parse::<cpustat::Cpustat>(config),
        "memstat" => parse::<memstat::Memstat>(config),
        "loadavg" => parse::<loadavg::Loadavg>(config),
        "netstat" => parse::<netstat::Netstat>(config),
        "iostat" => parse::<iostat::Iostat>(config),
        "diskstat" => parse::<diskstat::Diskstat>(config),
        "numastats" => parse::<numastats::Numastats>(config),
        "cpufreq" => parse::<cpufreq::Cpufreq>(config),
        "cpufreq_cpuinfo" => parse::<cpufreq_cpuinfo::CpufreqCpuinfo>(config),
        "tempstat" => parse::<tempstat::Tempstat>(config),
        "nfs3stat" => parse::<nfsstat::Nfs3stat>(config),
        "nfs4stat" => parse::<nfsstat::Nfs4stat>(config),
        "nfsiostat" => parse::<nfsiostat::Nfsiostat>(config),
        "schedstat" => parse::<schedstat::Schedstat>(config),
        "ibstat" => parse::<ibstat::Ibstat>(config),
        "rapl" => parse::<rapl::Rapl>(config),
        "slurm_cgroup" => parse::<slurm_cgroup::SlurmCgroup>(config),
        _ => return None,
    })
}

fn files(paths: &[&str]) -> Vec<String> {
    paths.iter().map(|p| (*p).to_owned()).collect()
}

/// The files `slurm_cgroup` reads under its configured cgroup directories.
fn slurm_cgroup_files(config: &Map<String, Value>) -> Vec<String> {
    let text = |key: &str, default: &str| {
        config
            .get(key)
            .and_then(Value::as_str)
            .unwrap_or(default)
            .trim_end_matches('/')
            .to_owned()
    };
    let defaults = slurm_cgroup::Config::default();
    let base = text("cgroup_base", &defaults.cgroup_base);
    let root = text("cgroup_v1_root", &defaults.cgroup_root);
    let version = config
        .get("cgroup_version")
        .and_then(Value::as_str)
        .unwrap_or("auto");
    let mut files = files(&[
        "/sys/devices/system/cpu/online",
        "/sys/fs/cgroup/cgroup.controllers",
    ]);
    if version != "v1" {
        files.push(format!("{base}/**"));
    }
    if version != "v2" {
        for controller in ["memory", "cpuacct", "cpuset"] {
            files.push(format!("{root}/{controller}/slurm/**"));
        }
    }
    files
}

/// What `name` with `config` becomes.
pub fn plan(name: &str, config: &Map<String, Value>) -> Plan {
    let (read, mount_info): (Vec<String>, bool) = match name {
        "cpustat" => (files(&["/proc/stat"]), false),
        "memstat" => (
            files(&["/proc/meminfo", "/sys/devices/system/node/node*/meminfo"]),
            false,
        ),
        "loadavg" => (files(&["/proc/loadavg"]), false),
        "netstat" => (files(&["/proc/net/dev"]), false),
        "iostat" => (files(&["/proc/diskstats"]), false),
        "diskstat" | "nfsiostat" => (Vec::new(), true),
        "numastats" => (files(&["/sys/devices/system/node/node*/numastat"]), false),
        "cpufreq" => (
            files(&[
                "/sys/devices/system/cpu/cpu*/cpufreq/scaling_cur_freq",
                "/sys/devices/system/cpu/cpu*/topology/physical_package_id",
            ]),
            false,
        ),
        "cpufreq_cpuinfo" => (files(&["/proc/cpuinfo"]), false),
        "tempstat" => (files(&["/sys/class/hwmon/**"]), false),
        "nfs3stat" | "nfs4stat" => (files(&["/proc/net/rpc/nfs"]), false),
        "schedstat" => (files(&["/proc/schedstat"]), false),
        "ibstat" => (files(&["/sys/class/infiniband/**"]), false),
        "rapl" => (
            files(&["/sys/devices/virtual/powercap/intel-rapl/**"]),
            false,
        ),
        "slurm_cgroup" => (slurm_cgroup_files(config), false),
        "self" => return Plan::SelfSection,
        other => return Plan::Unsupported(unsupported_reason(other)),
    };
    let mut read = read;
    if !config.contains_key("hostname") {
        read.push(HOSTNAME_FILE.to_owned());
    }
    let mut capabilities = Map::new();
    if !read.is_empty() {
        capabilities.insert("read-files".to_owned(), json!(read));
    }
    if mount_info {
        capabilities.insert("mount-info".to_owned(), Value::Bool(true));
    }
    Plan::Plugin {
        capabilities: Value::Object(capabilities),
    }
}

/// Why a collector without a plugin is left out.
fn unsupported_reason(name: &str) -> &'static str {
    match name {
        "likwid" => {
            "hardware performance counters need LIKWID's native library and its access daemon \
             (or MSR and perf-event access with root rights), which no sandboxed plugin can use"
        }
        "rocm_smi" => "AMD's rocm_smi is a native library no sandboxed plugin can load",
        "nvidia" => {
            "NVML is a native library no sandboxed plugin can load; the agent has no device \
             interface for it yet"
        }
        "ipmistat" | "gpfs" | "smartmon" | "customcmd" | "lustrestat" | "beegfs_meta"
        | "beegfs_storage" | "topprocs" => {
            "this command-based collector has no plugin in this version"
        }
        _ => "cc-metric-collector has no collector of this name",
    }
}
