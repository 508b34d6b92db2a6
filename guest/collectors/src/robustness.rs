//! Every collector over damaged files: each file of a recorded round cut at every length and
//! with bytes replaced, collected twice. A round may fail with a message; none may panic,
//! and a round over the intact files after damage must succeed again.

use alloc::collections::BTreeMap;
use alloc::string::{String, ToString};
use alloc::vec::Vec;

use crate::{Collector, Files, FsStats, Sample};

/// Files held in memory; directories are what the paths imply.
#[derive(Clone, Default)]
struct Memory(BTreeMap<String, String>);

impl Files for Memory {
    fn read(&mut self, path: &str) -> Result<String, String> {
        self.0
            .get(path)
            .cloned()
            .ok_or_else(|| "missing".to_string())
    }

    fn list_dir(&mut self, path: &str) -> Result<Vec<String>, String> {
        let prefix = alloc::format!("{path}/");
        let mut names: Vec<String> = self
            .0
            .keys()
            .filter_map(|k| k.strip_prefix(prefix.as_str()))
            .map(|rest| rest.split('/').next().unwrap_or_default().to_string())
            .collect();
        names.dedup();
        if names.is_empty() {
            return Err("missing".to_string());
        }
        Ok(names)
    }

    fn statvfs(&mut self, path: &str) -> Result<FsStats, String> {
        if path.is_empty() {
            return Err("missing".to_string());
        }
        Ok(FsStats {
            block_size: 4096,
            blocks: 1 << 24,
            blocks_free: 1 << 23,
            blocks_available: 1 << 22,
        })
    }
}

macro_rules! fixture {
    ($($path:literal),* $(,)?) => {
        [$(($path, include_str!(concat!("../../../host/tests/fixtures/hpc/round2", $path)))),*]
    };
}

fn files() -> Memory {
    let all = fixture!(
        "/proc/net/rpc/nfs",
        "/proc/self/mounts",
        "/proc/self/mountstats",
        "/proc/schedstat",
        "/proc/cpuinfo",
        "/sys/class/infiniband/mlx5_0/ports/1/lid",
        "/sys/class/infiniband/mlx5_0/ports/1/counters/port_rcv_data",
        "/sys/class/infiniband/mlx5_0/ports/1/counters/port_xmit_data",
        "/sys/class/infiniband/mlx5_0/ports/1/counters/port_rcv_packets",
        "/sys/class/infiniband/mlx5_0/ports/1/counters/port_xmit_packets",
        "/sys/devices/virtual/powercap/intel-rapl/intel-rapl:0/name",
        "/sys/devices/virtual/powercap/intel-rapl/intel-rapl:0/energy_uj",
        "/sys/devices/virtual/powercap/intel-rapl/intel-rapl:0/max_energy_range_uj",
        "/sys/devices/virtual/powercap/intel-rapl/intel-rapl:0/intel-rapl:0:0/name",
        "/sys/devices/virtual/powercap/intel-rapl/intel-rapl:0/intel-rapl:0:0/energy_uj",
        "/sys/devices/virtual/powercap/intel-rapl/intel-rapl:0/intel-rapl:0:0/max_energy_range_uj",
        "/sys/devices/system/cpu/online",
        "/sys/fs/cgroup/cgroup.controllers",
        "/sys/fs/cgroup/system.slice/slurmstepd.scope/job_4711/memory.current",
        "/sys/fs/cgroup/system.slice/slurmstepd.scope/job_4711/memory.peak",
        "/sys/fs/cgroup/system.slice/slurmstepd.scope/job_4711/memory.max",
        "/sys/fs/cgroup/system.slice/slurmstepd.scope/job_4711/cpu.stat",
        "/sys/fs/cgroup/system.slice/slurmstepd.scope/job_4711/cpuset.cpus",
    );
    Memory(
        all.iter()
            .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
            .collect(),
    )
}

fn collectors() -> Vec<alloc::boxed::Box<dyn Collector>> {
    use alloc::boxed::Box;
    alloc::vec![
        Box::new(crate::nfsstat::Nfs3stat::default()),
        Box::new(crate::nfsstat::Nfs4stat::default()),
        Box::new(crate::nfsiostat::Nfsiostat::new(crate::nfsiostat::Config {
            send_derived_values: true,
            ..Default::default()
        })),
        Box::new(crate::schedstat::Schedstat::new()),
        Box::new(crate::ibstat::Ibstat::new(crate::ibstat::Config {
            send_derived_values: true,
            send_total_values: true,
            ..Default::default()
        })),
        Box::new(crate::rapl::Rapl::default()),
        Box::new(crate::slurm_cgroup::SlurmCgroup::default()),
        Box::new(crate::diskstat::Diskstat::default()),
        Box::new(crate::cpufreq_cpuinfo::CpufreqCpuinfo),
    ]
}

/// Damaged versions of `text`: cut at every length (up to a bound) and with a byte at each
/// position replaced by characters that break numbers and fields.
fn damaged(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let step = (text.len() / 40).max(1);
    for cut in (0..text.len()).step_by(step) {
        if text.is_char_boundary(cut) {
            out.push(String::from(&text[..cut]));
        }
    }
    for at in (0..text.len()).step_by(step) {
        for replacement in ["x", "\n", "99999999999999999999999"] {
            if text.is_char_boundary(at) && text.is_char_boundary(at + 1) {
                let mut s = String::from(&text[..at]);
                s.push_str(replacement);
                s.push_str(&text[at + 1..]);
                out.push(s);
            }
        }
    }
    out
}

#[test]
fn damaged_files_fail_a_round_at_most_and_never_panic() {
    let good = files();
    for (path, text) in good.0.clone() {
        for broken in damaged(&text) {
            for mut collector in collectors() {
                let mut files = good.clone();
                let mut out: Vec<Sample> = Vec::new();
                collector
                    .collect(&mut files, 1_000_000_000, &mut out)
                    .unwrap_or_else(|e| panic!("{}: intact round: {e}", collector.name()));
                files.0.insert(path.clone(), broken.clone());
                let _ = collector.collect(&mut files, 2_000_000_000, &mut out);
                let _ = collector.collect(&mut files, 3_000_000_000, &mut out);
                let mut files = good.clone();
                collector
                    .collect(&mut files, 4_000_000_000, &mut out)
                    .unwrap_or_else(|e| panic!("{}: recovery after {path}: {e}", collector.name()));
            }
        }
    }
}

/// Recorded outputs per grant name, as the host's `cc:fleet/commands` would return them.
#[derive(Clone, Default)]
struct Recorded(BTreeMap<String, String>);

impl crate::Commands for Recorded {
    fn run(&mut self, name: &str) -> Result<crate::CommandOutput, String> {
        let stdout = self.0.get(name).ok_or_else(|| "not granted".to_string())?;
        Ok(crate::CommandOutput {
            status: Some(0),
            stdout: stdout.clone().into_bytes(),
            stderr: Vec::new(),
        })
    }
}

macro_rules! recorded {
    ($($grant:literal => $file:literal),* $(,)?) => {
        [$(($grant, include_str!(concat!("../../../host/tests/fixtures/commands/", $file)))),*]
    };
}

fn outputs() -> Recorded {
    let all = recorded!(
        "ipmi-sensors" => "ipmi-sensors.csv",
        "ipmitool-sensor" => "ipmitool-sensor.txt",
        "ps-top" => "ps-pcpu.txt",
        "lctl-llite-stats" => "lctl-llite-stats-1.txt",
        "mmpmon-fs-io" => "mmpmon-fs_io_s-1.txt",
        "app" => "customcmd-app.lp",
        "smartctl-scan" => "smartctl-scan-1.json",
        "smartctl-nvme0" => "smartctl-nvme0-1.json",
        "smartctl-sda" => "smartctl-sda.json",
        "beegfs-meta-mnt-beeond" => "beegfs-ctl-meta-1.txt",
        "beegfs-storage-mnt-beeond" => "beegfs-ctl-storage-1.txt",
    );
    Recorded(
        all.iter()
            .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
            .collect(),
    )
}

fn command_collectors() -> Vec<alloc::boxed::Box<dyn crate::CommandCollector>> {
    use alloc::boxed::Box;
    let every = |c: crate::gpfs::Config| crate::gpfs::Config {
        send_abs_values: true,
        send_diff_values: true,
        send_derived_values: true,
        send_total_values: true,
        ..c
    };
    alloc::vec![
        Box::new(crate::ipmistat::Ipmistat::default()),
        Box::new(crate::ipmistat::Ipmistat::new(crate::ipmistat::Config {
            ipmisensors_command: String::new(),
            ..Default::default()
        })),
        Box::new(crate::topprocs::Topprocs::default()),
        Box::new(
            crate::lustrestat::Lustrestat::new(crate::lustrestat::Config {
                send_abs_values: true,
                send_diff_values: true,
                send_derived_values: true,
                ..Default::default()
            })
            .unwrap(),
        ),
        Box::new(crate::gpfs::Gpfs::new(every(Default::default())).unwrap()),
        Box::new(crate::smartmon::Smartmon::default()),
        Box::new(crate::beegfs::BeegfsMeta(crate::beegfs::Beegfs::new(
            crate::beegfs::NodeType::Meta,
            crate::beegfs::Config {
                exclude_metrics: alloc::vec!["ack".to_string()],
                ..Default::default()
            },
        ))),
        Box::new(crate::beegfs::BeegfsStorage::default()),
        Box::new(
            crate::customcmd::Customcmd::new(crate::customcmd::Config {
                commands: alloc::vec!["app".to_string()],
                files: Vec::new(),
            })
            .unwrap(),
        ),
    ]
}

#[test]
fn damaged_command_output_fails_a_round_at_most_and_never_panics() {
    let good = outputs();
    // The BeeOND mount the beegfs collectors find.
    let mut files = Memory::default();
    files.0.insert(
        crate::mounts::PATH.to_string(),
        "beegfs_ondemand /mnt/beeond beegfs rw 0 0\n".to_string(),
    );
    for (grant, text) in good.0.clone() {
        for broken in damaged(&text) {
            for mut collector in command_collectors() {
                let mut commands = good.clone();
                let mut out: Vec<Sample> = Vec::new();
                collector
                    .collect(&mut commands, &mut files, 1_000_000_000, &mut out)
                    .unwrap_or_else(|e| panic!("{}: intact round: {e}", collector.name()));
                commands.0.insert(grant.clone(), broken.clone());
                let _ = collector.collect(&mut commands, &mut files, 2_000_000_000, &mut out);
                let _ = collector.collect(&mut commands, &mut files, 3_000_000_000, &mut out);
                let mut commands = good.clone();
                collector
                    .collect(&mut commands, &mut files, 4_000_000_000, &mut out)
                    .unwrap_or_else(|e| {
                        panic!("{}: recovery after {grant}: {e}", collector.name())
                    });
            }
        }
    }
}

/// Arbitrary bytes from a small generator (no dependency): every parser of command output
/// takes them without panicking.
#[test]
fn arbitrary_output_never_panics_a_parser() {
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let alphabet: &[u8] =
        b"_0123456789.,|= \n\"\\-+eExiu#llite.stats=_fs_io_s_ _rc_ COMMAND N/A na 0x[]{}:Sum";
    for round in 0..20_000 {
        let len = (next() % 160) as usize;
        let mut bytes: Vec<u8> = (0..len)
            .map(|_| alphabet[(next() % alphabet.len() as u64) as usize])
            .collect();
        if round % 7 == 0 {
            bytes.push(0xc3);
        }
        let text = String::from_utf8_lossy(&bytes);
        let _ = crate::ipmistat::parse_ipmi_sensors(&text);
        let _ = crate::ipmistat::parse_ipmitool(&text);
        let _ = crate::topprocs::parse(&text);
        let _ = crate::lustrestat::parse(&text);
        let _ = crate::gpfs::parse(&text);
        let _ = crate::beegfs::parse(&text);
        if let Ok(report) = serde_json::from_str::<serde_json::Value>(&text) {
            let _ = crate::smartmon::parse_scan(&report);
            let _ = crate::smartmon::parse_device(&report, "/dev/nvme0");
        }
        let _ = crate::lineproto::parse(&text);
        let mut out = Vec::new();
        let _ = crate::customcmd::samples(&text, &mut out);
    }
}
