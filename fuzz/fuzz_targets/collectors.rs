//! Every collector of the plugins (`ccfleet-collectors`) over hostile file contents and
//! command outputs: the first byte picks the collector, the rest is split into two rounds;
//! every file read and every granted command of a round answers that round's bytes. Rounds
//! may fail with a message; none may panic, and a round after damage must still answer.
#![no_main]

use ccfleet_collectors::config::{FromOptions, Options, common};
use ccfleet_collectors::{
    CommandCollector, CommandOutput, Collector, Commands, Files, FsStats, Sample, beegfs,
    cpufreq, cpufreq_cpuinfo, cpustat, customcmd, diskstat, gpfs, ibstat, iostat, ipmistat,
    loadavg, lustrestat, memstat, netstat, nfsiostat, nfsstat, numastats, rapl, schedstat,
    slurm_cgroup, smartmon, tempstat, topprocs,
};
use libfuzzer_sys::fuzz_target;

/// Every file and command answers `text`; directories list what its first line names.
struct Hostile<'a> {
    text: &'a str,
}

impl Files for Hostile<'_> {
    fn read(&mut self, _: &str) -> Result<String, String> {
        Ok(self.text.to_owned())
    }
    fn list_dir(&mut self, _: &str) -> Result<Vec<String>, String> {
        let first = self.text.lines().next().unwrap_or_default();
        let mut names: Vec<String> = first.split_whitespace().take(16).map(str::to_owned).collect();
        names.sort();
        names.dedup();
        Ok(names)
    }
    fn statvfs(&mut self, _: &str) -> Result<FsStats, String> {
        let n = self.text.len() as u64;
        Ok(FsStats {
            block_size: n % 8192,
            blocks: n.wrapping_mul(977),
            blocks_free: n.wrapping_mul(13),
            blocks_available: n,
        })
    }
}

impl Commands for Hostile<'_> {
    fn run(&mut self, _: &str) -> Result<CommandOutput, String> {
        Ok(CommandOutput {
            status: Some(i32::from(self.text.as_bytes().first().copied().unwrap_or(0) % 3)),
            stdout: self.text.as_bytes().to_vec(),
            stderr: Vec::new(),
        })
    }
}

fn built<C: FromOptions>(config: &str) -> C {
    let mut options = Options::parse(C::NAME, config).expect("a valid configuration");
    let shared = common(&mut options).expect("shared keys");
    let collector = C::from_options(&mut options).expect("the collector's keys");
    options.finish().expect("no other keys");
    collector.with_common(&shared)
}

enum Any {
    Files(Box<dyn Collector>),
    Commands(Box<dyn CommandCollector>),
}

fn collector(pick: u8) -> Any {
    let all = r#"{"send_abs_values": true, "send_derived_values": true}"#;
    match pick % 25 {
        0 => Any::Files(Box::new(built::<cpustat::Cpustat>("{}"))),
        1 => Any::Files(Box::new(built::<memstat::Memstat>(r#"{"numa_stats": true}"#))),
        2 => Any::Files(Box::new(built::<loadavg::Loadavg>("{}"))),
        3 => Any::Files(Box::new(built::<netstat::Netstat>(all))),
        4 => Any::Files(Box::new(built::<iostat::Iostat>("{}"))),
        5 => Any::Files(Box::new(built::<diskstat::Diskstat>("{}"))),
        6 => Any::Files(Box::new(built::<numastats::Numastats>(all))),
        7 => Any::Files(Box::new(built::<cpufreq::Cpufreq>("{}"))),
        8 => Any::Files(Box::new(built::<cpufreq_cpuinfo::CpufreqCpuinfo>("{}"))),
        9 => Any::Files(Box::new(built::<tempstat::Tempstat>(
            r#"{"report_max_temperature": true, "report_critical_temperature": true}"#,
        ))),
        10 => Any::Files(Box::new(built::<nfsstat::Nfs3stat>("{}"))),
        11 => Any::Files(Box::new(built::<nfsstat::Nfs4stat>("{}"))),
        12 => Any::Files(Box::new(built::<nfsiostat::Nfsiostat>(all))),
        13 => Any::Files(Box::new(built::<schedstat::Schedstat>("{}"))),
        14 => Any::Files(Box::new(built::<ibstat::Ibstat>(
            r#"{"send_abs_values": true, "send_derived_values": true, "send_total_values": true}"#,
        ))),
        15 => Any::Files(Box::new(built::<rapl::Rapl>("{}"))),
        16 => Any::Files(Box::new(built::<slurm_cgroup::SlurmCgroup>("{}"))),
        17 => Any::Commands(Box::new(built::<ipmistat::Ipmistat>("{}"))),
        18 => Any::Commands(Box::new(built::<customcmd::Customcmd>(
            r#"{"commands": ["a"], "files": ["/f"]}"#,
        ))),
        19 => Any::Commands(Box::new(built::<topprocs::Topprocs>(r#"{"num_procs": 10}"#))),
        20 => Any::Commands(Box::new(built::<lustrestat::Lustrestat>(
            r#"{"send_abs_values": true, "send_diff_values": true, "send_derived_values": true}"#,
        ))),
        21 => Any::Commands(Box::new(built::<gpfs::Gpfs>(
            r#"{"send_abs_values": true, "send_diff_values": true, "send_derived_values": true,
                "send_total_values": true, "send_bandwidths": true}"#,
        ))),
        22 => Any::Commands(Box::new(built::<smartmon::Smartmon>("{}"))),
        23 => Any::Commands(Box::new(built::<beegfs::BeegfsMeta>("{}"))),
        _ => Any::Commands(Box::new(built::<beegfs::BeegfsStorage>("{}"))),
    }
}

fn round(collector: &mut Any, text: &str, now: i64) -> Result<(), String> {
    let mut out: Vec<Sample> = Vec::new();
    match collector {
        Any::Files(c) => c.collect(&mut Hostile { text }, now, &mut out),
        Any::Commands(c) => c.collect(&mut Hostile { text }, &mut Hostile { text }, now, &mut out),
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&pick, rest)) = data.split_first() else {
        return;
    };
    let text = String::from_utf8_lossy(rest);
    let mid = text.len() / 2;
    let cut = (0..=mid).rev().find(|i| text.is_char_boundary(*i)).unwrap_or(0);
    let (first, second) = text.split_at(cut);
    let mut c = collector(pick);
    let _ = round(&mut c, first, 1_000_000_000);
    let _ = round(&mut c, second, 2_000_000_000);
    let _ = round(&mut c, first, 3_000_000_000);
});
