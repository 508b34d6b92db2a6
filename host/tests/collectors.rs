//! The collector plugins against recorded `/proc` and `/sys` trees.
//!
//! Each test copies a recorded round (`fixtures/collectors/round1`, then `round2`, and for
//! some a third round derived here with counter wraps and devices coming and going) into a
//! temporary file root, calls `collect` on the real component through the plugin host with
//! chosen timestamps, decodes the line protocol it emitted and compares every point (name,
//! tags including `unit`, value) with what this file computes from the same fixture files by
//! its own parsing, following cc-metric-collector's definitions.

#[path = "support/guests.rs"]
mod guests;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use ccfleet::lineproto::{Decoder, FieldValue as LpValue};
use ccfleet_host::plugin::Instance;
use ccfleet_host::sink::{self, BatchReceiver};
use ccfleet_host::{PluginSpec, Runtime, RuntimeOptions};
use serde_json::json;

/// The times handed to `collect`: the fixtures were recorded 5 s apart.
const T1: i64 = 1_700_000_000_000_000_000;
const T2: i64 = T1 + 5_000_000_000;
const T3: i64 = T2 + 10_000_000_000;

const HOST: &str = "fixture-node";

#[derive(Debug, Clone, Copy, PartialEq)]
enum V {
    F(f64),
    I(i64),
    U(u64),
}

/// One point as emitted (or expected): name, tags, value.
#[derive(Debug, Clone, PartialEq)]
struct Got {
    name: String,
    tags: BTreeMap<String, String>,
    value: V,
}

fn point(name: &str, tags: &[(&str, &str)], value: V) -> Got {
    let mut all: BTreeMap<String, String> = tags
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    all.entry("hostname".to_owned())
        .or_insert_with(|| HOST.to_owned());
    Got {
        name: name.to_owned(),
        tags: all,
        value,
    }
}

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/collectors")
}

fn round(n: u8) -> PathBuf {
    fixtures().join(format!("round{n}"))
}

/// The recorded rounds of the HPC collectors (NFS, InfiniBand, RAPL, Slurm cgroups, ...).
fn hpc_round(n: u8) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/fixtures/hpc/round{n}"))
}

/// Copies a tree over `to`, replacing files that exist.
fn copy_tree(from: &Path, to: &Path) {
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            std::fs::create_dir_all(&target).unwrap();
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

fn read(root: &Path, path: &str) -> String {
    std::fs::read_to_string(root.join(path.trim_start_matches('/'))).unwrap()
}

/// One collector plugin over a temporary file root.
struct Run {
    _runtime: Runtime,
    root: tempfile::TempDir,
    instance: Instance,
    rx: BatchReceiver,
}

impl Run {
    async fn start(component: &str, config: serde_json::Value, grants: &[&str]) -> Run {
        Run::start_over(&round(1), component, config, grants, false).await
    }

    /// A plugin over the HPC fixtures' first round, with `capabilities.mount-info`.
    async fn hpc(component: &str, config: serde_json::Value, grants: &[&str]) -> Run {
        Run::start_over(&hpc_round(1), component, config, grants, true).await
    }

    async fn start_over(
        first: &Path,
        component: &str,
        config: serde_json::Value,
        grants: &[&str],
        mount_info: bool,
    ) -> Run {
        let root = tempfile::tempdir().unwrap();
        copy_tree(first, root.path());
        let runtime = Runtime::new(RuntimeOptions {
            cache_dir: None,
            ..RuntimeOptions::default()
        })
        .unwrap();
        let mut spec = PluginSpec::new(guests::component(component));
        spec.config = config;
        spec.capabilities.read_files = grants.iter().map(|g| (*g).to_owned()).collect();
        spec.capabilities
            .read_files
            .push("/proc/sys/kernel/hostname".to_owned());
        spec.capabilities.files_root = Some(root.path().to_path_buf());
        spec.capabilities.mount_info = mount_info;
        let loaded = runtime.load(&spec).await.expect("loads");
        let (sink, rx) = sink::channel(16);
        let instance = loaded
            .instantiate(&runtime, &spec, sink)
            .await
            .expect("instantiates and inits");
        Run {
            _runtime: runtime,
            root,
            instance,
            rx,
        }
    }

    fn root(&self) -> &Path {
        self.root.path()
    }

    /// Calls `collect` and decodes what it emitted (nothing is an empty list).
    async fn collect(&mut self, now_ns: i64) -> Vec<Got> {
        let outcome = self.instance.collect(now_ns).await;
        assert_eq!(outcome, Ok(Ok(())), "collect");
        let mut points = Vec::new();
        while let Ok(batch) = self.rx.try_recv() {
            for line in Decoder::new(&batch.lines) {
                let line = line.expect("valid line protocol");
                assert_eq!(line.time(), Some(now_ns), "the collect call's time");
                let tags = line
                    .tags()
                    .map(|(k, v)| (k.raw().to_owned(), v.unescape().into_owned()))
                    .collect();
                let fields: Vec<_> = line.fields().collect();
                assert_eq!(fields.len(), 1, "one field");
                assert_eq!(fields[0].0.raw(), "value");
                let value = match fields[0].1 {
                    LpValue::Float(v) => V::F(v),
                    LpValue::Int(v) => V::I(v),
                    LpValue::Uint(v) => V::U(v),
                    ref other => panic!("unexpected value {other:?}"),
                };
                points.push(Got {
                    name: line.measurement().unescape().into_owned(),
                    tags,
                    value,
                });
            }
        }
        points
    }

    /// Calls `collect`, which must fail (and not trap): its message.
    async fn collect_fails(&mut self, now_ns: i64) -> String {
        match self.instance.collect(now_ns).await {
            Ok(Err(message)) => {
                assert!(
                    self.rx.try_recv().is_err(),
                    "nothing emitted by a failed round"
                );
                message
            }
            other => panic!("collect must fail with the plugin's error: {other:?}"),
        }
    }

    /// Makes round `n` of the HPC fixtures the current files.
    fn put_hpc(&self, n: u8) {
        copy_tree(&hpc_round(n), self.root());
    }

    fn remove(&self, path: &str) {
        let path = self.root().join(path.trim_start_matches('/'));
        if path.is_dir() {
            std::fs::remove_dir_all(path).unwrap();
        } else {
            std::fs::remove_file(path).unwrap();
        }
    }

    /// Makes round `n` the current files.
    fn put(&self, n: u8) {
        copy_tree(&round(n), self.root());
    }

    fn write(&self, path: &str, text: &str) {
        let path = self.root().join(path.trim_start_matches('/'));
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }
}

fn key(p: &Got) -> (String, Vec<(String, String)>) {
    (
        p.name.clone(),
        p.tags.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
    )
}

/// Every expected point is emitted once, nothing else; floats to 1e-9 relative.
fn assert_points(mut got: Vec<Got>, mut expected: Vec<Got>) {
    got.sort_by_key(key);
    expected.sort_by_key(key);
    let names = |ps: &[Got]| ps.iter().map(key).collect::<Vec<_>>();
    assert_eq!(names(&got), names(&expected), "the same points");
    for (g, e) in got.iter().zip(&expected) {
        let same = match (g.value, e.value) {
            (V::I(a), V::I(b)) => a == b,
            (V::U(a), V::U(b)) => a == b,
            (V::F(a), V::F(b)) => (a - b).abs() <= 1e-9 * b.abs().max(1.0),
            _ => false,
        };
        assert!(
            same,
            "{} {:?}: got {:?}, expected {:?}",
            g.name, g.tags, g.value, e.value
        );
    }
}

/// `label -> numbers` of the `cpu` lines of /proc/stat.
fn stat_rows(text: &str) -> BTreeMap<String, Vec<u64>> {
    text.lines()
        .filter(|l| l.starts_with("cpu"))
        .map(|l| {
            let mut f = l.split_whitespace();
            let label = f.next().unwrap().to_owned();
            (label, f.map(|n| n.parse().unwrap()).collect())
        })
        .collect()
}

const CPU_NAMES: [&str; 10] = [
    "cpu_user",
    "cpu_nice",
    "cpu_system",
    "cpu_idle",
    "cpu_iowait",
    "cpu_irq",
    "cpu_softirq",
    "cpu_steal",
    "cpu_guest",
    "cpu_guest_nice",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cpustat_reports_time_shares_per_hwthread_and_node_from_counter_deltas() {
    let mut run = Run::start(
        "cpustat",
        json!({"cluster": "testcluster", "exclude_metrics": ["cpu_guest_nice"]}),
        &["/proc/stat"],
    )
    .await;
    let first = stat_rows(&read(run.root(), "/proc/stat"));
    let hwthreads = first.keys().filter(|k| *k != "cpu").count() as i64;
    assert!(hwthreads >= 1);
    let num_cpus = point(
        "num_cpus",
        &[("type", "node"), ("cluster", "testcluster")],
        V::I(hwthreads),
    );
    // The first round has no deltas yet.
    assert_points(run.collect(T1).await, vec![num_cpus.clone()]);

    run.put(2);
    let second = stat_rows(&read(run.root(), "/proc/stat"));
    let mut expected = vec![num_cpus];
    for (label, new) in &second {
        let old = &first[label];
        let delta: Vec<f64> = new.iter().zip(old).map(|(n, o)| (n - o) as f64).collect();
        // All CPU time: user to steal (guest time is inside user time).
        let total: f64 = delta[..8].iter().sum();
        let id = label.trim_start_matches("cpu").to_owned();
        let mut tags = vec![("cluster", "testcluster"), ("unit", "Percent")];
        if id.is_empty() {
            tags.push(("type", "node"));
        } else {
            tags.push(("type", "hwthread"));
            tags.push(("type-id", &id));
        }
        for (i, name) in CPU_NAMES.iter().enumerate() {
            if *name != "cpu_guest_nice" {
                expected.push(point(name, &tags, V::F(delta[i] * 100.0 / total)));
            }
        }
        expected.push(point(
            "cpu_used",
            &tags,
            V::F(100.0 - delta[3] * 100.0 / total),
        ));
    }
    assert_points(run.collect(T2).await, expected);
}

/// cc-metric-collector's names of /proc/meminfo keys.
const MEM_NAMES: [(&str, &str); 32] = [
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

/// `key -> (value, unit)` of a meminfo file (the node's or a NUMA domain's).
fn meminfo(text: &str) -> BTreeMap<String, (f64, Option<String>)> {
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let line = match line.strip_prefix("Node ") {
            // "Node 0 MemTotal: ..." without "Node 0".
            Some(rest) => rest.split_once(' ').unwrap().1,
            None => line,
        };
        let (key, rest) = line.split_once(':').unwrap();
        let mut f = rest.split_whitespace();
        let value: f64 = f.next().unwrap().parse().unwrap();
        out.insert(key.trim().to_owned(), (value, f.next().map(str::to_owned)));
    }
    out
}

fn memory_points(text: &str, tags: &[(&str, &str)], out: &mut Vec<Got>) {
    let info = meminfo(text);
    let with_unit = |unit: &Option<String>| {
        let mut t = tags.to_vec();
        if let Some(u) = unit {
            t.push(("unit", u.as_str()));
        }
        t.iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect::<Vec<_>>()
    };
    for (key, name) in MEM_NAMES {
        if let Some((value, unit)) = info.get(key) {
            let t = with_unit(unit);
            let t: Vec<(&str, &str)> = t.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            out.push(point(name, &t, V::F(*value)));
        }
    }
    let get = |k: &str| info.get(k).map_or(0.0, |e| e.0);
    // cc-metric-collector: total - free, and - buffers - cached - shmem where buffers exist.
    let used = if info.contains_key("Buffers") {
        get("MemTotal") - get("MemFree") - get("Buffers") - get("Cached") - get("Shmem")
    } else {
        get("MemTotal") - get("MemFree")
    };
    let t = with_unit(&info["MemTotal"].1);
    let t: Vec<(&str, &str)> = t.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    out.push(point("mem_used", &t, V::F(used)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memstat_reports_the_node_and_each_numa_domain_with_mem_used_as_cc_derives_it() {
    let mut run = Run::start(
        "memstat",
        json!({"numa_stats": true}),
        &["/proc/meminfo", "/sys/devices/system/node/node*/meminfo"],
    )
    .await;
    for (n, now) in [(1, T1), (2, T2)] {
        run.put(n);
        let mut expected = Vec::new();
        memory_points(
            &read(run.root(), "/proc/meminfo"),
            &[("type", "node")],
            &mut expected,
        );
        memory_points(
            &read(run.root(), "/sys/devices/system/node/node0/meminfo"),
            &[("type", "memoryDomain"), ("type-id", "0")],
            &mut expected,
        );
        assert!(expected.iter().any(|p| p.name == "mem_used"
            && p.tags.get("type").map(String::as_str) == Some("memoryDomain")));
        assert_points(run.collect(now).await, expected);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loadavg_reports_cc_metric_collectors_five_metrics() {
    let mut run = Run::start("loadavg", json!({}), &["/proc/loadavg"]).await;
    for (n, now) in [(1, T1), (2, T2)] {
        run.put(n);
        let text = read(run.root(), "/proc/loadavg");
        let f: Vec<&str> = text.split_whitespace().collect();
        let (running, total) = f[3].split_once('/').unwrap();
        let node = [("type", "node")];
        let expected = vec![
            point("load_one", &node, V::F(f[0].parse().unwrap())),
            point("load_five", &node, V::F(f[1].parse().unwrap())),
            point("load_fifteen", &node, V::F(f[2].parse().unwrap())),
            point("proc_run", &node, V::I(running.parse().unwrap())),
            point("proc_total", &node, V::I(total.parse().unwrap())),
        ];
        assert_points(run.collect(now).await, expected);
    }
}

/// `device -> [rx bytes, rx packets, tx bytes, tx packets]` of /proc/net/dev.
fn net_rows(text: &str) -> BTreeMap<String, [u64; 4]> {
    text.lines()
        .skip(2)
        .map(|l| {
            let (dev, rest) = l.split_once(':').unwrap();
            let n: Vec<u64> = rest
                .split_whitespace()
                .map(|x| x.parse().unwrap())
                .collect();
            (dev.trim().to_owned(), [n[0], n[1], n[8], n[9]])
        })
        .collect()
}

const NET: [(&str, &str, &str); 4] = [
    ("net_bytes_in", "bytes", "bytes/sec"),
    ("net_pkts_in", "packets", "packets/sec"),
    ("net_bytes_out", "bytes", "bytes/sec"),
    ("net_pkts_out", "packets", "packets/sec"),
];

/// The increase of a counter as the collectors define it: a 32-bit wrap if the old value
/// fits in 32 bits, otherwise a reset (no value).
fn increase(old: u64, new: u64) -> Option<u64> {
    if new >= old {
        Some(new - old)
    } else if old < (1 << 32) {
        Some((1 << 32) - old + new)
    } else {
        None
    }
}

fn net_expected(
    old: Option<&BTreeMap<String, [u64; 4]>>,
    new: &BTreeMap<String, [u64; 4]>,
    seconds: f64,
) -> Vec<Got> {
    let mut out = Vec::new();
    for (dev, values) in new {
        // The test's configuration excludes ifb0 (and so measures lo, which has traffic).
        if dev == "ifb0" {
            continue;
        }
        for (i, (name, unit, rate_unit)) in NET.iter().enumerate() {
            let tags = [
                ("type", "node"),
                ("stype", "network"),
                ("stype-id", dev.as_str()),
            ];
            let mut t = tags.to_vec();
            t.push(("unit", unit));
            out.push(point(name, &t, V::I(values[i] as i64)));
            if let Some(before) = old.and_then(|o| o.get(dev))
                && let Some(d) = increase(before[i], values[i])
            {
                let mut t = tags.to_vec();
                t.push(("unit", rate_unit));
                out.push(point(&format!("{name}_bw"), &t, V::F(d as f64 / seconds)));
            }
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn netstat_reports_totals_and_rates_per_device_across_wraps_and_device_changes() {
    let mut run = Run::start(
        "netstat",
        json!({"exclude_devices": ["ifb0"]}),
        &["/proc/net/dev"],
    )
    .await;
    let first = net_rows(&read(run.root(), "/proc/net/dev"));
    assert_points(run.collect(T1).await, net_expected(None, &first, 5.0));

    run.put(2);
    let second = net_rows(&read(run.root(), "/proc/net/dev"));
    let expected = net_expected(Some(&first), &second, 5.0);
    assert!(
        expected
            .iter()
            .any(|p| p.name.ends_with("_bw") && p.value != V::F(0.0)),
        "the recording has traffic to compare rates of"
    );
    assert_points(run.collect(T2).await, expected);

    // Round 3: eth0's received bytes wrapped at 32 bits, ifb1 is gone, eth1 is new.
    let text = read(run.root(), "/proc/net/dev");
    let mut lines: Vec<String> = Vec::new();
    for line in text.lines() {
        if line.trim_start().starts_with("ifb1:") {
            continue;
        }
        if line.trim_start().starts_with("eth0:") {
            let (dev, rest) = line.split_once(':').unwrap();
            let mut n: Vec<String> = rest.split_whitespace().map(str::to_owned).collect();
            assert!(n[0].parse::<u64>().unwrap() < 1 << 32, "a 32-bit counter");
            n[0] = "1000".to_owned();
            lines.push(format!("{dev}: {}", n.join(" ")));
        } else {
            lines.push(line.to_owned());
        }
    }
    lines.push("  eth1: 100 2 0 0 0 0 0 0 300 4 0 0 0 0 0 0".to_owned());
    run.write("/proc/net/dev", &(lines.join("\n") + "\n"));
    let third = net_rows(&read(run.root(), "/proc/net/dev"));
    assert!(!third.contains_key("ifb1") && third.contains_key("eth1"));
    let got = run.collect(T3).await;
    let wrapped = got
        .iter()
        .find(|p| p.name == "net_bytes_in_bw" && p.tags["stype-id"] == "eth0")
        .expect("a rate across the wrap");
    assert!(matches!(wrapped.value, V::F(v) if v > 0.0));
    assert_points(got, net_expected(Some(&second), &third, 10.0));
}

const IO_NAMES: [&str; 17] = [
    "io_reads",
    "io_reads_merged",
    "io_read_sectors",
    "io_read_ms",
    "io_writes",
    "io_writes_merged",
    "io_writes_sectors",
    "io_writes_ms",
    "io_ioops",
    "io_ioops_ms",
    "io_ioops_weighted_ms",
    "io_discards",
    "io_discards_merged",
    "io_discards_sectors",
    "io_discards_ms",
    "io_flushes",
    "io_flushes_ms",
];

fn disk_rows(text: &str) -> BTreeMap<String, Vec<u64>> {
    text.lines()
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (
                f[2].to_owned(),
                f[3..].iter().map(|n| n.parse().unwrap()).collect(),
            )
        })
        .filter(|(dev, _)| !dev.contains("loop"))
        .collect()
}

fn io_expected(old: &BTreeMap<String, Vec<u64>>, new: &BTreeMap<String, Vec<u64>>) -> Vec<Got> {
    let mut out = Vec::new();
    for (dev, values) in new {
        let Some(before) = old.get(dev) else { continue };
        let tags = [("type", "node"), ("device", dev.as_str())];
        for (i, name) in IO_NAMES.iter().enumerate().take(values.len()) {
            // The I/Os in flight are a gauge; the rest are counters.
            let value = if *name == "io_ioops" {
                Some(values[i])
            } else {
                increase(before[i], values[i])
            };
            if let Some(v) = value {
                out.push(point(name, &tags, V::I(v as i64)));
            }
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn iostat_reports_counter_increases_per_device_and_follows_devices() {
    let mut run = Run::start("iostat", json!({}), &["/proc/diskstats"]).await;
    let first = disk_rows(&read(run.root(), "/proc/diskstats"));
    assert!(first.contains_key("vda"));
    assert_points(run.collect(T1).await, Vec::new());

    run.put(2);
    let second = disk_rows(&read(run.root(), "/proc/diskstats"));
    assert_points(run.collect(T2).await, io_expected(&first, &second));

    // Round 3: vda's reads wrapped, zram0 is gone, sdb is new.
    let text = read(run.root(), "/proc/diskstats");
    let mut lines: Vec<String> = Vec::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        match f[2] {
            "zram0" => {}
            "vda" => {
                let mut f: Vec<String> = f.iter().map(|s| (*s).to_owned()).collect();
                f[3] = "5".to_owned();
                lines.push(f.join(" "));
            }
            _ => lines.push(line.to_owned()),
        }
    }
    lines.push(" 8 16 sdb 1 2 3 4 5 6 7 8 0 9 10 0 0 0 0 0 0".to_owned());
    run.write("/proc/diskstats", &(lines.join("\n") + "\n"));
    let third = disk_rows(&read(run.root(), "/proc/diskstats"));
    let got = run.collect(T3).await;
    assert!(
        !got.iter()
            .any(|p| p.tags["device"] == "sdb" || p.tags["device"] == "zram0")
    );
    assert_points(got, io_expected(&second, &third));
}

/// statvfs of a directory, in whole gigabytes: (total, free).
fn gigabytes(dir: &Path) -> (i64, i64) {
    let path = std::ffi::CString::new(dir.to_str().unwrap()).unwrap();
    let mut s = std::mem::MaybeUninit::<libc::statvfs>::zeroed();
    // SAFETY: a valid C string and writable memory of the right type.
    assert_eq!(unsafe { libc::statvfs(path.as_ptr(), s.as_mut_ptr()) }, 0);
    // SAFETY: statvfs succeeded.
    let s = unsafe { s.assume_init() };
    let unit = if s.f_frsize != 0 {
        s.f_frsize
    } else {
        s.f_bsize
    };
    let gb = |blocks: u64| (blocks * unit / 1_000_000_000) as i64;
    (gb(s.f_blocks), gb(s.f_bfree))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn diskstat_reports_granted_mount_points_through_the_hosts_statvfs() {
    let mut run = Run::start("diskstat", json!({}), &["/"]).await;
    let before = gigabytes(run.root());
    let got = run.collect(T1).await;
    let after = gigabytes(run.root());
    // Free space may change while the test runs: either reading is right.
    let expected = |(total, free): (i64, i64)| {
        let tags = [("type", "node"), ("device", "/"), ("unit", "GBytes")];
        vec![
            point("disk_total", &tags, V::U(total as u64)),
            point("disk_free", &tags, V::U(free as u64)),
            point(
                "part_max_used",
                &[("type", "node"), ("unit", "percent")],
                V::I(100 * (total - free) / total),
            ),
        ]
    };
    assert!(
        before.0 > 0,
        "a file system of at least 1 GB for the fixture"
    );
    if got != expected(before) {
        assert_points(got, expected(after));
    }

    // A mount point that is not granted is refused by the host.
    let runtime = Runtime::new(RuntimeOptions {
        cache_dir: None,
        ..RuntimeOptions::default()
    })
    .unwrap();
    let mut spec = PluginSpec::new(guests::component("diskstat"));
    spec.config = json!({"hostname": "n1", "mount_points": ["/scratch"]});
    spec.capabilities.read_files = vec!["/".to_owned()];
    spec.capabilities.files_root = Some(run.root().to_path_buf());
    let loaded = runtime.load(&spec).await.unwrap();
    let (sink, _rx) = sink::channel(4);
    let mut instance = loaded.instantiate(&runtime, &spec, sink).await.unwrap();
    let Ok(Err(message)) = instance.collect(T1).await else {
        panic!("collect must fail")
    };
    assert!(
        message.contains("statvfs /scratch: /scratch is not granted"),
        "{message}"
    );
}

fn numastat(text: &str) -> Vec<(String, u64)> {
    text.lines()
        .map(|l| {
            let (k, v) = l.split_once(' ').unwrap();
            (k.to_owned(), v.trim().parse().unwrap())
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn numastats_reports_counters_and_rates_per_memory_domain() {
    let path = "/sys/devices/system/node/node0/numastat";
    let mut run = Run::start(
        "numastats",
        json!({}),
        &["/sys/devices/system/node/node*/numastat"],
    )
    .await;
    let tags = [("type", "memoryDomain"), ("type-id", "0")];
    let first = numastat(&read(run.root(), path));
    let absolute = |rows: &[(String, u64)]| -> Vec<Got> {
        rows.iter()
            .map(|(k, v)| point(&format!("numastats_{k}"), &tags, V::I(*v as i64)))
            .collect()
    };
    assert_points(run.collect(T1).await, absolute(&first));

    run.put(2);
    let second = numastat(&read(run.root(), path));
    let mut expected = absolute(&second);
    for ((key, new), (_, old)) in second.iter().zip(&first) {
        expected.push(point(
            &format!("numastats_{key}_rate"),
            &tags,
            V::F((new - old) as f64 / 5.0),
        ));
    }
    assert_points(run.collect(T2).await, expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cpufreq_reports_each_hwthread_with_a_policy_in_hz() {
    let mut run = Run::start(
        "cpufreq",
        json!({}),
        &[
            "/sys/devices/system/cpu/cpu*/cpufreq/scaling_cur_freq",
            "/sys/devices/system/cpu/cpu*/topology/physical_package_id",
        ],
    )
    .await;
    for (n, now) in [(1, T1), (2, T2)] {
        run.put(n);
        let mut expected = Vec::new();
        for cpu in ["0", "1"] {
            let base = format!("/sys/devices/system/cpu/cpu{cpu}");
            let khz: i64 = read(run.root(), &format!("{base}/cpufreq/scaling_cur_freq"))
                .trim()
                .parse()
                .unwrap();
            let package = read(run.root(), &format!("{base}/topology/physical_package_id"));
            let tags = [
                ("type", "hwthread"),
                ("type-id", cpu),
                ("package_id", package.trim()),
                ("unit", "Hz"),
            ];
            expected.push(point("cpufreq", &tags, V::I(khz * 1000)));
        }
        assert_points(run.collect(now).await, expected);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tempstat_names_hwmon_sensors_as_cc_metric_collector_does() {
    let mut run = Run::start(
        "tempstat",
        json!({
            "report_max_temperature": true,
            "report_critical_temperature": true,
            "tag_override": {"hwmon1": {"type": "socket", "type-id": "0"}}
        }),
        &["/sys/class/hwmon/**"],
    )
    .await;
    for (n, now) in [(1, T1), (2, T2)] {
        run.put(n);
        let degrees = |path: &str| -> i64 {
            let milli: i64 = read(run.root(), &format!("/sys/class/hwmon/{path}"))
                .trim()
                .parse()
                .unwrap();
            milli / 1000
        };
        let node = [("type", "node"), ("unit", "degC")];
        let socket = [("type", "socket"), ("type-id", "0"), ("unit", "degC")];
        let mut expected = Vec::new();
        for (sensor, name) in [
            ("temp1", "temp_package_id_0"),
            ("temp2", "temp_core_0"),
            ("temp3", "temp_core_1"),
        ] {
            let max = name.replacen("temp", "max_temp", 1);
            let crit = name.replacen("temp", "crit_temp", 1);
            expected.push(point(
                name,
                &node,
                V::I(degrees(&format!("hwmon0/{sensor}_input"))),
            ));
            expected.push(point(
                &max,
                &node,
                V::I(degrees(&format!("hwmon0/{sensor}_max"))),
            ));
            expected.push(point(
                &crit,
                &node,
                V::I(degrees(&format!("hwmon0/{sensor}_crit"))),
            ));
        }
        expected.push(point(
            "temp_nvme_composite",
            &socket,
            V::I(degrees("hwmon1/temp1_input")),
        ));
        expected.push(point(
            "max_temp_nvme_composite",
            &socket,
            V::I(degrees("hwmon1/temp1_max")),
        ));
        expected.push(point(
            "crit_temp_nvme_composite",
            &socket,
            V::I(degrees("hwmon1/temp1_crit")),
        ));
        // No label and a critical limit of 0: the name alone, no limit reported.
        expected.push(point(
            "temp_acpitz",
            &node,
            V::I(degrees("hwmon2/temp1_input")),
        ));
        assert_points(run.collect(now).await, expected);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_configuration_key_is_refused_at_init() {
    let runtime = Runtime::new(RuntimeOptions {
        cache_dir: None,
        ..RuntimeOptions::default()
    })
    .unwrap();
    let mut spec = PluginSpec::new(guests::component("netstat"));
    spec.config = json!({"hostname": "n1", "include_device": ["eth0"]});
    let loaded = runtime.load(&spec).await.unwrap();
    let (sink, _rx) = sink::channel(4);
    let Err(failure) = loaded.instantiate(&runtime, &spec, sink).await else {
        panic!("init must fail")
    };
    let text = failure.to_string();
    assert!(
        text.contains("netstat: unknown configuration key `include_device`"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_component_built_against_wit_0_2_0_still_instantiates_and_reads_files() {
    // The loadavg plugin as built before `files.statvfs` was added (cc:fleet@0.2.0).
    let old = fixtures().join("loadavg-wit-0.2.0.wasm");
    let bytes = std::fs::read(&old).unwrap();
    let needle = b"cc:fleet/files@0.2.0";
    assert!(bytes.windows(needle.len()).any(|w| w == needle));
    let root = tempfile::tempdir().unwrap();
    copy_tree(&round(1), root.path());
    let runtime = Runtime::new(RuntimeOptions {
        cache_dir: None,
        ..RuntimeOptions::default()
    })
    .unwrap();
    let mut spec = PluginSpec::new(old);
    spec.config = json!({"hostname": "n1"});
    spec.capabilities.read_files = vec!["/proc/loadavg".to_owned()];
    spec.capabilities.files_root = Some(root.path().to_path_buf());
    let loaded = runtime.load(&spec).await.expect("an old component loads");
    let (sink, mut rx) = sink::channel(4);
    let mut instance = loaded.instantiate(&runtime, &spec, sink).await.unwrap();
    assert_eq!(instance.collect(T1).await, Ok(Ok(())));
    let batch = rx.try_recv().expect("it emitted");
    let text = String::from_utf8(batch.lines.to_vec()).unwrap();
    let load_one = read(root.path(), "/proc/loadavg")
        .split_whitespace()
        .next()
        .unwrap()
        .parse::<f64>()
        .unwrap();
    assert!(
        text.starts_with(&format!("load_one,hostname=n1,type=node value={load_one} ")),
        "{text}"
    );
}

// ---- The HPC collectors (fixtures/hpc): NFS, scheduler, InfiniBand, RAPL, Slurm cgroups,
// ---- and diskstat over the mount table.

/// The counters of `/proc/net/rpc/nfs`'s `procN` line.
fn rpc_line(text: &str, label: &str) -> Vec<u64> {
    let line = text.lines().find(|l| l.starts_with(label)).unwrap();
    line.split_whitespace()
        .skip(2)
        .map(|n| n.parse().unwrap())
        .collect()
}

/// What `nfsstat -l` lists and cc-metric-collector turns into `<prefix>_<op>` deltas:
/// operations non-zero in both rounds, and the total when both sums are.
fn nfs_expected(prefix: &str, names: &[&str], old: &[u64], new: &[u64]) -> Vec<Got> {
    let tags = [("type", "node")];
    let increase = |a: u64, b: u64| {
        if b >= a { b - a } else { (1u64 << 32) - a + b }
    };
    let mut out = Vec::new();
    let mut total = 0;
    for (i, name) in names.iter().enumerate() {
        let (a, b) = (old[i], new[i]);
        total += increase(a, b);
        if a != 0 && b != 0 {
            out.push(point(
                &format!("{prefix}_{name}"),
                &tags,
                V::I(increase(a, b) as i64),
            ));
        }
    }
    if old[..names.len()].iter().sum::<u64>() != 0 && new[..names.len()].iter().sum::<u64>() != 0 {
        out.push(point(&format!("{prefix}_total"), &tags, V::I(total as i64)));
    }
    out
}

const NFS3: [&str; 22] = [
    "null",
    "getattr",
    "setattr",
    "lookup",
    "access",
    "readlink",
    "read",
    "write",
    "create",
    "mkdir",
    "symlink",
    "mknod",
    "remove",
    "rmdir",
    "rename",
    "link",
    "readdir",
    "readdirplus",
    "fsstat",
    "fsinfo",
    "pathconf",
    "commit",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nfs3stat_sends_nfsstats_counter_increases_across_wraps_and_bad_files() {
    let mut run = Run::hpc("nfs3stat", json!({}), &["/proc/net/rpc/nfs"]).await;
    let first = rpc_line(&read(run.root(), "/proc/net/rpc/nfs"), "proc3");
    assert_points(run.collect(T1).await, Vec::new());

    run.put_hpc(2);
    let second = rpc_line(&read(run.root(), "/proc/net/rpc/nfs"), "proc3");
    let got = run.collect(T2).await;
    assert!(
        !got.iter().any(|p| p.name == "nfs3_readlink"),
        "0 in round 1"
    );
    assert_points(got, nfs_expected("nfs3", &NFS3, &first, &second));

    // Round 3: getattr runs up to just below 2^32; round 4: it wraps to 7.
    let round2 = read(run.root(), "/proc/net/rpc/nfs");
    let with_proc3 = |counters: &[u64]| {
        round2.replace(
            &format!("proc3 22 {}", join(&second)),
            &format!("proc3 22 {}", join(counters)),
        )
    };
    let mut second_near_wrap = second.clone();
    second_near_wrap[1] = u64::from(u32::MAX) - 2;
    let mut third = second.clone();
    third[1] = 7;
    let text = with_proc3(&third);
    run.write("/proc/net/rpc/nfs", &with_proc3(&second_near_wrap));
    assert_points(
        run.collect(T3).await,
        nfs_expected("nfs3", &NFS3, &second, &second_near_wrap),
    );
    run.write("/proc/net/rpc/nfs", &text);
    let got = run.collect(T3 + 5_000_000_000).await;
    assert!(got.contains(&point("nfs3_getattr", &[("type", "node")], V::I(10))));
    assert_points(got, nfs_expected("nfs3", &NFS3, &second_near_wrap, &third));

    // A file cut short fails the round, naming the problem; the next round counts from the
    // last good one.
    run.write("/proc/net/rpc/nfs", "net 0 0 0 0\nproc3 22 1 2 3\n");
    let message = run.collect_fails(T3 + 10_000_000_000).await;
    assert!(
        message.contains("proc3 announces 22 counters but has 3"),
        "{message}"
    );
    let mut fourth = third.clone();
    fourth[6] += 100;
    run.write("/proc/net/rpc/nfs", &with_proc3(&fourth));
    assert_points(
        run.collect(T3 + 15_000_000_000).await,
        nfs_expected("nfs3", &NFS3, &third, &fourth),
    );
}

fn join(numbers: &[u64]) -> String {
    numbers
        .iter()
        .map(u64::to_string)
        .collect::<Vec<_>>()
        .join(" ")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nfs4stat_uses_nfs_utils_names_and_hides_operations_nfsstat_does_not_list() {
    // nfs-utils' NFSv4 client operation names, in the kernel's order.
    const NFS4: [&str; 69] = [
        "null",
        "read",
        "write",
        "commit",
        "open",
        "open_conf",
        "open_noat",
        "open_dgrd",
        "close",
        "setattr",
        "fsinfo",
        "renew",
        "setclntid",
        "confirm",
        "lock",
        "lockt",
        "locku",
        "access",
        "getattr",
        "lookup",
        "lookup_root",
        "remove",
        "rename",
        "link",
        "symlink",
        "create",
        "pathconf",
        "statfs",
        "readlink",
        "readdir",
        "server_caps",
        "delegreturn",
        "getacl",
        "setacl",
        "fs_locations",
        "rel_lkowner",
        "secinfo",
        "fsid_present",
        "exchange_id",
        "create_session",
        "destroy_session",
        "sequence",
        "get_lease_time",
        "reclaim_comp",
        "layoutget",
        "getdevinfo",
        "layoutcommit",
        "layoutreturn",
        "secinfo_no",
        "test_stateid",
        "free_stateid",
        "getdevicelist",
        "bind_conn_to_ses",
        "destroy_clientid",
        "seek",
        "allocate",
        "deallocate",
        "layoutstats",
        "clone",
        "copy",
        "offload_cancel",
        "lookupp",
        "layouterror",
        "copy_notify",
        "getxattr",
        "setxattr",
        "listxattrs",
        "removexattr",
        "read_plus",
    ];
    let mut run = Run::hpc(
        "nfs4stat",
        json!({"nfsstat": "/usr/sbin/nfsstat", "exclude_metrics": ["nfs4_null"]}),
        &["/proc/net/rpc/nfs"],
    )
    .await;
    let first = rpc_line(&read(run.root(), "/proc/net/rpc/nfs"), "proc4");
    assert_points(run.collect(T1).await, Vec::new());
    run.put_hpc(2);
    let second = rpc_line(&read(run.root(), "/proc/net/rpc/nfs"), "proc4");
    let got = run.collect(T2).await;
    let mut expected = nfs_expected("nfs4", &NFS4, &first, &second);
    expected.retain(|p| p.name != "nfs4_null");
    assert!(expected.iter().any(|p| p.name == "nfs4_bind_conn_to_ses"));
    assert!(!got.iter().any(|p| p.name == "nfs4_commit"), "0 in round 1");
    assert_points(got, expected);

    // A client that never mounted NFSv4 has no proc4 line: nothing, no error.
    run.write("/proc/net/rpc/nfs", "net 0 0 0 0\nrpc 0 0 0\n");
    assert_points(run.collect(T3).await, Vec::new());
}

/// `mount point -> bytes counters` of the NFS mounts of a mountstats text.
fn mountstats(text: &str) -> BTreeMap<String, Vec<u64>> {
    let mut out = BTreeMap::new();
    let mut current = None;
    for line in text.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        if words.first() == Some(&"device") {
            current = (words.len() > 7 && words[7].starts_with("nfs")).then(|| words[4].to_owned());
        } else if words.first() == Some(&"bytes:")
            && let Some(mount) = current.take()
        {
            out.insert(
                mount,
                words[1..].iter().map(|n| n.parse().unwrap()).collect(),
            );
        }
    }
    out
}

fn nfsio_expected(
    old: &BTreeMap<String, Vec<u64>>,
    new: &BTreeMap<String, Vec<u64>>,
    seconds: f64,
) -> Vec<Got> {
    const NAMES: [&str; 8] = [
        "nread",
        "nwrite",
        "dread",
        "dwrite",
        "nfsread",
        "nfswrite",
        "pageread",
        "pagewrite",
    ];
    let mut out = Vec::new();
    for (mount, values) in new {
        let Some(before) = old.get(mount) else {
            continue;
        };
        let tags = [
            ("type", "node"),
            ("stype", "filesystem"),
            ("stype-id", mount.as_str()),
        ];
        for (i, name) in NAMES.iter().enumerate() {
            if *name == "pagewrite" {
                continue; // excluded in the configuration
            }
            let mut with_unit = tags.to_vec();
            with_unit.push(("unit", "bytes"));
            out.push(point(
                &format!("nfsio_{name}"),
                &with_unit,
                V::I(values[i] as i64),
            ));
            let rate_unit = if name.starts_with("page") {
                "4K_pages/s"
            } else {
                "bytes/sec"
            };
            let mut rate_tags = tags.to_vec();
            rate_tags.push(("unit", rate_unit));
            out.push(point(
                &format!("nfsio_{name}_bw"),
                &rate_tags,
                V::F((values[i] - before[i]) as f64 / seconds),
            ));
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nfsiostat_reads_mountstats_through_the_mount_info_grant_and_follows_mounts() {
    let config = json!({"send_derived_values": true, "exclude_metrics": ["pagewrite"]});
    let mut run = Run::hpc("nfsiostat", config, &[]).await;
    let first = mountstats(&read(run.root(), "/proc/self/mountstats"));
    assert_eq!(first.len(), 2, "/home and /apps");
    assert_points(run.collect(T1).await, Vec::new());

    run.put_hpc(2);
    let second = mountstats(&read(run.root(), "/proc/self/mountstats"));
    assert_points(run.collect(T2).await, nfsio_expected(&first, &second, 5.0));

    // Round 3: /apps is unmounted, /scratch2 appears (remembered, reported from round 4).
    let text = read(run.root(), "/proc/self/mountstats");
    let apps = text.find("device nfs02:/apps").unwrap();
    let mut third_text = text[..apps].to_owned();
    third_text.push_str(
        "device nfs03:/s2 mounted on /scratch2 with fstype nfs4 statvers=1.1\n\
         \tbytes:\t10 20 0 0 10 20 1 1\n",
    );
    run.write("/proc/self/mountstats", &third_text);
    let third = mountstats(&third_text);
    let got = run.collect(T3).await;
    assert!(
        !got.iter()
            .any(|p| p.tags.get("stype-id").is_some_and(|m| m != "/home"))
    );
    assert_points(got, nfsio_expected(&second, &third, 10.0));

    // A bytes line cut short fails the round; the next round goes on from round 3.
    run.write(
        "/proc/self/mountstats",
        &third_text.replace("\tbytes:\t10 20 0 0 10 20 1 1", "\tbytes:\t10 20"),
    );
    let message = run.collect_fails(T3 + 5_000_000_000).await;
    assert!(
        message.contains("the bytes line of /scratch2 has 2 counters"),
        "{message}"
    );
    let fourth_text = third_text.replace(
        "\tbytes:\t10 20 0 0 10 20 1 1",
        "\tbytes:\t30 20 0 0 10 20 1 1",
    );
    run.write("/proc/self/mountstats", &fourth_text);
    assert_points(
        run.collect(T3 + 10_000_000_000).await,
        nfsio_expected(&third, &mountstats(&fourth_text), 10.0),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_mount_info_grant_mountstats_is_refused_as_a_per_process_file() {
    let mut run = Run::start_over(&hpc_round(1), "nfsiostat", json!({}), &[], false).await;
    let message = run.collect_fails(T1).await;
    assert!(message.contains("/proc/self/mountstats"), "{message}");
    assert!(
        message.contains("per-process entries of /proc are never readable"),
        "{message}"
    );
}

/// `cpu -> (running, waiting)` of /proc/schedstat.
fn schedstat(text: &str) -> BTreeMap<String, (u64, u64)> {
    text.lines()
        .filter(|l| l.starts_with("cpu"))
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (
                f[0].trim_start_matches("cpu").to_owned(),
                (f[7].parse().unwrap(), f[8].parse().unwrap()),
            )
        })
        .collect()
}

fn load_expected(
    old: &BTreeMap<String, (u64, u64)>,
    new: &BTreeMap<String, (u64, u64)>,
    seconds: f64,
) -> Vec<Got> {
    new.iter()
        .filter_map(|(cpu, (run, wait))| {
            let (r0, w0) = old.get(cpu)?;
            let load = (run - r0) as f64 / seconds / 1e9 + (wait - w0) as f64 / seconds / 1e9;
            Some(point(
                "cpu_load_core",
                &[("type", "hwthread"), ("type-id", cpu)],
                V::F(load),
            ))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schedstat_reports_run_and_wait_time_per_hwthread_as_cpu_load_core() {
    let mut run = Run::hpc("schedstat", json!({}), &["/proc/schedstat"]).await;
    let first = schedstat(&read(run.root(), "/proc/schedstat"));
    assert_points(run.collect(T1).await, Vec::new());
    run.put_hpc(2);
    let second = schedstat(&read(run.root(), "/proc/schedstat"));
    let got = run.collect(T2).await;
    assert!(
        got.iter().any(|p| p.value == V::F(0.0)),
        "an idle hwthread reads 0"
    );
    assert_points(got, load_expected(&first, &second, 5.0));

    // Round 3: cpu3 goes offline, cpu4 comes online (baseline only).
    let text = read(run.root(), "/proc/schedstat");
    let mut lines: Vec<String> = text
        .lines()
        .filter(|l| !l.starts_with("cpu3"))
        .map(|l| {
            l.replace(
                "cpu0 0 0 0 0 0 0 816845678901",
                "cpu0 0 0 0 0 0 0 826845678901",
            )
        })
        .collect();
    lines.push("cpu4 0 0 0 0 0 0 5 6 7".to_owned());
    let third_text = lines.join("\n") + "\n";
    run.write("/proc/schedstat", &third_text);
    let third = schedstat(&third_text);
    assert_points(run.collect(T3).await, load_expected(&second, &third, 10.0));

    // A truncated cpu line fails the round; the next round goes on from round 3.
    run.write("/proc/schedstat", "version 15\ncpu0 0 0 0 0\n");
    let message = run.collect_fails(T3 + 5_000_000_000).await;
    assert!(message.contains("cpu0 has 4 numbers"), "{message}");
    run.write("/proc/schedstat", &third_text);
    assert_points(
        run.collect(T3 + 10_000_000_000).await,
        load_expected(&third, &third, 10.0),
    );
}

/// `(device, port) -> (lid, [rcv_data, xmit_data, rcv_pkts, xmit_pkts])` of the fixture.
fn ib_ports(root: &Path) -> BTreeMap<(String, String), (String, [u64; 4])> {
    let mut out = BTreeMap::new();
    let base = root.join("sys/class/infiniband");
    for device in std::fs::read_dir(&base).unwrap() {
        let device = device.unwrap().file_name().into_string().unwrap();
        for port in std::fs::read_dir(base.join(&device).join("ports")).unwrap() {
            let port = port.unwrap().file_name().into_string().unwrap();
            let dir = base.join(&device).join("ports").join(&port);
            let lid = std::fs::read_to_string(dir.join("lid"))
                .unwrap()
                .trim()
                .to_owned();
            let counter = |name: &str| -> u64 {
                std::fs::read_to_string(dir.join("counters").join(name))
                    .unwrap()
                    .trim()
                    .parse()
                    .unwrap()
            };
            let counters = [
                counter("port_rcv_data"),
                counter("port_xmit_data"),
                counter("port_rcv_packets"),
                counter("port_xmit_packets"),
            ];
            out.insert((device.clone(), port), (lid, counters));
        }
    }
    out
}

type IbPorts = BTreeMap<(String, String), (String, [u64; 4])>;

fn ib_expected(old: Option<&IbPorts>, new: &IbPorts, seconds: f64) -> Vec<Got> {
    const NAMES: [(&str, u64, &str); 4] = [
        ("ib_recv", 4, "bytes"),
        ("ib_xmit", 4, "bytes"),
        ("ib_recv_pkts", 1, "packets"),
        ("ib_xmit_pkts", 1, "packets"),
    ];
    let mut out = Vec::new();
    for ((device, port), (lid, counters)) in new {
        if lid == "0x0" || device == "hfi1_0" {
            continue; // not connected; excluded in the configuration
        }
        let tags = |unit: &'static str| {
            vec![
                ("type", "node"),
                ("device", device.as_str()),
                ("port", port.as_str()),
                ("lid", lid.as_str()),
                ("unit", unit),
            ]
        };
        let before = old.and_then(|o| o.get(&(device.clone(), port.clone())));
        let mut totals = [0u64; 2];
        let mut rates = [0f64; 2];
        for (i, (name, scale, unit)) in NAMES.iter().enumerate() {
            let value = counters[i].wrapping_mul(*scale);
            out.push(point(name, &tags(unit), V::U(value)));
            totals[i / 2] = totals[i / 2].wrapping_add(value);
            if let Some((_, b)) = before {
                let rate = counters[i].wrapping_sub(b[i]) as f64 / seconds * *scale as f64;
                rates[i / 2] += rate;
                let rate_unit = if *scale == 4 {
                    "bytes/sec"
                } else {
                    "packets/sec"
                };
                out.push(point(&format!("{name}_bw"), &tags(rate_unit), V::F(rate)));
            }
        }
        out.push(point("ib_total", &tags("bytes"), V::U(totals[0])));
        out.push(point("ib_total_pkts", &tags("packets"), V::U(totals[1])));
        if before.is_some() {
            out.push(point("ib_total_bw", &tags("bytes/sec"), V::F(rates[0])));
            out.push(point(
                "ib_total_pkts_bw",
                &tags("packets/sec"),
                V::F(rates[1]),
            ));
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ibstat_reports_connected_ports_with_rates_and_totals_across_wraps_and_changes() {
    let config = json!({
        "exclude_devices": ["hfi1_0"],
        "send_derived_values": true,
        "send_total_values": true
    });
    let mut run = Run::hpc("ibstat", config, &["/sys/class/infiniband/**"]).await;
    let first = ib_ports(run.root());
    assert_points(run.collect(T1).await, ib_expected(None, &first, 5.0));

    run.put_hpc(2);
    let second = ib_ports(run.root());
    assert_points(
        run.collect(T2).await,
        ib_expected(Some(&first), &second, 5.0),
    );

    // Round 3: mlx5_0's received data wraps at 2^64, a new mlx5_2 port 1 appears.
    let rcv = "/sys/class/infiniband/mlx5_0/ports/1/counters/port_rcv_data";
    run.write(rcv, &format!("{}\n", u64::MAX - 9));
    let near_wrap = ib_ports(run.root());
    assert_points(
        run.collect(T3).await,
        ib_expected(Some(&second), &near_wrap, 10.0),
    );
    run.write(rcv, "30\n");
    let base = "/sys/class/infiniband/mlx5_2/ports/1";
    run.write(&format!("{base}/lid"), "0x7\n");
    for (name, v) in [
        ("port_rcv_data", 1),
        ("port_xmit_data", 2),
        ("port_rcv_packets", 3),
        ("port_xmit_packets", 4),
    ] {
        run.write(&format!("{base}/counters/{name}"), &format!("{v}\n"));
    }
    let third = ib_ports(run.root());
    let got = run.collect(T3 + 5_000_000_000).await;
    assert!(got.contains(&point(
        "ib_recv_bw",
        &[
            ("type", "node"),
            ("device", "mlx5_0"),
            ("port", "1"),
            ("lid", "0x2a"),
            ("unit", "bytes/sec")
        ],
        V::F(40.0 * 4.0 / 5.0),
    )));
    assert_points(got, ib_expected(Some(&near_wrap), &third, 5.0));

    // A counter that is not a number fails the round; then mlx5_2 disappears and the next
    // round reports mlx5_0 against round 3.
    run.write(&format!("{base}/counters/port_xmit_data"), "garbage\n");
    let message = run.collect_fails(T3 + 10_000_000_000).await;
    assert!(
        message.contains("port_xmit_data: the counter is not a number"),
        "{message}"
    );
    run.remove("/sys/class/infiniband/mlx5_2");
    let fourth = ib_ports(run.root());
    let mut previous = third.clone();
    previous.remove(&("mlx5_2".to_owned(), "1".to_owned()));
    assert_points(
        run.collect(T3 + 15_000_000_000).await,
        ib_expected(Some(&previous), &fourth, 10.0),
    );
}

/// `id -> (zone name, sub-zone name, energy, range)` of the RAPL fixture.
fn rapl_zones(root: &Path) -> BTreeMap<String, (String, Option<String>, u64, u64)> {
    let base = root.join("sys/devices/virtual/powercap/intel-rapl");
    let zone = |dir: &Path| -> (String, u64, u64) {
        let text = |f: &str| {
            std::fs::read_to_string(dir.join(f))
                .unwrap()
                .trim()
                .to_owned()
        };
        (
            text("name"),
            text("energy_uj").parse().unwrap(),
            text("max_energy_range_uj").parse().unwrap(),
        )
    };
    let mut out = BTreeMap::new();
    for entry in std::fs::read_dir(&base).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        let Some(id) = name.strip_prefix("intel-rapl:") else {
            continue;
        };
        let (zone_name, energy, range) = zone(&base.join(&name));
        out.insert(id.to_owned(), (zone_name.clone(), None, energy, range));
        for sub in std::fs::read_dir(base.join(&name)).unwrap() {
            let sub = sub.unwrap().file_name().into_string().unwrap();
            if let Some(sub_id) = sub.strip_prefix(&format!("{name}:")) {
                let (sub_name, energy, range) = zone(&base.join(&name).join(&sub));
                out.insert(
                    format!("{id}:{sub_id}"),
                    (zone_name.clone(), Some(sub_name), energy, range),
                );
            }
        }
    }
    out
}

type RaplZones = BTreeMap<String, (String, Option<String>, u64, u64)>;

fn rapl_expected(old: &RaplZones, new: &RaplZones, seconds: f64) -> Vec<Got> {
    let mut out = Vec::new();
    for (id, (zone, sub, energy, range)) in new {
        // Excluded in the configuration: zone 0:1 by id, psys by name.
        if id == "0:1" || zone == "psys" {
            continue;
        }
        let Some((_, _, before, _)) = old.get(id) else {
            continue;
        };
        let used = if energy >= before {
            energy - before
        } else {
            range - before + energy
        };
        let mut tags = vec![("id", id.as_str()), ("zone_name", zone.as_str())];
        if let Some(sub) = sub {
            tags.push(("sub_zone_name", sub.as_str()));
        }
        tags.push(("unit", "Watt"));
        // cc-metric-collector: µJ over µs.
        out.push(point(
            "rapl_average_power",
            &tags,
            V::F(used as f64 / (seconds * 1e6)),
        ));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rapl_reports_average_power_per_zone_and_sub_zone_across_a_counter_wrap() {
    let config = json!({"exclude_device_by_id": ["0:1"], "exclude_device_by_name": ["psys"]});
    let grants = ["/sys/devices/virtual/powercap/intel-rapl/**"];
    let mut run = Run::hpc("rapl", config, &grants).await;
    let first = rapl_zones(run.root());
    assert_points(run.collect(T1).await, Vec::new());
    run.put_hpc(2);
    let second = rapl_zones(run.root());
    let got = run.collect(T2).await;
    // package-1 wrapped: 2 J before the range's end, 1 J after.
    assert!(
        got.iter()
            .any(|p| p.tags["id"] == "1" && p.value == V::F(0.6))
    );
    assert_points(got, rapl_expected(&first, &second, 5.0));

    // An energy counter that is not a number fails the round; the zone of package-0 then
    // disappears and the next round reports the others against round 2.
    let energy = "/sys/devices/virtual/powercap/intel-rapl/intel-rapl:1/energy_uj";
    run.write(energy, "12ab\n");
    let message = run.collect_fails(T3).await;
    assert!(message.contains("energy_uj is not a number"), "{message}");
    run.write(energy, "1500000\n");
    run.remove("/sys/devices/virtual/powercap/intel-rapl/intel-rapl:0");
    let third = rapl_zones(run.root());
    assert_points(
        run.collect(T3 + 5_000_000_000).await,
        rapl_expected(&second, &third, 15.0),
    );
}

/// What cc-metric-collector's slurm_cgroup sends for the jobs (`cpus`, five figures) and
/// the online hwthreads.
fn slurm_expected(
    jobs: &[(Vec<u32>, [f64; 5])],
    online: std::ops::RangeInclusive<u32>,
) -> Vec<Got> {
    const NAMES: [(&str, &str); 5] = [
        ("job_mem_used", "Bytes"),
        ("job_max_mem_used", "Bytes"),
        ("job_mem_limit", "Bytes"),
        ("job_user_cpu", "%"),
        ("job_sys_cpu", "%"),
    ];
    let mut out = Vec::new();
    let mut used = Vec::new();
    for (cpus, figures) in jobs {
        for cpu in cpus {
            let id = cpu.to_string();
            for ((name, unit), value) in NAMES.iter().zip(figures) {
                out.push(point(
                    name,
                    &[("type", "hwthread"), ("type-id", &id), ("unit", unit)],
                    V::F(value / cpus.len() as f64),
                ));
            }
            used.push(*cpu);
        }
    }
    for cpu in online.filter(|c| !used.contains(c)) {
        let id = cpu.to_string();
        for (name, unit) in NAMES {
            out.push(point(
                name,
                &[("type", "hwthread"), ("type-id", &id), ("unit", unit)],
                V::I(0),
            ));
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slurm_cgroup_spreads_each_jobs_figures_over_its_hwthreads_for_cgroup_v2_and_v1() {
    let grants = [
        "/sys/devices/system/cpu/online",
        "/sys/fs/cgroup/cgroup.controllers",
        "/sys/fs/cgroup/system.slice/slurmstepd.scope/**",
        "/sys/fs/cgroup/memory/slurm/**",
        "/sys/fs/cgroup/cpuacct/slurm/**",
        "/sys/fs/cgroup/cpuset/slurm/**",
    ];
    let mut run = Run::hpc("slurm_cgroup", json!({}), &grants).await;
    // job_4711 on 0,1,4: 3 GiB used, 4 GiB peak, 8 GiB limit, 1000 of 1200 s user, 200
    // system; the SLUID job on 6: no limit (`max`).
    let job = |used: f64, user: f64, system: f64| -> [f64; 5] {
        let total = user + system;
        [
            used,
            4294967296.0,
            8589934592.0,
            user * 100.0 / total,
            system * 100.0 / total,
        ]
    };
    let sluid = (vec![6], [1073741824.0, 1610612736.0, 0.0, 80.0, 20.0]);
    assert_points(
        run.collect(T1).await,
        slurm_expected(
            &[
                (vec![0, 1, 4], job(3221225472.0, 1000.0, 200.0)),
                sluid.clone(),
            ],
            0..=7,
        ),
    );
    run.put_hpc(2);
    assert_points(
        run.collect(T2).await,
        slurm_expected(
            &[
                (vec![0, 1, 4], job(3321225472.0, 1050.0, 210.0)),
                sluid.clone(),
            ],
            0..=7,
        ),
    );

    // The SLUID job ends; a malformed cpuset fails the round, naming the file.
    let scope = "/sys/fs/cgroup/system.slice/slurmstepd.scope";
    run.remove(&format!("{scope}/sBTD4R7ZK5W3Q9"));
    run.write(&format!("{scope}/job_4711/cpuset.cpus"), "0-\n");
    let message = run.collect_fails(T3).await;
    assert!(message.contains("job_4711/cpuset.cpus"), "{message}");
    run.write(&format!("{scope}/job_4711/cpuset.cpus"), "0-1,4\n");
    assert_points(
        run.collect(T3).await,
        slurm_expected(&[(vec![0, 1, 4], job(3321225472.0, 1050.0, 210.0))], 0..=7),
    );

    // cgroup v1 (no cgroup.controllers): job_77 of uid 1000 on hwthreads 2 and 3.
    run.remove("/sys/fs/cgroup/cgroup.controllers");
    let v1 = (
        vec![2, 3],
        [2147483648.0, 3221225472.0, 4294967296.0, 90.0, 10.0],
    );
    assert_points(run.collect(T3).await, slurm_expected(&[v1], 0..=7));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slurm_cgroup_refuses_use_sudo_and_an_unknown_cgroup_version() {
    for (config, why) in [
        (json!({"use_sudo": true}), "`use_sudo` is not supported"),
        (json!({"cgroup_version": "v3"}), "`cgroup_version` must be"),
    ] {
        let runtime = Runtime::new(RuntimeOptions {
            cache_dir: None,
            ..RuntimeOptions::default()
        })
        .unwrap();
        let mut spec = PluginSpec::new(guests::component("slurm_cgroup"));
        spec.config = config;
        spec.capabilities.read_files = vec!["/proc/sys/kernel/hostname".to_owned()];
        spec.capabilities.files_root = Some(hpc_round(1));
        let loaded = runtime.load(&spec).await.unwrap();
        let (sink, _rx) = sink::channel(4);
        let Err(error) = loaded.instantiate(&runtime, &spec, sink).await else {
            panic!("init must fail")
        };
        assert!(error.to_string().contains(why), "{error}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn diskstat_finds_block_devices_in_the_mount_table_and_tags_them_by_device() {
    let mut run = Run::hpc("diskstat", json!({"exclude_mounts": ["disk"]}), &[]).await;
    let before = gigabytes(run.root());
    let got = run.collect(T1).await;
    let after = gigabytes(run.root());
    // Every mount point of the fixture lies on the test's temporary file system. Reported:
    // /dev/vda1 on / and /dev/vdb on /scratch; not proc or sysfs (no /dev device), the loop
    // device, /boot/efi, /data/my disk (excluded), /dev/vdd on /gone (statfs fails), NFS.
    let expected = |(total, free): (i64, i64)| {
        let mut out = Vec::new();
        for device in ["/dev/vda1", "/dev/vdb"] {
            let tags = [("type", "node"), ("device", device), ("unit", "GBytes")];
            out.push(point("disk_total", &tags, V::U(total as u64)));
            out.push(point("disk_free", &tags, V::U(free as u64)));
        }
        out.push(point(
            "part_max_used",
            &[("type", "node"), ("unit", "percent")],
            V::I(100 * (total - free) / total),
        ));
        out
    };
    if got != expected(before) {
        assert_points(got, expected(after));
    }

    // A mount table cut short fails the round, naming the line; the next round recovers.
    run.write(
        "/proc/self/mounts",
        "/dev/vda1 / ext4 rw 0 0\n/dev/vdb /scratch\n",
    );
    let message = run.collect_fails(T2).await;
    assert!(
        message.contains("line 2 has 2 fields, expected 6"),
        "{message}"
    );
    run.write("/proc/self/mounts", "/dev/vdb /scratch xfs rw 0 0\n");
    let got = run.collect(T3).await;
    assert_eq!(got.len(), 3, "{got:?}");
    assert!(
        got.iter()
            .all(|p| p.name == "part_max_used" || p.tags["device"] == "/dev/vdb")
    );

    // statvfs is granted only for mount points of the table: a directory that is not one
    // is refused like any path that is not granted.
    run.write("/proc/self/mounts", "/dev/vdb /data xfs rw 0 0\n");
    let got = run.collect(T3).await;
    assert_eq!(
        got.len(),
        1,
        "only part_max_used (0): /data is not in mountinfo: {got:?}"
    );
    assert_eq!(got[0].value, V::I(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_mount_info_grant_serves_three_files_and_nothing_else_of_the_agents_process() {
    use ccfleet_host::PluginEvent;
    use ccfleet_host::events::EventKind;

    let runtime = Runtime::new(RuntimeOptions {
        cache_dir: None,
        ..RuntimeOptions::default()
    })
    .unwrap();
    let mut events = runtime.subscribe();
    let pid = std::process::id();
    let allowed = [
        "/proc/self/mounts",
        "/proc/self/mountinfo",
        "/proc/self/mountstats",
    ];
    let refused = [
        "/proc/self/environ".to_owned(),
        "/proc/self/mem".to_owned(),
        "/proc/self//mounts".to_owned(),
        "/proc/self/mounts/".to_owned(),
        "/proc/self/./mounts".to_owned(),
        "/proc/thread-self/mounts".to_owned(),
        format!("/proc/{pid}/mounts"),
        format!("/proc/{pid}/mountstats"),
        "/proc/self/task/1/mounts".to_owned(),
        "/proc/mounts".to_owned(),
    ];
    let mut spec = PluginSpec::new(guests::component("hostile-proc-probe"));
    spec.config = json!({
        "files": allowed.iter().map(|s| s.to_string()).chain(refused.iter().cloned()).collect::<Vec<_>>(),
        "dirs": ["/proc/self", "/proc"]
    });
    spec.capabilities.wasi = true;
    spec.capabilities.mount_info = true;
    let loaded = runtime.load(&spec).await.unwrap();
    let (sink, _rx) = sink::channel(4);
    let _instance = loaded.instantiate(&runtime, &spec, sink).await.unwrap();

    let mut lines = BTreeMap::new();
    tokio::time::timeout(std::time::Duration::from_secs(30), async {
        loop {
            match events.recv().await {
                Ok(PluginEvent {
                    kind: EventKind::Log { message, .. },
                    ..
                }) => {
                    if message == "probe done" {
                        return;
                    }
                    let rest = message.strip_prefix("probe ").unwrap();
                    let (how, rest) = rest.split_once(' ').unwrap();
                    let (path, outcome) = rest.split_once(": ").unwrap();
                    lines.insert((how.to_owned(), path.to_owned()), outcome.to_owned());
                }
                Ok(_) => {}
                Err(e) => panic!("events: {e}"),
            }
        }
    })
    .await
    .expect("the probe finishes");
    for path in allowed {
        let outcome = &lines[&("files".to_owned(), path.to_owned())];
        let real = std::fs::read(path).unwrap();
        assert!(outcome.starts_with("read "), "{path}: {outcome}");
        // The agent's own mount namespace: about as long as this process reads it.
        assert!(
            !real.is_empty() || outcome == "read 0 bytes",
            "{path}: {outcome}"
        );
    }
    for path in &refused {
        let outcome = &lines[&("files".to_owned(), path.clone())];
        assert!(outcome.starts_with("refused"), "{path}: {outcome}");
    }
    for dir in ["/proc/self", "/proc"] {
        let outcome = &lines[&("dirs".to_owned(), dir.to_owned())];
        assert!(
            outcome.starts_with("refused") || outcome == "listed []",
            "{dir}: {outcome}"
        );
    }
}

/// `cpufreq` points of a `/proc/cpuinfo`: the first hwthread of each `(physical id, core
/// id)`, in MHz.
fn cpuinfo_expected(text: &str) -> Vec<Got> {
    let mut seen = std::collections::BTreeSet::new();
    let mut out = Vec::new();
    for block in text.split("\n\n").filter(|b| !b.trim().is_empty()) {
        let field = |key: &str| {
            block
                .lines()
                .find(|l| l.split(':').next().map(str::trim) == Some(key))
                .map(|l| l.split(':').nth(1).unwrap().trim().to_owned())
        };
        let (Some(cpu), Some(mhz), Some(core), Some(package)) = (
            field("processor"),
            field("cpu MHz"),
            field("core id"),
            field("physical id"),
        ) else {
            continue;
        };
        if seen.insert((package.clone(), core)) {
            out.push(point(
                "cpufreq",
                &[
                    ("type", "hwthread"),
                    ("type-id", &cpu),
                    ("package_id", &package),
                    ("unit", "MHz"),
                ],
                V::F(mhz.parse().unwrap()),
            ));
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cpufreq_cpuinfo_sends_each_cores_clock_once_from_cpuinfo() {
    let mut run = Run::hpc("cpufreq_cpuinfo", json!({}), &["/proc/cpuinfo"]).await;
    let first = cpuinfo_expected(&read(run.root(), "/proc/cpuinfo"));
    assert_eq!(first.len(), 2, "two cores, their siblings left out");
    assert_points(run.collect(T1).await, first);
    run.put_hpc(2);
    let second = cpuinfo_expected(&read(run.root(), "/proc/cpuinfo"));
    assert_points(run.collect(T2).await, second.clone());

    // A damaged frequency fails that round only.
    let text = read(run.root(), "/proc/cpuinfo");
    run.write("/proc/cpuinfo", &text.replacen("1800.000", "1800,000", 1));
    let message = run.collect_fails(T3).await;
    assert!(
        message.contains("/proc/cpuinfo") && message.contains("\"1800,000\""),
        "{message}"
    );
    run.write("/proc/cpuinfo", &text);
    assert_points(run.collect(T3 + 5_000_000_000).await, second);
}
