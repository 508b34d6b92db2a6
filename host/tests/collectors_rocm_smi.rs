//! The `rocm_smi` collector plugin through the agent's ROCm SMI grant (`cc:fleet/rocm-smi`).
//!
//! The tests compile a stand-in ROCm SMI (`fixtures/rocm-smi-standin/standin.c`, the
//! functions the agent calls) against the system's `rocm_smi.h`, with the recorded tables of
//! `recorded.rs` written into it by field name, so the tables have the real header's layout.
//! Every point the plugin emits is compared with what this file computes from the same
//! recorded values, following cc-metric-collector's `rocm_smi` collector; the host's reading
//! of every field of the table is compared too. One test runs Debian's real library, which
//! on a machine without AMD GPUs must fail cleanly.

#[path = "support/guests.rs"]
mod guests;
#[path = "support/rocm_smi_standin.rs"]
mod standin;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ccfleet::lineproto::{Decoder, FieldValue as LpValue};
use ccfleet_host::plugin::Instance;
use ccfleet_host::plugin::native::rocm_smi::RocmSmi;
use ccfleet_host::sink::{self, BatchReceiver};
use ccfleet_host::{PluginSpec, Runtime, RuntimeOptions};
use serde_json::json;
use standin::{GPUS, Gpu, Variant};

const T1: i64 = 1_700_000_000_000_000_000;
const T2: i64 = T1 + 10_000_000_000;
const HOST: &str = "amd-node";

/// Where Debian's (and AMD's) ROCm SMI library is.
const REAL_LIBRARIES: [&str; 3] = [
    "/usr/lib/librocm_smi64.so.1",
    "/usr/lib/x86_64-linux-gnu/librocm_smi64.so.1",
    "/opt/rocm/lib/librocm_smi64.so.5",
];

/// The longest a call may take before the test calls it a hang.
const NO_HANG: Duration = Duration::from_secs(180);

/// cc-metric-collector's metrics and the table fields they send, in its order.
const METRICS: [(&str, &str); 17] = [
    ("rocm_gfx_util", "average_gfx_activity"),
    ("rocm_umc_util", "average_umc_activity"),
    ("rocm_mm_util", "average_mm_activity"),
    ("rocm_avg_power", "average_socket_power"),
    ("rocm_temp_mem", "temperature_mem"),
    ("rocm_temp_hotspot", "temperature_hotspot"),
    ("rocm_temp_edge", "temperature_edge"),
    ("rocm_temp_vrgfx", "temperature_vrgfx"),
    ("rocm_temp_vrsoc", "temperature_vrsoc"),
    ("rocm_temp_vrmem", "temperature_vrmem"),
    ("rocm_gfx_clock", "average_gfxclk_frequency"),
    ("rocm_soc_clock", "average_socclk_frequency"),
    ("rocm_u_clock", "average_uclk_frequency"),
    ("rocm_v0_clock", "average_vclk0_frequency"),
    ("rocm_v1_clock", "average_vclk1_frequency"),
    ("rocm_d0_clock", "average_dclk0_frequency"),
    ("rocm_d1_clock", "average_dclk1_frequency"),
];

/// One point as emitted (or expected).
#[derive(Debug, Clone, PartialEq)]
struct Got {
    name: String,
    tags: BTreeMap<String, String>,
    value: f64,
}

/// The rocm_smi plugin with a grant.
struct Run {
    _runtime: Runtime,
    instance: Instance,
    rx: BatchReceiver,
}

impl Run {
    /// `library`: `capabilities.rocm-smi` with this library; `None`: no grant.
    async fn start(config: serde_json::Value, library: Option<PathBuf>) -> Run {
        let runtime = Runtime::new(RuntimeOptions {
            cache_dir: None,
            ..RuntimeOptions::default()
        })
        .unwrap();
        let mut spec = PluginSpec::new(guests::component("rocm_smi"));
        let mut config = config;
        config["hostname"] = json!(HOST);
        spec.config = config;
        if let Some(library) = library {
            spec.capabilities.rocm_smi = true;
            spec.capabilities.rocm_smi_library = Some(library);
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

    /// Calls `collect` and decodes what it emitted.
    async fn collect(&mut self, now_ns: i64) -> Vec<Got> {
        let outcome = tokio::time::timeout(NO_HANG, self.instance.collect(now_ns))
            .await
            .expect("collect returns");
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

    /// Calls `collect`, which must fail with the plugin's error (not trap, not hang).
    async fn collect_fails(&mut self, now_ns: i64) -> String {
        let outcome = tokio::time::timeout(NO_HANG, self.instance.collect(now_ns))
            .await
            .expect("collect returns");
        match outcome {
            Ok(Err(message)) => {
                assert!(self.rx.try_recv().is_err(), "nothing emitted");
                message
            }
            other => panic!("collect must fail with the plugin's error: {other:?}"),
        }
    }
}

/// A stand-in of its own in a fresh directory (a library is loaded once per path).
fn standin(variant: Variant) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let lib = standin::build(dir.path(), variant, "librocm_smi64.so.1");
    (dir, lib)
}

fn key(p: &Got) -> (String, Vec<(String, String)>) {
    (
        p.name.clone(),
        p.tags.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
    )
}

/// Every expected point is emitted once, with its value, and nothing else.
fn assert_points(mut got: Vec<Got>, mut expected: Vec<Got>) {
    got.sort_by_key(key);
    expected.sort_by_key(key);
    let names = |ps: &[Got]| ps.iter().map(key).collect::<Vec<_>>();
    assert_eq!(names(&got), names(&expected), "the same points");
    for (g, e) in got.iter().zip(&expected) {
        assert_eq!(g.value, e.value, "{} {:?}", g.name, g.tags);
    }
}

/// GPU `index`'s expected points with `tags` (beside `hostname`), leaving out `excluded`.
fn expected(index: usize, tags: &[(&str, &str)], excluded: &[&str]) -> Vec<Got> {
    let gpu: &Gpu = &GPUS[index];
    let mut all: BTreeMap<String, String> = tags
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    all.insert("hostname".to_owned(), HOST.to_owned());
    all.insert("type".to_owned(), "accelerator".to_owned());
    let mut out = Vec::new();
    for (metric, field) in METRICS {
        if !excluded.contains(&metric) {
            out.push(Got {
                name: metric.to_owned(),
                tags: all.clone(),
                value: gpu.field(field) as f64,
            });
        }
    }
    if !excluded.contains(&"rocm_temp_hbm") {
        for (stack, &t) in gpu.temperature_hbm.iter().enumerate() {
            let mut tags = all.clone();
            tags.insert("stype".to_owned(), "device".to_owned());
            tags.insert("stype-id".to_owned(), stack.to_string());
            out.push(Got {
                name: "rocm_temp_hbm".to_owned(),
                tags,
                value: f64::from(t),
            });
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_point_of_both_gpus_matches_the_recorded_tables() {
    let (_dir, lib) = standin(Variant::Recorded);
    let mut run = Run::start(json!({}), Some(lib)).await;
    let mut want = expected(0, &[("type-id", "0")], &[]);
    want.extend(expected(1, &[("type-id", "1")], &[]));
    assert_eq!(want.len(), 2 * 21, "18 metrics, rocm_temp_hbm for 4 stacks");
    for now in [T1, T2] {
        assert_points(run.collect(now).await, want.clone());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pci_addresses_and_the_serial_become_tags_as_configured() {
    let (_dir, lib) = standin(Variant::Recorded);
    let mut run = Run::start(json!({"use_pci_info_as_type_id": true}), Some(lib.clone())).await;
    let mut want = expected(0, &[("type-id", GPUS[0].pci_id)], &[]);
    want.extend(expected(1, &[("type-id", GPUS[1].pci_id)], &[]));
    assert_points(run.collect(T1).await, want);

    let config = json!({"add_pci_info_tag": true, "add_serial_meta": true,
                        "meta_as_tags": ["serial", "group"]});
    let mut run = Run::start(config, Some(lib)).await;
    let mut want = Vec::new();
    for (i, gpu) in GPUS.iter().enumerate() {
        let type_id = i.to_string();
        want.extend(expected(
            i,
            &[
                ("type-id", &type_id),
                ("pci_identifier", gpu.pci_id),
                ("serial", gpu.serial),
                ("group", "AMD"),
            ],
            &[],
        ));
    }
    assert_points(run.collect(T1).await, want);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn excluded_devices_and_metrics_are_left_out() {
    let (_dir, lib) = standin(Variant::Recorded);
    let excluded = ["rocm_mm_util", "rocm_temp_vrsoc", "rocm_temp_hbm"];
    for device in ["1", GPUS[1].pci_id] {
        let config = json!({"exclude_devices": [device], "exclude_metrics": excluded});
        let mut run = Run::start(config, Some(lib.clone())).await;
        let want = expected(0, &[("type-id", "0")], &excluded);
        assert_eq!(want.len(), 15);
        assert_points(run.collect(T1).await, want);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_host_reads_every_field_where_the_header_puts_it() {
    let (_dir, lib) = standin(Variant::Recorded);
    let smi = tokio::task::spawn_blocking(move || RocmSmi::get(&lib))
        .await
        .unwrap()
        .expect("the stand-in loads");
    assert_eq!(smi.version(), standin::VERSION);
    let devices = smi.devices().unwrap();
    assert_eq!(devices.len(), 2);
    for (i, (device, gpu)) in devices.iter().zip(&GPUS).enumerate() {
        assert_eq!(device.index, i as u32);
        let pci = device.pci.as_ref().expect("a PCI address");
        let id = format!(
            "{:08X}:{:02X}:{:02X}.{:X}",
            pci.domain, pci.bus, pci.device, pci.function
        );
        assert_eq!(id, gpu.pci_id);
        assert_eq!(device.serial.as_deref(), Some(gpu.serial));
        let m = smi.read(i as u32).unwrap();
        let read: [(&str, u64); 34] = [
            ("common_header.format_revision", m.format_revision.into()),
            ("common_header.content_revision", m.content_revision.into()),
            ("temperature_edge", m.temperature_edge.into()),
            ("temperature_hotspot", m.temperature_hotspot.into()),
            ("temperature_mem", m.temperature_mem.into()),
            ("temperature_vrgfx", m.temperature_vrgfx.into()),
            ("temperature_vrsoc", m.temperature_vrsoc.into()),
            ("temperature_vrmem", m.temperature_vrmem.into()),
            ("average_gfx_activity", m.average_gfx_activity.into()),
            ("average_umc_activity", m.average_umc_activity.into()),
            ("average_mm_activity", m.average_mm_activity.into()),
            ("average_socket_power", m.average_socket_power.into()),
            ("energy_accumulator", m.energy_accumulator),
            ("system_clock_counter", m.system_clock_counter),
            (
                "average_gfxclk_frequency",
                m.average_gfxclk_frequency.into(),
            ),
            (
                "average_socclk_frequency",
                m.average_socclk_frequency.into(),
            ),
            ("average_uclk_frequency", m.average_uclk_frequency.into()),
            ("average_vclk0_frequency", m.average_vclk0_frequency.into()),
            ("average_dclk0_frequency", m.average_dclk0_frequency.into()),
            ("average_vclk1_frequency", m.average_vclk1_frequency.into()),
            ("average_dclk1_frequency", m.average_dclk1_frequency.into()),
            ("current_gfxclk", m.current_gfxclk.into()),
            ("current_socclk", m.current_socclk.into()),
            ("current_uclk", m.current_uclk.into()),
            ("current_vclk0", m.current_vclk0.into()),
            ("current_dclk0", m.current_dclk0.into()),
            ("current_vclk1", m.current_vclk1.into()),
            ("current_dclk1", m.current_dclk1.into()),
            ("throttle_status", m.throttle_status.into()),
            ("current_fan_speed", m.current_fan_speed.into()),
            ("pcie_link_width", m.pcie_link_width.into()),
            ("pcie_link_speed", m.pcie_link_speed.into()),
            ("gfx_activity_acc", m.gfx_activity_acc.into()),
            ("mem_actvity_acc", m.mem_activity_acc.into()),
        ];
        for (field, value) in read {
            assert_eq!(value, gpu.field(field), "GPU {i} {field}");
        }
        assert_eq!(m.temperature_hbm, gpu.temperature_hbm);
    }
    // A GPU the library did not report is never asked for (the stand-in would abort, as
    // ROCm SMI 5 would crash).
    let err = smi.read(2).unwrap_err();
    assert_eq!(err, "there is no GPU 2 (ROCm SMI reports 2)");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_without_gpus_sends_nothing() {
    let (_dir, lib) = standin(Variant::NoGpus);
    let mut run = Run::start(json!({}), Some(lib)).await;
    assert_eq!(run.collect(T1).await, Vec::new());
}

/// How often the stand-in at `lib` (loaded already) was asked to initialise.
fn init_calls(lib: &Path) -> u32 {
    let name = std::ffi::CString::new(lib.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: the stand-in is loaded already (this takes another reference to it), and
    // `standin_init_calls` is `unsigned (void)`.
    unsafe {
        let handle = libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD);
        assert!(!handle.is_null(), "the stand-in is loaded");
        let f = libc::dlsym(handle, c"standin_init_calls".as_ptr());
        assert!(!f.is_null());
        let f: extern "C" fn() -> u32 = std::mem::transmute(f);
        f()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_initialisation_is_the_answer_for_a_while() {
    let (_dir, lib) = standin(Variant::InitFails);
    let mut run = Run::start(json!({}), Some(lib.clone())).await;
    for now in [T1, T2, T2 + 1] {
        let message = run.collect_fails(now).await;
        assert!(
            message.contains(
                "ROCm SMI is not available on this host: rsmi_init failed: \
                              RSMI_STATUS_INIT_ERROR"
            ) && message.contains("amdgpu driver"),
            "{message}"
        );
    }
    // Tried once, not every round: the library's own complaint is not repeated each round.
    assert_eq!(init_calls(&lib), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unsupported_version_is_named_with_the_supported_ones() {
    let (_dir, lib) = standin(Variant::Major(7));
    let mut run = Run::start(json!({}), Some(lib)).await;
    let message = run.collect_fails(T1).await;
    assert!(
        message.contains("ROCm SMI is not available on this host")
            && message.contains("version 7.0.0 is not supported")
            && message.contains("5.x")
            && message.contains("1.x"),
        "{message}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_grant_or_the_library_the_round_fails_clearly() {
    let mut run = Run::start(json!({}), None).await;
    let message = run.collect_fails(T1).await;
    assert!(
        message.contains("ROCm SMI is not granted to this plugin (capabilities.rocm-smi)"),
        "{message}"
    );
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("librocm_smi64.so.1");
    let mut run = Run::start(json!({}), Some(missing)).await;
    for now in [T1, T2] {
        let message = run.collect_fails(now).await;
        assert!(
            message.contains("ROCm SMI is not available on this host: cannot load")
                && message.contains("librocm_smi64.so.1"),
            "{message}"
        );
    }
}

/// Whether the machine has an AMD GPU bound to a driver (PCI vendor 0x1002 under drm).
fn has_amd_gpu() -> bool {
    let Ok(cards) = std::fs::read_dir("/sys/class/drm") else {
        return false;
    };
    cards.flatten().any(|card| {
        std::fs::read_to_string(card.path().join("device/vendor"))
            .is_ok_and(|v| v.trim() == "0x1002")
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn debians_library_reads_this_machine_or_fails_cleanly() {
    let lib = REAL_LIBRARIES
        .iter()
        .map(Path::new)
        .find(|p| p.exists())
        .unwrap_or_else(|| {
            panic!(
                "ROCm SMI is not installed (none of {}): install Debian's librocm-smi64-1 \
                 (scripts/test.sh installs it)",
                REAL_LIBRARIES.join(", ")
            )
        });
    let direct = lib.to_path_buf();
    let loaded = tokio::time::timeout(
        NO_HANG,
        tokio::task::spawn_blocking(move || RocmSmi::get(&direct).map(|smi| smi.devices())),
    )
    .await
    .expect("no hang")
    .unwrap();
    let mut run = Run::start(json!({}), Some(lib.to_path_buf())).await;
    if has_amd_gpu() {
        let devices = loaded.expect("the library loads").expect("GPUs are listed");
        assert!(!devices.is_empty());
        let points = run.collect(T1).await;
        assert!(
            points.iter().any(|p| p.name == "rocm_gfx_util"),
            "{points:?}"
        );
        return;
    }
    // No AMD GPU: rsmi_init fails (no amdgpu driver), and says so, every round.
    let err = loaded.expect_err("no AMD GPU, no ROCm SMI");
    assert!(err.starts_with("rsmi_init failed: "), "{err}");
    for now in [T1, T2] {
        let message = run.collect_fails(now).await;
        assert!(
            message.contains("ROCm SMI is not available on this host: rsmi_init failed")
                && message.contains("AMD GPUs"),
            "{message}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_component_built_against_wit_0_3_2_still_runs() {
    // The loadavg plugin as built before `cc:fleet/rocm-smi` was added (cc:fleet@0.3.2).
    let old = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/collectors/loadavg-wit-0.3.2.wasm");
    let bytes = std::fs::read(&old).unwrap();
    for needle in [&b"cc:fleet/host@0.3.2"[..], b"cc:fleet/plugin@0.3.2"] {
        assert!(bytes.windows(needle.len()).any(|w| w == needle));
    }
    assert!(!bytes.windows(6).any(|w| w == b"@0.3.3"));
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
    let loaded = runtime.load(&spec).await.expect("a 0.3.2 component loads");
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
