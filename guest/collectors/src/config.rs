//! Settings from JSON: a plugin's `init` text holds the shared keys of [`Common`] and the
//! collector's own (cc-metric-collector's names). Unknown keys are refused, as
//! cc-metric-collector refuses them, so a misspelt option is an error rather than ignored.

use alloc::borrow::ToOwned;
use alloc::collections::BTreeMap;
use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;

use serde_json::{Map, Value};

use crate::{
    Common, beegfs, cpufreq, cpufreq_cpuinfo, cpustat, customcmd, diskstat, gpfs, ibstat, iostat,
    ipmistat, loadavg, lustrestat, memstat, netstat, nfsiostat, nfsstat, numastats, nvidia, rapl,
    rocm_smi, schedstat, slurm_cgroup, smartmon, tempstat, topprocs,
};

/// A JSON object whose keys are taken one by one; [`Options::finish`] refuses the rest.
pub struct Options {
    collector: &'static str,
    map: Map<String, Value>,
}

impl Options {
    /// Parses a plugin's configuration text (an object; empty text means `{}`).
    pub fn parse(collector: &'static str, text: &str) -> Result<Options, String> {
        let text = if text.trim().is_empty() { "{}" } else { text };
        match serde_json::from_str(text) {
            Ok(Value::Object(map)) => Ok(Options { collector, map }),
            Ok(_) => Err(format!(
                "{collector}: the configuration must be a JSON object"
            )),
            Err(e) => Err(format!("{collector}: the configuration is not JSON: {e}")),
        }
    }

    fn wrong(&self, key: &str, what: &str) -> String {
        format!("{}: `{key}` must be {what}", self.collector)
    }

    /// A string.
    pub fn string(&mut self, key: &str) -> Result<Option<String>, String> {
        match self.map.remove(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(_) => Err(self.wrong(key, "a string")),
        }
    }

    /// A boolean, `default` when absent.
    pub fn bool(&mut self, key: &str, default: bool) -> Result<bool, String> {
        match self.map.remove(key) {
            None | Some(Value::Null) => Ok(default),
            Some(Value::Bool(b)) => Ok(b),
            Some(_) => Err(self.wrong(key, "true or false")),
        }
    }

    fn list(&self, key: &str, value: Value) -> Result<Vec<String>, String> {
        let Value::Array(items) = value else {
            return Err(self.wrong(key, "a list of strings"));
        };
        items
            .into_iter()
            .map(|item| match item {
                Value::String(s) => Ok(s),
                _ => Err(self.wrong(key, "a list of strings")),
            })
            .collect()
    }

    /// A non-negative integer, `default` when absent.
    pub fn uint(&mut self, key: &str, default: u64) -> Result<u64, String> {
        match self.map.remove(key) {
            None | Some(Value::Null) => Ok(default),
            Some(Value::Number(n)) if n.as_u64().is_some() => Ok(n.as_u64().unwrap_or(default)),
            Some(_) => Err(self.wrong(key, "a non-negative integer")),
        }
    }

    /// The name of a grant of `capabilities.run`, `default` when absent; a path or command
    /// line (what cc-metric-collector's keys hold) is refused, saying what to do instead.
    pub fn grant(&mut self, key: &str, default: &str) -> Result<String, String> {
        let name = self.string(key)?.unwrap_or_else(|| default.to_owned());
        if name.contains('/') || name.chars().any(char::is_whitespace) {
            return Err(format!(
                "{}: `{key}` names a grant of the plugin's capabilities.run, not a path or \
                 command line ({:?}): grant the executable and its arguments there under a \
                 name and give that name",
                self.collector,
                crate::quoted(&name, 80)
            ));
        }
        Ok(name)
    }

    /// Refuses cc-metric-collector's keys that name executables or `sudo`, which a plugin
    /// cannot use: the operator grants commands (with a `user`) in `capabilities.run`.
    pub fn refuse_executables(&mut self, keys: &[&str]) -> Result<(), String> {
        for key in keys.iter().copied().chain(["use_sudo"]) {
            if self.map.remove(key).is_some() {
                return Err(format!(
                    "{}: `{key}` is not supported: commands are granted in the plugin's \
                     capabilities.run (an absolute path, fixed arguments and a `user` to run \
                     as), and the configuration names the grant",
                    self.collector
                ));
            }
        }
        Ok(())
    }

    /// The value of `key` as JSON, for settings nested deeper than the other accessors read
    /// (`likwid`'s event sets).
    pub fn json(&mut self, key: &str) -> Option<Value> {
        self.map.remove(key)
    }

    /// A list of strings.
    pub fn strings(&mut self, key: &str) -> Result<Option<Vec<String>>, String> {
        match self.map.remove(key) {
            None | Some(Value::Null) => Ok(None),
            Some(value) => self.list(key, value).map(Some),
        }
    }

    /// An object of lists of strings.
    pub fn lists(&mut self, key: &str) -> Result<BTreeMap<String, Vec<String>>, String> {
        match self.map.remove(key) {
            None | Some(Value::Null) => Ok(BTreeMap::new()),
            Some(Value::Object(map)) => map
                .into_iter()
                .map(|(k, v)| Ok((k, self.list(key, v)?)))
                .collect(),
            Some(_) => Err(self.wrong(key, "an object of lists of strings")),
        }
    }

    /// An object of strings.
    pub fn table(&mut self, key: &str) -> Result<BTreeMap<String, String>, String> {
        let bad = self.wrong(key, "an object of strings");
        match self.map.remove(key) {
            None | Some(Value::Null) => Ok(BTreeMap::new()),
            Some(Value::Object(map)) => map
                .into_iter()
                .map(|(k, v)| match v {
                    Value::String(v) => Ok((k, v)),
                    _ => Err(bad.clone()),
                })
                .collect(),
            Some(_) => Err(bad),
        }
    }

    /// A list of objects of strings.
    pub fn records(&mut self, key: &str) -> Result<Vec<BTreeMap<String, String>>, String> {
        let bad = self.wrong(key, "a list of objects of strings");
        match self.map.remove(key) {
            None | Some(Value::Null) => Ok(Vec::new()),
            Some(Value::Array(items)) => items
                .into_iter()
                .map(|item| {
                    let Value::Object(map) = item else {
                        return Err(bad.clone());
                    };
                    map.into_iter()
                        .map(|(k, v)| match v {
                            Value::String(v) => Ok((k, v)),
                            _ => Err(bad.clone()),
                        })
                        .collect()
                })
                .collect(),
            Some(_) => Err(bad),
        }
    }

    /// Refuses a grant name that is a path or command line (what cc-metric-collector's
    /// keys hold), saying what to do instead.
    pub fn check_grant(&self, key: &str, name: &str) -> Result<(), String> {
        if name.is_empty() || name.contains('/') || name.chars().any(char::is_whitespace) {
            return Err(format!(
                "{}: `{key}` names a grant of the plugin's capabilities.run, not a path or \
                 command line ({}): grant the executable and its arguments there under a \
                 name and give that name",
                self.collector,
                crate::quoted(name, 80)
            ));
        }
        Ok(())
    }

    /// An object of objects of strings.
    pub fn tables(
        &mut self,
        key: &str,
    ) -> Result<BTreeMap<String, BTreeMap<String, String>>, String> {
        let bad = self.wrong(key, "an object of objects of strings");
        let bad = || bad.clone();
        match self.map.remove(key) {
            None | Some(Value::Null) => Ok(BTreeMap::new()),
            Some(Value::Object(map)) => {
                let mut out = BTreeMap::new();
                for (name, inner) in map {
                    let Value::Object(inner) = inner else {
                        return Err(bad());
                    };
                    let mut table = BTreeMap::new();
                    for (k, v) in inner {
                        let Value::String(v) = v else {
                            return Err(bad());
                        };
                        table.insert(k, v);
                    }
                    out.insert(name, table);
                }
                Ok(out)
            }
            Some(_) => Err(bad()),
        }
    }

    /// Refuses the keys nobody took.
    pub fn finish(self) -> Result<(), String> {
        match self.map.keys().next() {
            None => Ok(()),
            Some(key) => Err(format!(
                "{}: unknown configuration key `{key}`",
                self.collector
            )),
        }
    }
}

/// The shared keys: `hostname`, `cluster`, `exclude_metrics`, `meta_as_tags`.
pub fn common(options: &mut Options) -> Result<Common, String> {
    let defaults = Common::default();
    Ok(Common {
        hostname: options.string("hostname")?,
        cluster: options.string("cluster")?,
        exclude_metrics: options.strings("exclude_metrics")?.unwrap_or_default(),
        meta_as_tags: options
            .strings("meta_as_tags")?
            .unwrap_or(defaults.meta_as_tags),
        extra_tags: Vec::new(),
    })
}

/// A collector built from its own keys.
pub trait FromOptions: Sized {
    /// The collector's name, as its section of cc-metric-collector's configuration is called.
    const NAME: &'static str;

    /// Takes the collector's keys from `options`.
    fn from_options(options: &mut Options) -> Result<Self, String>;

    /// Adjusts the collector to the shared settings, for a collector that reads one of them
    /// in its own way (as `nfsiostat` reads `exclude_metrics`).
    fn with_common(self, common: &Common) -> Self {
        let _ = common;
        self
    }
}

impl FromOptions for cpustat::Cpustat {
    const NAME: &'static str = "cpustat";

    fn from_options(_: &mut Options) -> Result<Self, String> {
        Ok(cpustat::Cpustat::new())
    }
}

impl FromOptions for loadavg::Loadavg {
    const NAME: &'static str = "loadavg";

    fn from_options(_: &mut Options) -> Result<Self, String> {
        Ok(loadavg::Loadavg)
    }
}

impl FromOptions for cpufreq::Cpufreq {
    const NAME: &'static str = "cpufreq";

    fn from_options(_: &mut Options) -> Result<Self, String> {
        Ok(cpufreq::Cpufreq)
    }
}

impl FromOptions for cpufreq_cpuinfo::CpufreqCpuinfo {
    const NAME: &'static str = "cpufreq_cpuinfo";

    fn from_options(_: &mut Options) -> Result<Self, String> {
        Ok(cpufreq_cpuinfo::CpufreqCpuinfo)
    }
}

impl FromOptions for memstat::Memstat {
    const NAME: &'static str = "memstat";

    fn from_options(o: &mut Options) -> Result<Self, String> {
        let d = memstat::Config::default();
        Ok(memstat::Memstat::new(memstat::Config {
            node_stats: o.bool("node_stats", d.node_stats)?,
            numa_stats: o.bool("numa_stats", d.numa_stats)?,
        }))
    }
}

impl FromOptions for netstat::Netstat {
    const NAME: &'static str = "netstat";

    fn from_options(o: &mut Options) -> Result<Self, String> {
        let d = netstat::Config::default();
        Ok(netstat::Netstat::new(netstat::Config {
            include_devices: o.strings("include_devices")?.unwrap_or_default(),
            exclude_devices: o.strings("exclude_devices")?.unwrap_or(d.exclude_devices),
            send_abs_values: o.bool("send_abs_values", d.send_abs_values)?,
            send_derived_values: o.bool("send_derived_values", d.send_derived_values)?,
            interface_aliases: o.lists("interface_aliases")?,
        }))
    }
}

impl FromOptions for iostat::Iostat {
    const NAME: &'static str = "iostat";

    fn from_options(o: &mut Options) -> Result<Self, String> {
        Ok(iostat::Iostat::new(iostat::Config {
            exclude_devices: o.strings("exclude_devices")?.unwrap_or_default(),
        }))
    }
}

impl FromOptions for diskstat::Diskstat {
    const NAME: &'static str = "diskstat";

    fn from_options(o: &mut Options) -> Result<Self, String> {
        let d = diskstat::Config::default();
        Ok(diskstat::Diskstat::new(diskstat::Config {
            mount_points: o.strings("mount_points")?.unwrap_or(d.mount_points),
            exclude_mounts: o.strings("exclude_mounts")?.unwrap_or_default(),
        }))
    }
}

impl FromOptions for numastats::Numastats {
    const NAME: &'static str = "numastats";

    fn from_options(o: &mut Options) -> Result<Self, String> {
        let d = numastats::Config::default();
        Ok(numastats::Numastats::new(numastats::Config {
            send_abs_values: o.bool("send_abs_values", d.send_abs_values)?,
            send_derived_values: o.bool("send_derived_values", d.send_derived_values)?,
        }))
    }
}

impl FromOptions for tempstat::Tempstat {
    const NAME: &'static str = "tempstat";

    fn from_options(o: &mut Options) -> Result<Self, String> {
        Ok(tempstat::Tempstat::new(tempstat::Config {
            tag_override: o.tables("tag_override")?,
            report_max_temperature: o.bool("report_max_temperature", false)?,
            report_critical_temperature: o.bool("report_critical_temperature", false)?,
        }))
    }
}

impl FromOptions for nfsstat::Nfs3stat {
    const NAME: &'static str = "nfs3stat";

    fn from_options(o: &mut Options) -> Result<Self, String> {
        // cc-metric-collector's path of the `nfsstat` binary: taken so its configurations
        // carry over, unused since the counters are read from their file.
        o.string("nfsstat")?;
        Ok(nfsstat::Nfs3stat::default())
    }
}

impl FromOptions for nfsstat::Nfs4stat {
    const NAME: &'static str = "nfs4stat";

    fn from_options(o: &mut Options) -> Result<Self, String> {
        o.string("nfsstat")?;
        Ok(nfsstat::Nfs4stat::default())
    }
}

impl FromOptions for nfsiostat::Nfsiostat {
    const NAME: &'static str = "nfsiostat";

    fn from_options(o: &mut Options) -> Result<Self, String> {
        let d = nfsiostat::Config::default();
        // Its `exclude_metrics` (the shared key) names counters without the `nfsio_`
        // prefix, for both the value and the rate: see `with_common`.
        Ok(nfsiostat::Nfsiostat::new(nfsiostat::Config {
            exclude_metrics: Vec::new(),
            exclude_filesystem: o.strings("exclude_filesystem")?.unwrap_or_default(),
            use_server_as_stype: o.bool("use_server_as_stype", d.use_server_as_stype)?,
            send_abs_values: o.bool("send_abs_values", d.send_abs_values)?,
            send_derived_values: o.bool("send_derived_values", d.send_derived_values)?,
        }))
    }

    fn with_common(self, common: &Common) -> Self {
        self.exclude_metrics(common.exclude_metrics.clone())
    }
}

impl FromOptions for schedstat::Schedstat {
    const NAME: &'static str = "schedstat";

    fn from_options(_: &mut Options) -> Result<Self, String> {
        Ok(schedstat::Schedstat::new())
    }
}

impl FromOptions for ibstat::Ibstat {
    const NAME: &'static str = "ibstat";

    fn from_options(o: &mut Options) -> Result<Self, String> {
        let d = ibstat::Config::default();
        Ok(ibstat::Ibstat::new(ibstat::Config {
            exclude_devices: o.strings("exclude_devices")?.unwrap_or_default(),
            send_abs_values: o.bool("send_abs_values", d.send_abs_values)?,
            send_derived_values: o.bool("send_derived_values", d.send_derived_values)?,
            send_total_values: o.bool("send_total_values", d.send_total_values)?,
        }))
    }
}

impl FromOptions for rapl::Rapl {
    const NAME: &'static str = "rapl";

    fn from_options(o: &mut Options) -> Result<Self, String> {
        Ok(rapl::Rapl::new(rapl::Config {
            exclude_device_by_id: o.strings("exclude_device_by_id")?.unwrap_or_default(),
            exclude_device_by_name: o.strings("exclude_device_by_name")?.unwrap_or_default(),
        }))
    }
}

impl FromOptions for slurm_cgroup::SlurmCgroup {
    const NAME: &'static str = "slurm_cgroup";

    fn from_options(o: &mut Options) -> Result<Self, String> {
        let d = slurm_cgroup::Config::default();
        if o.bool("use_sudo", false)? {
            return Err(
                "slurm_cgroup: `use_sudo` is not supported: the agent reads the cgroup files \
                 the plugin is granted (capabilities.read-files)"
                    .to_owned(),
            );
        }
        let version = match o.string("cgroup_version")?.as_deref() {
            None | Some("auto") => slurm_cgroup::CgroupVersion::Auto,
            Some("v1") => slurm_cgroup::CgroupVersion::V1,
            Some("v2") => slurm_cgroup::CgroupVersion::V2,
            Some(other) => {
                return Err(format!(
                    "slurm_cgroup: `cgroup_version` must be \"auto\", \"v1\" or \"v2\", not {other:?}"
                ));
            }
        };
        Ok(slurm_cgroup::SlurmCgroup::new(slurm_cgroup::Config {
            cgroup_base: cgroup_dir("cgroup_base", o.string("cgroup_base")?, d.cgroup_base)?,
            cgroup_root: cgroup_dir("cgroup_v1_root", o.string("cgroup_v1_root")?, d.cgroup_root)?,
            version,
        }))
    }
}

/// A cgroup directory of `slurm_cgroup`'s configuration. The agent grants the collector the
/// files below it as a `read-files` pattern, so it must name one directory outright: an
/// absolute path without `..` and without a pattern's characters (which would widen the
/// grant beyond the directory the administrator meant).
fn cgroup_dir(key: &str, value: Option<String>, default: String) -> Result<String, String> {
    let Some(dir) = value else {
        return Ok(default);
    };
    let plain = dir.starts_with('/')
        && !dir.split('/').any(|part| part == "..")
        && !dir.contains(['*', '?', '[', ']', '{', '}']);
    if plain {
        Ok(dir)
    } else {
        Err(format!(
            "slurm_cgroup: `{key}` must be an absolute directory path without `..` or \
             pattern characters, not {:?}",
            crate::quoted(&dir, 80)
        ))
    }
}

impl FromOptions for ipmistat::Ipmistat {
    const NAME: &'static str = "ipmistat";

    fn from_options(o: &mut Options) -> Result<Self, String> {
        o.refuse_executables(&["ipmitool_path", "ipmisensors_path"])?;
        let config = ipmistat::Config {
            ipmisensors_command: o.grant("ipmisensors_command", ipmistat::IPMISENSORS_GRANT)?,
            ipmitool_command: o.grant("ipmitool_command", ipmistat::IPMITOOL_GRANT)?,
            include_metrics: o
                .strings("include_metrics")?
                .unwrap_or_default()
                .iter()
                .map(|m| m.trim().to_lowercase())
                .filter(|m| !m.is_empty())
                .collect(),
        };
        if config.ipmisensors_command.is_empty() && config.ipmitool_command.is_empty() {
            return Err(
                "ipmistat: `ipmisensors_command` and `ipmitool_command` are both empty".to_owned(),
            );
        }
        Ok(ipmistat::Ipmistat::new(config))
    }
}

impl FromOptions for customcmd::Customcmd {
    const NAME: &'static str = "customcmd";

    fn from_options(o: &mut Options) -> Result<Self, String> {
        let commands = o.strings("commands")?.unwrap_or_default();
        for command in &commands {
            if command.is_empty() || command.contains('/') || command.contains(' ') {
                return Err(format!(
                    "customcmd: `commands` names grants of the plugin's capabilities.run, not \
                     command lines ({}): grant the executable and its arguments there under a \
                     name and list that name",
                    crate::quoted(command, 80)
                ));
            }
        }
        customcmd::Customcmd::new(customcmd::Config {
            commands,
            files: o.strings("files")?.unwrap_or_default(),
        })
    }
}

impl FromOptions for topprocs::Topprocs {
    const NAME: &'static str = "topprocs";

    fn from_options(o: &mut Options) -> Result<Self, String> {
        let d = topprocs::Config::default();
        let num_procs = o.uint("num_procs", d.num_procs as u64)?;
        if !(1..=topprocs::MAX_NUM_PROCS).contains(&num_procs) {
            return Err(format!(
                "topprocs: `num_procs` must be 1 to {}, not {num_procs}",
                topprocs::MAX_NUM_PROCS
            ));
        }
        Ok(topprocs::Topprocs::new(topprocs::Config {
            num_procs: num_procs as usize,
            ps_command: o.grant("ps_command", topprocs::PS_GRANT)?,
        }))
    }
}

impl FromOptions for lustrestat::Lustrestat {
    const NAME: &'static str = "lustrestat";

    fn from_options(o: &mut Options) -> Result<Self, String> {
        o.refuse_executables(&[])?;
        let d = lustrestat::Config::default();
        lustrestat::Lustrestat::new(lustrestat::Config {
            lctl_command: o.grant("lctl_command", lustrestat::LCTL_GRANT)?,
            send_abs_values: o.bool("send_abs_values", d.send_abs_values)?,
            send_diff_values: o.bool("send_diff_values", d.send_diff_values)?,
            send_derived_values: o.bool("send_derived_values", d.send_derived_values)?,
        })
    }
}

impl FromOptions for gpfs::Gpfs {
    const NAME: &'static str = "gpfs";

    fn from_options(o: &mut Options) -> Result<Self, String> {
        o.refuse_executables(&["mmpmon_path"])?;
        let d = gpfs::Config::default();
        gpfs::Gpfs::new(gpfs::Config {
            mmpmon_command: o.grant("mmpmon_command", gpfs::MMPMON_GRANT)?,
            exclude_filesystem: o.strings("exclude_filesystem")?.unwrap_or_default(),
            send_abs_values: o.bool("send_abs_values", d.send_abs_values)?,
            send_diff_values: o.bool("send_diff_values", d.send_diff_values)?,
            send_derived_values: o.bool("send_derived_values", d.send_derived_values)?,
            send_total_values: o.bool("send_total_values", d.send_total_values)?,
            send_bandwidths: o.bool("send_bandwidths", d.send_bandwidths)?,
        })
    }
}

impl FromOptions for smartmon::Smartmon {
    const NAME: &'static str = "smartmon";

    fn from_options(o: &mut Options) -> Result<Self, String> {
        o.refuse_executables(&[])?;
        let mut devices = Vec::new();
        for mut entry in o.records("devices")? {
            let name = entry
                .remove("name")
                .filter(|n| !n.is_empty())
                .ok_or_else(|| {
                    "smartmon: each of `devices` needs a `name` (e.g. \"/dev/nvme0\")".to_owned()
                })?;
            // The type is part of the grant's arguments (`--device=<type>`); taken so
            // cc-metric-collector's entries carry over.
            entry.remove("type");
            let command = match entry.remove("command") {
                Some(command) => command,
                None => smartmon::device_grant(&name).ok_or_else(|| {
                    format!(
                        "smartmon: the device {} is too long a name for a grant: give its \
                         `command`",
                        crate::quoted(&name, 80)
                    )
                })?,
            };
            o.check_grant("devices[].command", &command)?;
            if let Some(key) = entry.keys().next() {
                return Err(format!(
                    "smartmon: unknown key `{key}` in `devices` (name, type, command)"
                ));
            }
            devices.push(smartmon::Device { name, command });
        }
        smartmon::Smartmon::new(smartmon::Config {
            scan_command: o.grant("scan_command", smartmon::SCAN_GRANT)?,
            devices,
            exclude_devices: o.strings("exclude_devices")?.unwrap_or_default(),
            exclude_metrics: o.strings("excludeMetrics")?.unwrap_or_default(),
        })
    }
}

fn beegfs_config(o: &mut Options) -> Result<beegfs::Config, String> {
    o.refuse_executables(&["beegfs_path"])?;
    let mount_commands = o.table("mount_commands")?;
    for grant in mount_commands.values() {
        o.check_grant("mount_commands", grant)?;
    }
    Ok(beegfs::Config {
        exclude_filesystem: o.strings("exclude_filesystem")?.unwrap_or_default(),
        // Its `exclude_metrics` (the shared key) names operations: see `with_common`.
        exclude_metrics: Vec::new(),
        mount_commands,
    })
}

impl FromOptions for beegfs::BeegfsMeta {
    const NAME: &'static str = "beegfs_meta";

    fn from_options(o: &mut Options) -> Result<Self, String> {
        Ok(beegfs::BeegfsMeta(beegfs::Beegfs::new(
            beegfs::NodeType::Meta,
            beegfs_config(o)?,
        )))
    }

    fn with_common(self, common: &Common) -> Self {
        beegfs::BeegfsMeta(self.0.exclude_metrics(common.exclude_metrics.clone()))
    }
}

impl FromOptions for beegfs::BeegfsStorage {
    const NAME: &'static str = "beegfs_storage";

    fn from_options(o: &mut Options) -> Result<Self, String> {
        Ok(beegfs::BeegfsStorage(beegfs::Beegfs::new(
            beegfs::NodeType::Storage,
            beegfs_config(o)?,
        )))
    }

    fn with_common(self, common: &Common) -> Self {
        beegfs::BeegfsStorage(self.0.exclude_metrics(common.exclude_metrics.clone()))
    }
}

impl FromOptions for nvidia::Nvidia {
    const NAME: &'static str = "nvidia";

    fn from_options(o: &mut Options) -> Result<Self, String> {
        Ok(nvidia::Nvidia::new(nvidia::Config {
            exclude_devices: o.strings("exclude_devices")?.unwrap_or_default(),
            exclude_metrics: Vec::new(),
            process_mig_devices: o.bool("process_mig_devices", false)?,
            use_pci_info_as_type_id: o.bool("use_pci_info_as_type_id", false)?,
            add_pci_info_tag: o.bool("add_pci_info_tag", false)?,
            add_uuid_meta: o.bool("add_uuid_meta", false)?,
            add_board_number_meta: o.bool("add_board_number_meta", false)?,
            add_serial_meta: o.bool("add_serial_meta", false)?,
            use_uuid_for_mig_device: o.bool("use_uuid_for_mig_device", false)?,
            use_slice_for_mig_device: o.bool("use_slice_for_mig_device", false)?,
            meta_as_tags: Vec::new(),
        }))
    }

    // `exclude_metrics` also leaves out the `_sum` of an excluded NVLink counter, and
    // `meta_as_tags` may name the device's meta: both are read by the collector.
    fn with_common(mut self, common: &Common) -> Self {
        self.set_common(&common.exclude_metrics, &common.meta_as_tags);
        self
    }
}

impl FromOptions for rocm_smi::RocmSmi {
    const NAME: &'static str = "rocm_smi";

    fn from_options(o: &mut Options) -> Result<Self, String> {
        Ok(rocm_smi::RocmSmi::new(rocm_smi::Config {
            exclude_devices: o.strings("exclude_devices")?.unwrap_or_default(),
            use_pci_info_as_type_id: o.bool("use_pci_info_as_type_id", false)?,
            add_pci_info_tag: o.bool("add_pci_info_tag", false)?,
            add_serial_meta: o.bool("add_serial_meta", false)?,
            meta_as_tags: Vec::new(),
        }))
    }

    // `meta_as_tags` may name the GPU's meta (`serial`, `group`, `source`), which the
    // collector reads; `exclude_metrics` is applied by the runner.
    fn with_common(mut self, common: &Common) -> Self {
        self.set_meta_as_tags(&common.meta_as_tags);
        self
    }
}

/// The extra tags a service configuration gives a collector: `{"<collector>": {"tags":
/// {...}}}`; non-string values are written as JSON.
pub fn extra_tags(collector: &str, service_config: &str) -> Result<Vec<(String, String)>, String> {
    let config: Value = serde_json::from_str(service_config)
        .map_err(|e| format!("{collector}: the service configuration is not JSON: {e}"))?;
    let mut tags = Vec::new();
    if let Some(Value::Object(extra)) = config.get(collector).and_then(|c| c.get("tags")) {
        for (key, value) in extra {
            let value = match value {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            tags.push((key.to_owned(), value));
        }
    }
    Ok(tags)
}
