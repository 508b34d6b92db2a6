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
        let root = tempfile::tempdir().unwrap();
        copy_tree(&round(1), root.path());
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

    /// Makes round `n` the current files.
    fn put(&self, n: u8) {
        copy_tree(&round(n), self.root());
    }

    fn write(&self, path: &str, text: &str) {
        std::fs::write(self.root().join(path.trim_start_matches('/')), text).unwrap();
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
            point("disk_total", &tags, V::I(total)),
            point("disk_free", &tags, V::I(free)),
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
