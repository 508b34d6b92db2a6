//! The `likwid` collector plugin through the agent's LIKWID grant (`cc:fleet/likwid`).
//!
//! The tests build a stand-in LIKWID library (`fixtures/likwid-standin`, a `cdylib`
//! exporting the LIKWID 5 functions the agent calls for a 2-socket node with the counter
//! values of `src/recorded.rs`), copy it for each test under LIKWID's versioned file name,
//! and point the plugin's grant at it. The plugin runs NHR@FAU's `fritz` configuration as
//! it is, and every point is compared with what this file computes from the recorded
//! counters with its own code of the configuration's formulas. One test runs the node's real
//! LIKWID (Debian's `likwid` package) when it is installed.

#[path = "support/guests.rs"]
mod guests;
#[allow(dead_code)]
#[path = "fixtures/likwid-standin/src/recorded.rs"]
mod recorded;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use ccfleet::lineproto::{Decoder, FieldValue as LpValue};
use ccfleet_host::plugin::Instance;
use ccfleet_host::sink::{self, BatchReceiver};
use ccfleet_host::{PluginSpec, Runtime, RuntimeOptions};
use serde_json::{Value, json};

const T1: i64 = 1_700_000_000_000_000_000;
const HOST: &str = "f0101";

/// Where Debian's LIKWID is.
const REAL_LIBRARIES: [&str; 2] = [
    "/usr/lib/x86_64-linux-gnu/liblikwid.so.5",
    "/usr/lib/aarch64-linux-gnu/liblikwid.so.5",
];

/// The metrics of `fritz`'s ClusterCockpit metric configuration that only LIKWID gives.
const FRITZ_METRICS: [&str; 9] = [
    "clock",
    "cpu_power",
    "flops_any",
    "flops_dp",
    "flops_sp",
    "ipc",
    "mem_bw",
    "mem_power",
    "vectorization_ratio",
];

/// The stand-in library, built once per test binary.
fn standin() -> &'static Path {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(|| {
        let manifest =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/likwid-standin/Cargo.toml");
        let target = Path::new(env!("CARGO_TARGET_TMPDIR")).join("likwid-standin");
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let status = Command::new(cargo)
            .args(["build", "--quiet", "--manifest-path"])
            .arg(&manifest)
            .arg("--target-dir")
            .arg(&target)
            .env_remove("RUSTFLAGS")
            .env_remove("CARGO_ENCODED_RUSTFLAGS")
            .env_remove("CARGO_BUILD_TARGET")
            .status()
            .expect("running cargo build for the stand-in LIKWID");
        assert!(status.success(), "building the stand-in LIKWID failed");
        let lib = target.join("debug/liblikwid_standin.so");
        assert!(lib.is_file(), "{} was not built", lib.display());
        lib
    })
}

/// A fresh copy of the stand-in in `dir` named `name` (a library is loaded once per file).
fn standin_copy(dir: &Path, name: &str) -> PathBuf {
    let lib = dir.join(name);
    std::fs::copy(standin(), &lib).unwrap();
    lib
}

/// The `likwid` section of NHR@FAU's `fritz` configuration.
fn fritz_section() -> Value {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/ccmc-fau/fritz/collectors.json");
    let all: Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    all["likwid"].clone()
}

/// One point as emitted (or expected).
#[derive(Debug, Clone, PartialEq)]
struct Got {
    name: String,
    tags: BTreeMap<String, String>,
    value: f64,
}

struct Run {
    _runtime: Runtime,
    instance: Instance,
    rx: BatchReceiver,
}

impl Run {
    async fn start(mut config: Value, library: Option<PathBuf>) -> Run {
        let runtime = Runtime::new(RuntimeOptions {
            cache_dir: None,
            ..RuntimeOptions::default()
        })
        .unwrap();
        let mut spec = PluginSpec::new(guests::component("likwid"));
        config["hostname"] = json!(HOST);
        spec.config = config;
        spec.limits.call_timeout = Duration::from_secs(5);
        if let Some(lib) = library {
            spec.capabilities.likwid = true;
            spec.capabilities.likwid_library = Some(lib);
        }
        spec.validate().expect("a valid specification");
        let loaded = runtime.load(&spec).await.expect("loads");
        let (sink, rx) = sink::channel(16);
        let instance = loaded
            .instantiate(&runtime, &spec, sink)
            .await
            .expect("instantiates and inits");
        Run {
            _runtime: runtime,
            instance,
            rx,
        }
    }

    async fn collect(&mut self) -> Vec<Got> {
        let outcome = self.instance.collect(T1).await;
        assert_eq!(outcome, Ok(Ok(())), "collect");
        let mut points = Vec::new();
        while let Ok(batch) = self.rx.try_recv() {
            for line in Decoder::new(&batch.lines) {
                let line = line.expect("valid line protocol");
                let tags = line
                    .tags()
                    .map(|(k, v)| (k.raw().to_owned(), v.unescape().into_owned()))
                    .collect();
                let fields: Vec<_> = line.fields().collect();
                assert_eq!(fields.len(), 1, "one field");
                assert_eq!(fields[0].0.raw(), "value");
                let LpValue::Float(value) = fields[0].1 else {
                    panic!("a float value: {:?}", fields[0].1);
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

    async fn collect_fails(&mut self) -> String {
        match self.instance.collect(T1).await {
            Ok(Err(message)) => {
                assert!(self.rx.try_recv().is_err(), "nothing emitted");
                message
            }
            other => panic!("collect must fail with the plugin's error: {other:?}"),
        }
    }
}

/// 1 / the base clock, as the agent takes it: the CPU's cpufreq files, else the library's
/// cycle clock.
fn inverse_clock() -> f64 {
    for file in [
        "/sys/devices/system/cpu/cpu0/cpufreq/bios_limit",
        "/sys/devices/system/cpu/cpu0/cpufreq/base_frequency",
    ] {
        if let Ok(text) = std::fs::read_to_string(file)
            && let Ok(khz) = text.trim().parse::<u64>()
            && khz > 0
        {
            return 1.0 / (khz as f64 * 1e3);
        }
    }
    1.0 / recorded::CYCLE_CLOCK as f64
}

/// A ratio as `invalid_to_zero` leaves it: 0 where it is not finite.
fn finite(v: f64) -> f64 {
    if v.is_finite() { v } else { 0.0 }
}

/// The points `fritz`'s configuration gives for the recorded counters, computed here.
fn expected_fritz() -> Vec<Got> {
    let time = recorded::TIME;
    let inv = inverse_clock();
    let cpus = recorded::SOCKETS * recorded::CORES_PER_SOCKET;
    let c = |event: &str, counter: &str, cpu: u32| recorded::value(event, counter, cpu).unwrap();
    let mut out = Vec::new();
    let mut push = |name: &str, scope: &str, id: u32, unit: Option<&str>, value: f64| {
        let mut tags = BTreeMap::from([
            ("hostname".to_owned(), HOST.to_owned()),
            ("type".to_owned(), scope.to_owned()),
            ("type-id".to_owned(), id.to_string()),
        ]);
        if let Some(unit) = unit {
            tags.insert("unit".to_owned(), unit.to_owned());
        }
        out.push(Got {
            name: name.to_owned(),
            tags,
            value,
        });
    };
    for cpu in 0..cpus {
        let instr = c("INSTR_RETIRED_ANY", "FIXC0", cpu);
        let core = c("CPU_CLK_UNHALTED_CORE", "FIXC1", cpu);
        let reference = c("CPU_CLK_UNHALTED_REF", "FIXC2", cpu);
        let d = |w: &str| c(&format!("FP_ARITH_INST_RETIRED_{w}_DOUBLE"), "PMC", cpu);
        let s = |w: &str| c(&format!("FP_ARITH_INST_RETIRED_{w}_SINGLE"), "PMC", cpu);
        let (d128, d1, d256, d512) = (
            d("128B_PACKED"),
            d("SCALAR"),
            d("256B_PACKED"),
            d("512B_PACKED"),
        );
        let (s128, s1, s256, s512) = (
            s("128B_PACKED"),
            s("SCALAR"),
            s("256B_PACKED"),
            s("512B_PACKED"),
        );
        let clock = finite(1e-6 * (core / reference) / inv);
        let ipc = finite(instr / core);
        let flops_dp = 1e-9 * (2.0 * d128 + d1 + 4.0 * d256 + 8.0 * d512) / time;
        let flops_sp = 1e-9 * (4.0 * s128 + s1 + 8.0 * s256 + 16.0 * s512) / time;
        let vec_ins = (s128 + s256 + s512) + (d128 + d256 + d512);
        let fp_ins = (s128 + s1 + s256 + s512) + (d128 + d1 + d256 + d512);
        push("clock", "hwthread", cpu, Some("MHz"), clock);
        push("ipc", "hwthread", cpu, None, ipc);
        push("flops_dp", "hwthread", cpu, Some("GFlops/s"), flops_dp);
        push("flops_sp", "hwthread", cpu, Some("GFlops/s"), flops_sp);
        push(
            "flops_any",
            "hwthread",
            cpu,
            Some("GFlops/s"),
            2.0 * flops_dp + flops_sp,
        );
        push(
            "vectorization_ratio",
            "hwthread",
            cpu,
            Some("%"),
            finite(100.0 * vec_ins / fp_ins),
        );
    }
    for socket in 0..recorded::SOCKETS {
        let first = socket * recorded::CORES_PER_SOCKET;
        let mut cas = 0.0;
        for channel in 0..8 {
            cas += c("CAS_COUNT_RD", &format!("MBOX{channel}C0"), first);
            cas += c("CAS_COUNT_WR", &format!("MBOX{channel}C1"), first);
        }
        push(
            "mem_bw",
            "socket",
            socket,
            Some("GBytes/s"),
            1e-9 * cas * 64.0 / time,
        );
        push(
            "cpu_power",
            "socket",
            socket,
            Some("Watt"),
            c("PWR_PKG_ENERGY", "PWR0", first) / time,
        );
        push(
            "mem_power",
            "socket",
            socket,
            Some("Watt"),
            c("PWR_DRAM_ENERGY", "PWR3", first) / time,
        );
    }
    out
}

fn key(p: &Got) -> (String, Vec<(String, String)>) {
    (
        p.name.clone(),
        p.tags.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
    )
}

/// Every expected point is emitted once, nothing else; values to 1e-12 relative.
fn assert_points(mut got: Vec<Got>, mut expected: Vec<Got>) {
    got.sort_by_key(key);
    expected.sort_by_key(key);
    let names = |ps: &[Got]| ps.iter().map(key).collect::<Vec<_>>();
    assert_eq!(names(&got), names(&expected), "the same points");
    for (g, e) in got.iter().zip(&expected) {
        assert!(
            (g.value - e.value).abs() <= 1e-12 * e.value.abs().max(1.0),
            "{} {:?}: got {}, expected {}",
            g.name,
            g.tags,
            g.value,
            e.value
        );
    }
}

/// `fritz`'s section with a short duration and a lock file in `dir`.
fn fritz_config(dir: &Path) -> Value {
    let mut config = fritz_section();
    config["duration"] = json!("200ms");
    config["lockfile_path"] = json!(dir.join("likwid.lock"));
    config
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fritz_metrics_match_their_formulas() {
    let dir = tempfile::tempdir().unwrap();
    let lib = standin_copy(dir.path(), "liblikwid.so.5.2");
    let mut run = Run::start(fritz_config(dir.path()), Some(lib)).await;
    let expected = expected_fritz();
    for _round in 0..2 {
        let got = run.collect().await;
        let mut names: Vec<&str> = got.iter().map(|p| p.name.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names, FRITZ_METRICS, "the metrics fritz's job view needs");
        // The idle thread's ratios are 0, as invalid_to_zero makes them.
        let idle = got
            .iter()
            .find(|p| p.name == "ipc" && p.tags["type-id"] == recorded::IDLE_CPU.to_string())
            .expect("the idle thread's ipc");
        assert_eq!(idle.value, 0.0);
        assert_points(got, expected.clone());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_users_measurement_skips_the_round() {
    let dir = tempfile::tempdir().unwrap();
    let lib = standin_copy(dir.path(), "liblikwid.so.5.2");
    let lock = dir.path().join("likwid.lock");
    std::fs::write(&lock, "").unwrap();
    // SAFETY: geteuid cannot fail.
    let me = unsafe { libc::geteuid() };
    assert_eq!(
        me, 0,
        "this test changes a file's owner and must run as root"
    );
    std::os::unix::fs::chown(&lock, Some(65534), None).unwrap();
    let mut run = Run::start(fritz_config(dir.path()), Some(lib)).await;
    assert_eq!(
        run.collect().await,
        Vec::new(),
        "no point while the counters are taken"
    );
    // The user's measurement ended: the lock file is the agent's user's again.
    std::os::unix::fs::chown(&lock, Some(me), None).unwrap();
    let got = run.collect().await;
    assert_points(got, expected_fritz());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unsupported_version_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let lib = standin_copy(dir.path(), "liblikwid.so.4.3");
    let mut run = Run::start(fritz_config(dir.path()), Some(lib)).await;
    let message = run.collect_fails().await;
    assert!(
        message.contains("LIKWID 4.3 is not supported") && message.contains("5.x"),
        "{message}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_formula_with_an_unknown_name_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let lib = standin_copy(dir.path(), "liblikwid.so.5.2");
    let mut config = fritz_config(dir.path());
    config["eventsets"][0]["metrics"][0]["calc"] = json!("FIXC1/FIXC9");
    let mut run = Run::start(config, Some(lib)).await;
    let message = run.collect_fails().await;
    assert!(
        message.contains("\"FIXC9\"") && message.contains("clock"),
        "{message}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_grant_the_plugin_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let mut run = Run::start(fritz_config(dir.path()), None).await;
    let message = run.collect_fails().await;
    assert!(message.contains("capabilities.likwid"), "{message}");
}

/// How often the stand-in at `lib` (already loaded by the agent) set its counters up.
fn standin_inits(lib: &Path) -> u64 {
    use std::os::unix::ffi::OsStrExt;
    let name = std::ffi::CString::new(lib.as_os_str().as_bytes()).unwrap();
    // SAFETY: the stand-in, already loaded; dlopen of the same path gives its handle.
    let handle = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
    assert!(!handle.is_null(), "the agent loaded the stand-in");
    // SAFETY: a symbol of the stand-in.
    let f = unsafe { libc::dlsym(handle, c"likwid_standin_inits".as_ptr()) };
    assert!(!f.is_null());
    // SAFETY: the stand-in's `extern "C" fn() -> u64`.
    let f: extern "C" fn() -> u64 = unsafe { std::mem::transmute(f) };
    f()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_one_event_set_the_counters_keep_counting_between_rounds() {
    let dir = tempfile::tempdir().unwrap();
    let lib = standin_copy(dir.path(), "liblikwid.so.5.2");
    let mut config = fritz_config(dir.path());
    config["eventsets"].as_array_mut().unwrap().truncate(1);
    config.as_object_mut().unwrap().remove("globalmetrics");
    config["keep_counting"] = json!(true);
    let mut run = Run::start(config, Some(lib.clone())).await;
    let first_set = [
        "clock",
        "ipc",
        "flops_dp",
        "mem_bw",
        "cpu_power",
        "mem_power",
    ];
    let expected: Vec<Got> = expected_fritz()
        .into_iter()
        .filter(|p| first_set.contains(&p.name.as_str()))
        .collect();
    for _round in 0..3 {
        assert_points(run.collect().await, expected.clone());
    }
    // Set up once: the later rounds read what the running counters counted.
    assert_eq!(standin_inits(&lib), 1);

    // Without keep_counting each round sets its event set up again, as cc-metric-collector.
    let dir = tempfile::tempdir().unwrap();
    let lib = standin_copy(dir.path(), "liblikwid.so.5.2");
    let mut config = fritz_config(dir.path());
    config["eventsets"].as_array_mut().unwrap().truncate(1);
    config.as_object_mut().unwrap().remove("globalmetrics");
    let mut run = Run::start(config, Some(lib.clone())).await;
    for _round in 0..2 {
        assert_points(run.collect().await, expected.clone());
    }
    assert_eq!(standin_inits(&lib), 2);
}

/// The CPUs the kernel has online.
fn online_cpus() -> usize {
    let text = std::fs::read_to_string("/sys/devices/system/cpu/online").unwrap();
    text.trim()
        .split(',')
        .map(|range| match range.split_once('-') {
            Some((a, b)) => b.parse::<usize>().unwrap() - a.parse::<usize>().unwrap() + 1,
            None => 1,
        })
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_real_library_reads_this_machine_or_says_why_not() {
    let Some(lib) = REAL_LIBRARIES.iter().find(|p| Path::new(p).exists()) else {
        panic!(
            "LIKWID is not installed (none of {}): install Debian's likwid package",
            REAL_LIBRARIES.join(", ")
        );
    };
    let threads = ccfleet_host::plugin::native::likwid::topology(Path::new(lib))
        .await
        .expect("LIKWID's topology of this machine");
    assert_eq!(threads.len(), online_cpus(), "{threads:?}");
    let dir = tempfile::tempdir().unwrap();
    let mut config = json!({
        "access_mode": "direct",
        "duration": "100ms",
        "lockfile_path": dir.path().join("likwid.lock"),
        "eventsets": [{
            "events": {"FIXC0": "INSTR_RETIRED_ANY", "FIXC1": "CPU_CLK_UNHALTED_CORE"},
            "metrics": [{"name": "ipc", "calc": "FIXC0/FIXC1", "type": "hwthread", "publish": true}]
        }]
    });
    config["invalid_to_zero"] = json!(true);
    let mut run = Run::start(config, Some(PathBuf::from(lib))).await;
    match run.instance.collect(T1).await {
        // A machine whose counters can be read.
        Ok(Ok(())) => {}
        // A virtual machine without a PMU, or no rights: a clear error, no crash, no hang.
        Ok(Err(message)) => assert!(
            message.contains("perfmon_init failed")
                || message.contains("perfmon_addEventSet failed"),
            "{message}"
        ),
        Err(trap) => panic!("the plugin trapped: {trap:?}"),
    }
}
