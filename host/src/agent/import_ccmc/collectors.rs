//! cc-metric-collector's collectors, and the plugin and grants each becomes.
//!
//! A collector's settings are handed to its plugin as they are (the plugins take
//! cc-metric-collector's keys), after the plugin's own parser has accepted them here, so a
//! setting a plugin would refuse at start is reported now. Grants are the narrowest each
//! plugin needs: the files it reads (and the host name file unless `hostname` is set), the
//! mount information for those that read the mount table, and for command collectors the
//! commands they run, with the executables their settings named ([`translate`]).

use ccfleet_collectors::config::{FromOptions, Options, common};
use ccfleet_collectors::{
    beegfs, cpufreq, cpufreq_cpuinfo, cpustat, customcmd, diskstat, gpfs, ibstat, iostat, ipmistat,
    likwid, loadavg, lustrestat, memstat, netstat, nfsiostat, nfsstat, numastats, nvidia, rapl,
    rocm_smi, schedstat, slurm_cgroup, smartmon, tempstat, topprocs,
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

/// Whether the `likwid` plugin accepts `config` and the agent its formulas (which the agent
/// evaluates, with the router's expression engine).
fn likwid_formulas(config: &str) -> Result<(), String> {
    use crate::plugin::native::likwid_metrics::{EventSetSpec, MetricSpec, Plan as Formulas};
    let mut options = Options::parse("likwid", config)?;
    let shared = common(&mut options)?;
    let plugin = <likwid::Likwid as FromOptions>::from_options(&mut options)?.with_common(&shared);
    options.finish()?;
    let metric = |m: &likwid::Metric| MetricSpec {
        name: m.name.clone(),
        calc: m.calc.clone(),
        scope: m.scope.clone(),
    };
    let sets: Vec<EventSetSpec> = plugin
        .config
        .event_sets
        .iter()
        .map(|s| EventSetSpec {
            events: s.events.clone(),
            metrics: s.metrics.iter().map(metric).collect(),
        })
        .collect();
    let globals: Vec<MetricSpec> = plugin.config.global_metrics.iter().map(metric).collect();
    Formulas::new(&sets, &globals).map(|_| ())
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
        "ipmistat" => parse::<ipmistat::Ipmistat>(config),
        "customcmd" => parse::<customcmd::Customcmd>(config),
        "topprocs" => parse::<topprocs::Topprocs>(config),
        "lustrestat" => parse::<lustrestat::Lustrestat>(config),
        "gpfs" => parse::<gpfs::Gpfs>(config),
        "nvidia" => parse::<nvidia::Nvidia>(config),
        "likwid" => likwid_formulas(config),
        "rocm_smi" => parse::<rocm_smi::RocmSmi>(config),
        "smartmon" => parse::<smartmon::Smartmon>(config),
        "beegfs_meta" => parse::<beegfs::BeegfsMeta>(config),
        "beegfs_storage" => parse::<beegfs::BeegfsStorage>(config),
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

/// The file `gpfs`'s grant hands `mmpmon` as its input (`-i`): granted commands get no
/// standard input, and `mmpmon` reads its requests from one.
pub const MMPMON_REQUEST_FILE: &str = "/etc/ccfleet/mmpmon-fs_io_s";

/// Where BeeGFS on Demand is usually mounted (its documentation's `beeond start -c`): the
/// mount point `beegfs_meta` and `beegfs_storage` get a grant for, cc-metric-collector's
/// configuration naming none (it queries every BeeOND mount it finds).
pub const BEEOND_MOUNT: &str = "/mnt/beeond";

/// Where `smartctl` usually is (cc-metric-collector looks it up in `PATH`).
pub const SMARTCTL: &str = "/usr/sbin/smartctl";

/// Keys NHR@FAU's published configurations give collectors that do not read them.
const IGNORED_KEYS: [(&str, &[&str]); 2] = [
    ("ipmistat", &["send_abs_values", "send_derived_values"]),
    ("lustrestat", &["send_all_metrics"]),
];

/// What a finding of [`translate`] is.
#[derive(Debug, PartialEq, Eq)]
pub enum Change {
    /// Carried over in another form.
    Note(String),
    /// Cannot be carried over.
    LeftOut(String),
}

/// `configured` as an absolute executable, or `default` when it is a bare name (which
/// cc-metric-collector looks up in `PATH`, as a grant cannot).
fn executable(
    configured: Option<&str>,
    default: &str,
    key: &str,
    changes: &mut Vec<(String, Change)>,
) -> String {
    match configured {
        Some(path) if path.starts_with('/') => path.to_owned(),
        Some(name) => {
            changes.push((
                key.to_owned(),
                Change::Note(format!(
                    "{name:?} is looked up in PATH by cc-metric-collector; the grant names {default}: check that it is there"
                )),
            ));
            default.to_owned()
        }
        None => default.to_owned(),
    }
}

fn grant(path: &str, args: &[&str]) -> Value {
    json!({"path": path, "args": args})
}

/// Turns a command collector's cc-metric-collector settings into the plugin's, and returns
/// the commands to grant (`capabilities.run`): executables named in the settings become
/// grants, `use_sudo` becomes the agent's user (a grant's `user` can name another).
pub fn translate(
    name: &str,
    config: &mut Map<String, Value>,
) -> (Map<String, Value>, Vec<(String, Change)>) {
    let mut run = Map::new();
    let mut changes = Vec::new();
    let mut take = |key: &str| config.remove(key);
    let runs_commands = matches!(
        name,
        "ipmistat"
            | "lustrestat"
            | "gpfs"
            | "topprocs"
            | "customcmd"
            | "smartmon"
            | "beegfs_meta"
            | "beegfs_storage"
    );
    if let Some(sudo) = runs_commands.then(|| take("use_sudo")).flatten() {
        let reason = if sudo == Value::Bool(true) {
            "the grant runs the command as the agent's user (root on a node); a grant's `user` can name another, no sudo is used"
        } else {
            "without sudo, as before: the grant runs the command as the agent's user"
        };
        changes.push(("use_sudo".to_owned(), Change::Note(reason.to_owned())));
    }
    for (collector, keys) in IGNORED_KEYS {
        for key in keys.iter().filter(|_| name == collector) {
            if take(key).is_some() {
                changes.push((
                    (*key).to_owned(),
                    Change::Note(format!(
                        "not a setting of cc-metric-collector's {name} (releases that ignored unknown keys ignored it, later ones refuse it): left out"
                    )),
                ));
            }
        }
    }
    match name {
        "ipmistat" => {
            let tool = take("ipmitool_path");
            let sensors = take("ipmisensors_path");
            let tool = executable(
                tool.as_ref().and_then(Value::as_str),
                "/usr/bin/ipmitool",
                "ipmitool_path",
                &mut changes,
            );
            let sensors = executable(
                sensors.as_ref().and_then(Value::as_str),
                "/usr/sbin/ipmi-sensors",
                "ipmisensors_path",
                &mut changes,
            );
            run.insert(
                ipmistat::IPMISENSORS_GRANT.into(),
                grant(
                    &sensors,
                    &["--comma-separated-output", "--sdr-cache-recreate"],
                ),
            );
            run.insert(ipmistat::IPMITOOL_GRANT.into(), grant(&tool, &["sensor"]));
        }
        "lustrestat" => {
            let lctl = take("lctl_command");
            let lctl = executable(
                lctl.as_ref().and_then(Value::as_str),
                "/usr/sbin/lctl",
                "lctl_command",
                &mut changes,
            );
            run.insert(
                lustrestat::LCTL_GRANT.into(),
                grant(&lctl, &["get_param", "llite.*.stats"]),
            );
        }
        "gpfs" => {
            let mmpmon = take("mmpmon_path");
            let mmpmon = executable(
                mmpmon.as_ref().and_then(Value::as_str),
                "/usr/lpp/mmfs/bin/mmpmon",
                "mmpmon_path",
                &mut changes,
            );
            run.insert(
                gpfs::MMPMON_GRANT.into(),
                grant(&mmpmon, &["-p", "-s", "-i", MMPMON_REQUEST_FILE]),
            );
            changes.push((
                "mmpmon_path".to_owned(),
                Change::Note(format!("mmpmon reads its request from {MMPMON_REQUEST_FILE}, which must hold the line `fs_io_s`")),
            ));
        }
        "smartmon" => {
            let excluded: Vec<String> = config
                .get("exclude_devices")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect();
            let devices: Vec<(String, String)> = config
                .get("devices")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(|d| {
                    let name = d.get("name")?.as_str()?;
                    let kind = d.get("type").and_then(Value::as_str).unwrap_or("auto");
                    Some((name.to_owned(), kind.to_owned()))
                })
                .collect();
            for (device, kind) in devices.iter().filter(|(d, _)| !excluded.contains(d)) {
                match smartmon::device_grant(device) {
                    Some(grant_name) => {
                        run.insert(
                            grant_name,
                            grant(
                                SMARTCTL,
                                &["--json=c", &format!("--device={kind}"), "--all", device],
                            ),
                        );
                    }
                    None => changes.push((
                        "devices".to_owned(),
                        Change::LeftOut(format!(
                            "{device:?} is too long a name for a grant: give the entry a `command` naming a grant of your own"
                        )),
                    )),
                }
            }
            if devices.is_empty() {
                run.insert(
                    smartmon::SCAN_GRANT.into(),
                    grant(SMARTCTL, &["--scan", "--json=c"]),
                );
                changes.push((
                    "devices".to_owned(),
                    Change::Note(format!(
                        "the devices are scanned on the node every round (grant {}); each device found needs a grant of its own, named smartctl-<device without /dev/> (e.g. \"smartctl-nvme0\": {SMARTCTL} --json=c --device=nvme --all /dev/nvme0), or an entry in exclude_devices: add them for the node's disks",
                        smartmon::SCAN_GRANT
                    )),
                ));
            }
            changes.push((
                "smartctl".to_owned(),
                Change::Note(format!(
                    "cc-metric-collector looks smartctl up in PATH; the grants name {SMARTCTL}: check that it is there"
                )),
            ));
        }
        "beegfs_meta" | "beegfs_storage" => {
            let kind = if name == "beegfs_meta" {
                beegfs::NodeType::Meta
            } else {
                beegfs::NodeType::Storage
            };
            let configured = take("beegfs_path");
            let ctl = executable(
                configured.as_ref().and_then(Value::as_str),
                "/usr/bin/beegfs-ctl",
                "beegfs_path",
                &mut changes,
            );
            let grant_name = kind
                .default_grant(BEEOND_MOUNT)
                .unwrap_or_else(|| kind.grant_prefix().to_owned());
            run.insert(
                grant_name.clone(),
                grant(
                    &ctl,
                    &[
                        "--clientstats",
                        &format!("--nodetype={}", kind.nodetype()),
                        &format!("--mount={BEEOND_MOUNT}"),
                        "--allstats",
                    ],
                ),
            );
            changes.push((
                "beegfs_path".to_owned(),
                Change::Note(format!(
                    "cc-metric-collector queries every BeeOND mount of /proc/mounts; the grant {grant_name} covers {BEEOND_MOUNT}, BeeOND's usual mount point; a BeeOND file system mounted elsewhere needs a grant of its own, named {}-<mount point with - for />",
                    kind.grant_prefix()
                )),
            ));
        }
        "topprocs" => {
            run.insert(
                topprocs::PS_GRANT.into(),
                grant("/usr/bin/ps", &["-Ao", "comm", "--sort=-pcpu"]),
            );
        }
        "customcmd" => {
            let commands = take("commands");
            let mut names = Vec::new();
            for (i, line) in commands
                .as_ref()
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .enumerate()
            {
                let words: Vec<&str> = line
                    .as_str()
                    .unwrap_or_default()
                    .split_whitespace()
                    .collect();
                match words.split_first() {
                    Some((program, args)) if program.starts_with('/') => {
                        let name = format!("command{}", i + 1);
                        run.insert(name.clone(), grant(program, args));
                        names.push(Value::String(name));
                    }
                    _ => changes.push((
                        format!("commands[{i}]"),
                        Change::LeftOut(
                            "a grant needs an absolute executable (cc-metric-collector looks a bare name up in PATH, a grant does not)".to_owned(),
                        ),
                    )),
                }
            }
            if commands.is_some() {
                config.insert("commands".into(), Value::Array(names));
            }
        }
        _ => {}
    }
    (run, changes)
}

/// What `name` with `config` becomes (after [`translate`]); `run` are its command grants.
pub fn plan(name: &str, config: &Map<String, Value>, run: Map<String, Value>) -> Plan {
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
        "customcmd" => (
            config
                .get("files")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect(),
            false,
        ),
        "ipmistat" | "lustrestat" | "gpfs" | "topprocs" | "smartmon" => (Vec::new(), false),
        "beegfs_meta" | "beegfs_storage" => (Vec::new(), true),
        "nvidia" | "likwid" | "rocm_smi" => (Vec::new(), false),
        "self" => return Plan::SelfSection,
        _ => return Plan::Unsupported("cc-metric-collector has no collector of this name"),
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
    if !run.is_empty() {
        capabilities.insert("run".to_owned(), Value::Object(run));
    }
    if name == "nvidia" {
        // NVML through the agent; the driver's library on the node's loader path.
        capabilities.insert("nvml".to_owned(), Value::Bool(true));
    }
    if name == "rocm_smi" {
        // ROCm SMI through the agent; its library on the node's loader path (or the node's
        // rocm-smi-library: cc-metric-collector's section names none).
        capabilities.insert("rocm-smi".to_owned(), Value::Bool(true));
    }
    if name == "likwid" {
        // LIKWID through the agent; its library is a setting of the node's own configuration.
        capabilities.insert("likwid".to_owned(), Value::Bool(true));
        if let Some(path) = config.get("liblikwid_path").and_then(Value::as_str)
            && path.starts_with('/')
        {
            capabilities.insert("likwid-library".to_owned(), json!(path));
        }
    }
    Plan::Plugin {
        capabilities: Value::Object(capabilities),
    }
}

/// Moves the node-local keys of the `likwid` section out of the plugin's settings (the
/// library went to `capabilities.likwid-library` in [`plan`]) and gives it the measurement
/// time, cc-metric-collector's global `duration`; returns what changed.
pub fn likwid_settings(
    config: &mut Map<String, Value>,
    duration: Option<&str>,
) -> Vec<(String, Change)> {
    let mut changes = Vec::new();
    if config.remove("liblikwid_path").is_some() {
        changes.push((
            "liblikwid_path".to_owned(),
            Change::Note(
                "capabilities.likwid-library of the plugin entry (the agent's local \
                 configuration)"
                    .to_owned(),
            ),
        ));
    }
    if let Some(dir) = config.remove("accessdaemon_path") {
        changes.push((
            "accessdaemon_path".to_owned(),
            Change::Note(format!(
                "set CCFLEET_LIKWID_ACCESSDAEMON_PATH={} in the agent's environment",
                dir.as_str().unwrap_or_default()
            )),
        ));
    }
    if let Some(duration) = duration
        && !config.contains_key("duration")
    {
        config.insert("duration".to_owned(), json!(duration));
    }
    changes
}
