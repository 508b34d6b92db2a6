//! The `nvidia` collector plugin through the agent's NVML grant (`cc:fleet/nvml`).
//!
//! The tests build a stand-in NVML library (`fixtures/nvml-standin`, a `cdylib` exporting
//! the NVML functions the agent calls, answering from `src/recorded.rs`), copy it for each
//! test (so each test's library has its own energy counters) and point the plugin's grant at
//! it. Every point the plugin emits is compared with what this file computes from the same
//! recorded values, following cc-metric-collector's `nvidia` collector. One test runs
//! against the real driver when the machine has one.

#[path = "support/guests.rs"]
mod guests;
#[allow(dead_code)]
#[path = "fixtures/nvml-standin/src/recorded.rs"]
mod recorded;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use ccfleet::lineproto::{Decoder, FieldValue as LpValue};
use ccfleet_host::plugin::Instance;
use ccfleet_host::sink::{self, BatchReceiver};
use ccfleet_host::{PluginSpec, Runtime, RuntimeOptions};
use recorded::{GPUS, Gpu};
use serde_json::json;

const T1: i64 = 1_700_000_000_000_000_000;
const T2: i64 = T1 + 5_000_000_000;
const HOST: &str = "gpu-node";

/// Where the real driver's NVML is, on the distributions the agent runs on.
const REAL_LIBRARIES: [&str; 3] = [
    "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
    "/usr/lib64/libnvidia-ml.so.1",
    "/usr/lib/aarch64-linux-gnu/libnvidia-ml.so.1",
];

#[derive(Debug, Clone, PartialEq)]
enum V {
    F(f64),
    I(i64),
    U(u64),
    S(String),
}

/// One point as emitted (or expected).
#[derive(Debug, Clone, PartialEq)]
struct Got {
    name: String,
    tags: BTreeMap<String, String>,
    value: V,
}

/// The stand-in library, built once per test binary.
fn standin() -> &'static Path {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(|| {
        let manifest =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/nvml-standin/Cargo.toml");
        let target = Path::new(env!("CARGO_TARGET_TMPDIR")).join("nvml-standin");
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
            .expect("running cargo build for the stand-in NVML");
        assert!(status.success(), "building the stand-in NVML failed");
        let lib = target.join("debug/libnvidia_ml_standin.so");
        assert!(lib.is_file(), "{} was not built", lib.display());
        lib
    })
}

/// What the plugin's grant gives it.
enum Grant {
    /// A fresh copy of the stand-in.
    StandIn,
    /// `capabilities.nvml` with this library.
    Library(PathBuf),
    /// No `capabilities.nvml`.
    None,
}

/// The nvidia plugin with a grant.
struct Run {
    runtime: Runtime,
    _dir: tempfile::TempDir,
    instance: Instance,
    rx: BatchReceiver,
}

impl Run {
    async fn start(config: serde_json::Value, grant: Grant) -> Run {
        let dir = tempfile::tempdir().unwrap();
        let runtime = Runtime::new(RuntimeOptions {
            cache_dir: None,
            ..RuntimeOptions::default()
        })
        .unwrap();
        let mut spec = PluginSpec::new(guests::component("nvidia"));
        let mut config = config;
        config["hostname"] = json!(HOST);
        spec.config = config;
        match grant {
            Grant::StandIn => {
                // A copy of its own: a library is loaded once per file, so each test's
                // stand-in starts its energy counters afresh.
                let lib = dir.path().join("libnvidia-ml.so.1");
                std::fs::copy(standin(), &lib).unwrap();
                spec.capabilities.nvml = true;
                spec.capabilities.nvml_library = Some(lib);
            }
            Grant::Library(lib) => {
                spec.capabilities.nvml = true;
                spec.capabilities.nvml_library = Some(lib);
            }
            Grant::None => {}
        }
        spec.validate().expect("a valid specification");
        let loaded = runtime.load(&spec).await.expect("loads");
        let (sink, rx) = sink::channel(16);
        let instance = loaded
            .instantiate(&runtime, &spec, sink)
            .await
            .expect("instantiates and inits");
        Run {
            runtime,
            _dir: dir,
            instance,
            rx,
        }
    }

    /// Calls `collect` and decodes what it emitted.
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
                let value = match &fields[0].1 {
                    LpValue::Float(v) => V::F(*v),
                    LpValue::Int(v) => V::I(*v),
                    LpValue::Uint(v) => V::U(*v),
                    LpValue::String(s) => V::S(s.unescape().into_owned()),
                    other => panic!("unexpected value {other:?}"),
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

    /// Calls `collect`, which must fail with the plugin's error (not trap).
    async fn collect_fails(&mut self, now_ns: i64) -> String {
        match self.instance.collect(now_ns).await {
            Ok(Err(message)) => {
                assert!(self.rx.try_recv().is_err(), "nothing emitted");
                message
            }
            other => panic!("collect must fail with the plugin's error: {other:?}"),
        }
    }
}

fn key(p: &Got) -> (String, Vec<(String, String)>) {
    (
        p.name.clone(),
        p.tags.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
    )
}

/// Every expected point is emitted once, nothing else; floats to 1e-12 relative.
fn assert_points(mut got: Vec<Got>, mut expected: Vec<Got>) {
    got.sort_by_key(key);
    expected.sort_by_key(key);
    let names = |ps: &[Got]| ps.iter().map(key).collect::<Vec<_>>();
    assert_eq!(names(&got), names(&expected), "the same points");
    for (g, e) in got.iter().zip(&expected) {
        let same = match (&g.value, &e.value) {
            (V::F(a), V::F(b)) => (a - b).abs() <= 1e-12 * b.abs().max(1.0),
            (a, b) => a == b,
        };
        assert!(
            same,
            "{} {:?}: got {:?}, expected {:?}",
            g.name, g.tags, g.value, e.value
        );
    }
}

/// The energy state of one GPU in a round: how many reads came before, and the seconds
/// since the last round.
#[derive(Clone, Copy)]
struct Energy {
    reads_before: u64,
    seconds: u64,
}

/// A device's expected points, computed from its recorded values as cc-metric-collector
/// computes them.
fn expected(g: &Gpu, tags: &[(String, String)], is_mig: bool, energy: Energy) -> Vec<Got> {
    let mut out = Vec::new();
    let mut push = |name: &str, value: V, unit: Option<&str>, extra: &[(&str, String)]| {
        let mut all: BTreeMap<String, String> = tags.iter().cloned().collect();
        all.insert("hostname".to_owned(), HOST.to_owned());
        if let Some(unit) = unit {
            all.insert("unit".to_owned(), unit.to_owned());
        }
        for (k, v) in extra {
            all.insert((*k).to_owned(), v.clone());
        }
        out.push(Got {
            name: name.to_owned(),
            tags: all,
            value,
        });
    };
    let mb = |bytes: u64| V::F(bytes as f64 / 1048576.0);
    if let Some((total, used)) = g.memory {
        push("nv_fb_mem_total", mb(total), Some("MByte"), &[]);
        push("nv_fb_mem_used", mb(used), Some("MByte"), &[]);
    }
    if let Some((total, used)) = g.bar1 {
        push("nv_bar1_mem_total", mb(total), Some("MByte"), &[]);
        push("nv_bar1_mem_used", mb(used), Some("MByte"), &[]);
    }
    if !is_mig {
        if let Some((gpu, mem)) = g.utilization {
            push("nv_util", V::F(gpu.into()), Some("%"), &[]);
            push("nv_mem_util", V::F(mem.into()), Some("%"), &[]);
        }
        if let Some(v) = g.encoder {
            push("nv_encoder_util", V::F(v.into()), Some("%"), &[]);
        }
        if let Some(v) = g.decoder {
            push("nv_decoder_util", V::F(v.into()), Some("%"), &[]);
        }
    }
    if let Some(v) = g.temperature {
        push("nv_temp", V::F(v.into()), Some("degC"), &[]);
    }
    if let Some(v) = g.fan {
        push("nv_fan", V::F(v.into()), Some("%"), &[]);
    }
    let ecc = match g.ecc_pending {
        Some(1) => "ON",
        Some(0) => "OFF",
        Some(_) => "UNKNOWN",
        None => "N/A",
    };
    push("nv_ecc_mode", V::S(ecc.to_owned()), None, &[]);
    if let Some(p) = g.pstate {
        push("nv_perf_state", V::S(format!("P{p}")), None, &[]);
    }
    if g.power_mode == Some(1) {
        if let Some(mw) = g.power_usage {
            push(
                "nv_power_usage",
                V::F(f64::from(mw) / 1000.0),
                Some("watts"),
                &[],
            );
        }
        if let Some((start, step)) = g.energy {
            let now = start + step * energy.reads_before;
            push("nv_energy_abs", V::U(now / 1000), Some("Joules"), &[]);
            if energy.reads_before > 0 {
                let joules = step / 1000;
                push("nv_energy", V::U(joules), Some("Joules"), &[]);
                push(
                    "nv_average_power",
                    V::U(joules / energy.seconds),
                    Some("watts"),
                    &[],
                );
            }
        }
    }
    let clock_names = ["graphics", "sm", "mem", "video"];
    for (i, name) in clock_names.iter().enumerate() {
        if let Some(v) = g.clocks[i] {
            push(
                &format!("nv_{name}_clock"),
                V::F(v.into()),
                Some("MHz"),
                &[],
            );
        }
        if let Some(v) = g.max_clocks[i] {
            push(
                &format!("nv_max_{name}_clock"),
                V::F(v.into()),
                Some("MHz"),
                &[],
            );
        }
    }
    if let Some(v) = g.ecc_uncorrected {
        push("nv_ecc_uncorrected_error", V::F(v as f64), None, &[]);
    }
    if let Some(v) = g.ecc_corrected {
        push("nv_ecc_corrected_error", V::F(v as f64), None, &[]);
    }
    if let Some(mw) = g.power_limit {
        push(
            "nv_power_max_limit",
            V::F(f64::from(mw) / 1000.0),
            Some("watts"),
            &[],
        );
    }
    if let Some((c, u, p, f)) = g.remapped {
        push("nv_remapped_rows_corrected", V::F(c.into()), None, &[]);
        push("nv_remapped_rows_uncorrected", V::F(u.into()), None, &[]);
        push("nv_remapped_rows_pending", V::I(p.into()), None, &[]);
        push("nv_remapped_rows_failure", V::I(f.into()), None, &[]);
    }
    if let Some(n) = g.compute_processes {
        push("nv_compute_processes", V::I(n.into()), None, &[]);
    }
    if let Some(n) = g.graphics_processes {
        push("nv_graphics_processes", V::I(n.into()), None, &[]);
    }
    let violations = [
        "power",
        "thermal",
        "sync_boost",
        "board_limit",
        "low_util",
        "reliability",
        "below_app_clock",
        "below_base_clock",
    ];
    for (i, name) in violations.iter().enumerate() {
        if let Some(ns) = g.violations[i] {
            push(
                &format!("nv_violation_{name}"),
                V::F(ns as f64 * 1e-9),
                Some("sec"),
                &[],
            );
        }
    }
    if !is_mig {
        // By nvmlNvLinkErrorCounter_t: replay 0, recovery 1, CRC flit 2, CRC data 3, ECC 4.
        let counters = [
            ("nv_nvlink_crc_errors", 3),
            ("nv_nvlink_ecc_errors", 4),
            ("nv_nvlink_replay_errors", 0),
            ("nv_nvlink_recovery_errors", 1),
            ("nv_nvlink_crc_flit_errors", 2),
        ];
        for (name, slot) in counters {
            let mut sum = 0;
            for link in g.nvlinks.unwrap_or(&[]).iter().filter(|l| l.active) {
                if let Some(count) = link.counters[slot] {
                    sum += count;
                    push(
                        name,
                        V::U(count),
                        None,
                        &[
                            ("stype", "nvlink".into()),
                            ("stype-id", link.link.to_string()),
                        ],
                    );
                }
            }
            push(
                &format!("{name}_sum"),
                V::U(sum),
                None,
                &[("stype", "nvlink".into())],
            );
        }
    }
    out
}

fn tags(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

fn with(mut base: Vec<(String, String)>, more: &[(&str, &str)]) -> Vec<(String, String)> {
    base.extend(tags(more));
    base
}

fn gpu_tags(index: usize) -> Vec<(String, String)> {
    tags(&[("type", "accelerator"), ("type-id", &index.to_string())])
}

fn first(reads_before: u64) -> Energy {
    Energy {
        reads_before,
        seconds: 5,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_point_of_both_gpus_matches_the_recorded_values_over_two_rounds() {
    let mut run = Run::start(json!({}), Grant::StandIn).await;
    for (round, now) in [(0, T1), (1, T2)] {
        let got = run.collect(now).await;
        let mut want = Vec::new();
        for (i, g) in GPUS.iter().enumerate() {
            want.extend(expected(g, &gpu_tags(i), false, first(round)));
        }
        assert_points(got, want);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mig_devices_are_measured_by_index_uuid_or_slice_name() {
    let cases: [(serde_json::Value, [&str; 2]); 3] = [
        (json!({"process_mig_devices": true}), ["0", "1"]),
        (
            json!({"process_mig_devices": true, "use_uuid_for_mig_device": true}),
            [GPUS[1].migs[0].uuid, GPUS[1].migs[1].uuid],
        ),
        (
            json!({"process_mig_devices": true, "use_slice_for_mig_device": true}),
            ["3g.20gb", "1g.5gb"],
        ),
    ];
    for (config, ids) in cases {
        let mut run = Run::start(config.clone(), Grant::StandIn).await;
        let got = run.collect(T1).await;
        let mut want = Vec::new();
        for (i, g) in GPUS.iter().enumerate() {
            want.extend(expected(g, &gpu_tags(i), false, first(0)));
        }
        for (j, m) in GPUS[1].migs.iter().enumerate() {
            let t = with(gpu_tags(1), &[("stype", "mig"), ("stype-id", ids[j])]);
            want.extend(expected(m, &t, true, first(0)));
        }
        assert!(
            got.iter()
                .any(|p| p.tags.get("stype").map(String::as_str) == Some("mig"))
        );
        assert_points(got, want);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn excluded_devices_and_metrics_are_left_out() {
    // By NVML index, and by PCI address as NVML writes it.
    for (excluded, kept) in [("1", 0), ("00000000:1B:00.0", 1)] {
        let mut run = Run::start(
            json!({"exclude_devices": [excluded], "process_mig_devices": true}),
            Grant::StandIn,
        )
        .await;
        let got = run.collect(T1).await;
        let mut want = expected(&GPUS[kept], &gpu_tags(kept), false, first(0));
        if kept == 1 {
            for (j, m) in GPUS[1].migs.iter().enumerate() {
                let t = with(
                    gpu_tags(1),
                    &[("stype", "mig"), ("stype-id", &j.to_string())],
                );
                want.extend(expected(m, &t, true, first(0)));
            }
        }
        assert_points(got, want);
    }
    // An excluded NVLink counter takes its sum along.
    let dropped = [
        "nv_temp",
        "nv_nvlink_crc_errors",
        "nv_energy_abs",
        "nv_ecc_mode",
    ];
    let mut run = Run::start(json!({"exclude_metrics": dropped}), Grant::StandIn).await;
    let got = run.collect(T1).await;
    let mut want = Vec::new();
    for (i, g) in GPUS.iter().enumerate() {
        want.extend(expected(g, &gpu_tags(i), false, first(0)));
    }
    want.retain(|p| !dropped.contains(&p.name.as_str()) && p.name != "nv_nvlink_crc_errors_sum");
    assert!(
        got.iter()
            .all(|p| !p.name.starts_with("nv_nvlink_crc_errors"))
    );
    assert_points(got, want);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pci_addresses_and_meta_become_tags_as_configured() {
    let pci = |g: &Gpu| format!("{:08X}:{:02X}:{:02X}.0", g.pci.0, g.pci.1, g.pci.2);
    let mut run = Run::start(json!({"use_pci_info_as_type_id": true}), Grant::StandIn).await;
    let got = run.collect(T1).await;
    let mut want = Vec::new();
    for g in &GPUS {
        let t = tags(&[("type", "accelerator"), ("type-id", &pci(g))]);
        want.extend(expected(g, &t, false, first(0)));
    }
    assert_points(got, want);

    // `add_pci_info_tag`, and the meta sent as tags where `meta_as_tags` names them (the
    // A100 has no board part number: that tag is left out for it).
    let mut run = Run::start(
        json!({
            "add_pci_info_tag": true,
            "add_uuid_meta": true,
            "add_serial_meta": true,
            "add_board_number_meta": true,
            "process_mig_devices": true,
            "meta_as_tags": ["unit", "uuid", "serial", "board_number"],
        }),
        Grant::StandIn,
    )
    .await;
    let got = run.collect(T1).await;
    let mut want = Vec::new();
    for (i, g) in GPUS.iter().enumerate() {
        let mut t = with(gpu_tags(i), &[("pci_identifier", &pci(g))]);
        t.extend(tags(&[("uuid", g.uuid)]));
        if let Some(serial) = g.serial {
            t.extend(tags(&[("serial", serial)]));
        }
        if let Some(board) = g.board_part_number {
            t.extend(tags(&[("board_number", board)]));
        }
        want.extend(expected(g, &t, false, first(0)));
        for (j, m) in g.migs.iter().enumerate() {
            // A MIG device carries its own UUID as meta, its GPU's serial.
            let mut mt: Vec<(String, String)> =
                t.iter().filter(|(k, _)| k != "uuid").cloned().collect();
            mt.extend(tags(&[
                ("stype", "mig"),
                ("stype-id", &j.to_string()),
                ("uuid", m.uuid),
            ]));
            want.extend(expected(m, &mt, true, first(0)));
        }
    }
    assert_points(got, want);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_grant_the_plugin_gets_a_clear_error() {
    let mut run = Run::start(json!({}), Grant::None).await;
    let message = run.collect_fails(T1).await;
    assert!(
        message.contains("NVML is not granted to this plugin (capabilities.nvml)"),
        "{message}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_library_the_round_fails_clearly_and_the_agent_carries_on() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("libnvidia-ml.so.1");
    let mut run = Run::start(json!({}), Grant::Library(missing.clone())).await;
    for now in [T1, T2] {
        let message = run.collect_fails(now).await;
        assert!(
            message.contains("NVML is not available on this host")
                && message.contains("libnvidia-ml.so.1"),
            "{message}"
        );
    }
    // A library that is not NVML is refused the same way.
    let libc = [
        "/lib/x86_64-linux-gnu/libc.so.6",
        "/lib64/libc.so.6",
        "/usr/lib/libc.so.6",
    ]
    .into_iter()
    .find(|p| Path::new(p).is_file());
    if let Some(libc) = libc {
        let mut other = Run::start(json!({}), Grant::Library(libc.into())).await;
        let message = other.collect_fails(T1).await;
        assert!(
            message.contains("NVML is not available on this host")
                && message.contains("lacks nvmlInit_v2"),
            "{message}"
        );
    }
    // The plugin is still alive, and so is its runtime: the same runtime runs a plugin
    // whose library is there.
    let message = run.collect_fails(T2 + 1).await;
    assert!(message.contains("not available"), "{message}");
    let lib = dir.path().join("standin.so");
    std::fs::copy(standin(), &lib).unwrap();
    let mut spec = PluginSpec::new(guests::component("nvidia"));
    spec.config = json!({"hostname": HOST});
    spec.capabilities.nvml = true;
    spec.capabilities.nvml_library = Some(lib);
    let loaded = run.runtime.load(&spec).await.unwrap();
    let (sink, mut rx) = sink::channel(4);
    let mut good = loaded.instantiate(&run.runtime, &spec, sink).await.unwrap();
    assert_eq!(good.collect(T1).await, Ok(Ok(())));
    let batch = rx.try_recv().expect("it emitted");
    assert!(String::from_utf8_lossy(&batch.lines).contains("nv_fb_mem_total,"));
}

#[test]
fn the_grant_is_checked() {
    let mut spec = PluginSpec::new("nvidia.wasm");
    spec.capabilities.nvml_library = Some("/opt/nvml.so".into());
    let error = spec.validate().unwrap_err().to_string();
    assert!(
        error.contains("nvml-library needs capabilities.nvml"),
        "{error}"
    );
    spec.capabilities.nvml = true;
    spec.capabilities.nvml_library = Some("nvml.so".into());
    let error = spec.validate().unwrap_err().to_string();
    assert!(error.contains("must be an absolute path"), "{error}");
    let parsed: PluginSpec = serde_json::from_value(json!({
        "path": "nvidia.wasm",
        "capabilities": {"nvml": true, "nvml-library": "/opt/nvidia/libnvidia-ml.so.1"}
    }))
    .unwrap();
    assert!(parsed.capabilities.nvml);
    parsed.validate().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_real_driver_is_read_when_the_machine_has_one() {
    let Some(lib) = REAL_LIBRARIES.iter().find(|p| Path::new(p).exists()) else {
        eprintln!(
            "skipped: no NVIDIA driver on this machine (none of {})",
            REAL_LIBRARIES.join(", ")
        );
        return;
    };
    let mut run = Run::start(
        json!({"process_mig_devices": true}),
        Grant::Library(PathBuf::from(*lib)),
    )
    .await;
    match run.instance.collect(T1).await {
        Ok(Ok(())) => {}
        Ok(Err(message)) => {
            // A library without a loaded kernel driver (a container, a node being set up).
            assert!(
                message.contains("NVML is not available on this host"),
                "{message}"
            );
            eprintln!("skipped: the driver's library is there but NVML says: {message}");
            return;
        }
        other => panic!("collect: {other:?}"),
    }
    let mut points = Vec::new();
    while let Ok(batch) = run.rx.try_recv() {
        points.extend(
            String::from_utf8_lossy(&batch.lines)
                .lines()
                .map(str::to_owned),
        );
    }
    // Every GPU has frame buffer memory; each is tagged as cc-metric-collector tags it.
    let totals: Vec<&String> = points
        .iter()
        .filter(|l| l.starts_with("nv_fb_mem_total,"))
        .collect();
    assert!(!totals.is_empty(), "{points:?}");
    for line in totals {
        assert!(line.contains(",type=accelerator,type-id="), "{line}");
    }
    eprintln!("read {} points from the real driver", points.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_component_built_against_wit_0_3_0_still_runs() {
    // The loadavg plugin as built before `cc:fleet/nvml` was added (cc:fleet@0.3.0).
    let old = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/collectors/loadavg-wit-0.3.0.wasm");
    let bytes = std::fs::read(&old).unwrap();
    for needle in [&b"cc:fleet/host@0.3.0"[..], b"cc:fleet/plugin@0.3.0"] {
        assert!(bytes.windows(needle.len()).any(|w| w == needle));
    }
    assert!(!bytes.windows(6).any(|w| w == b"@0.3.1"));
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(root.path().join("proc")).unwrap();
    std::fs::write(
        root.path().join("proc/loadavg"),
        "0.52 0.58 0.59 2/1044 62791\n",
    )
    .unwrap();
    let runtime = Runtime::new(RuntimeOptions {
        cache_dir: None,
        ..RuntimeOptions::default()
    })
    .unwrap();
    let mut spec = PluginSpec::new(old);
    spec.config = json!({"hostname": "n1"});
    spec.capabilities.read_files = vec!["/proc/loadavg".to_owned()];
    spec.capabilities.files_root = Some(root.path().to_path_buf());
    let loaded = runtime.load(&spec).await.expect("a 0.3.0 component loads");
    let (sink, mut rx) = sink::channel(4);
    let mut instance = loaded.instantiate(&runtime, &spec, sink).await.unwrap();
    assert_eq!(instance.collect(T1).await, Ok(Ok(())));
    let batch = rx.try_recv().expect("it emitted");
    let text = String::from_utf8(batch.lines.to_vec()).unwrap();
    assert!(
        text.starts_with("load_one,hostname=n1,type=node value=0.52 "),
        "{text}"
    );
}
