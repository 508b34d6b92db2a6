//! The `likwid` collector's cost per round over the stand-in LIKWID library of the tests
//! (`tests/fixtures/likwid-standin`: a 2-socket node of 72 hardware threads with recorded
//! counter values), beside the host's share of it.
//!
//! - `fritz/component`: one `collect` call of the `likwid` plugin through the plugin host, with
//!   the `likwid` section of NHR@FAU's `fritz` configuration (two event sets, eleven metrics,
//!   two global metrics) as it is but for `duration` (see [`WINDOW`]) and the lock file;
//! - `fritz/host`: what the host does for the plugin's `measure` call (`cc:fleet/likwid`):
//!   the setup checked into a plan (formulas parsed by the router's expression engine), the
//!   measurement on the LIKWID thread (the library's calls, the window's sleep) and the
//!   formulas evaluated, called natively;
//! - `fritz/formulas`: only the plan and the evaluation of the formulas, on the recorded
//!   counter values;
//! - `fritz/window`: the measurement windows alone (one sleep of [`WINDOW`] per event set),
//!   what the wall times above include and no CPU is spent on;
//! - `one-set/*`: `fritz`'s first event set alone (no global metrics), each round setting
//!   the counters up as cc-metric-collector does (the default) or `keep_counting` (the
//!   counters run between rounds and a round only reads them), through the plugin and
//!   natively.
//!
//! Each is measured twice: `likwid-wall` in wall time, `likwid-cpu` in the CPU time of the
//! whole process (`CLOCK_PROCESS_CPUTIME_ID`: every thread, so the LIKWID thread's share
//! counts), which a sleeping window does not add to. Before measuring, the bench checks that
//! the plugin emits a point for each value of the host's round and that the host's round
//! and the formulas alone give the same values.
//!
//! Run with `cargo bench -p ccfleet-host --bench likwid`; the plugins are built from guest/
//! and the stand-in with cargo first, as in the tests.

#[path = "../tests/support/guests.rs"]
mod guests;
#[allow(dead_code)]
#[path = "../tests/fixtures/likwid-standin/src/recorded.rs"]
mod recorded;

/// The allocator of the `ccfleet` binary, so both sides allocate as the agent does.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use ccfleet_host::plugin::Instance;
use ccfleet_host::plugin::native::likwid::{self, AccessMode, Settings};
use ccfleet_host::plugin::native::likwid_metrics::{
    EventSetSpec, MetricSpec, MetricValue, Plan, SetResult, Thread,
};
use ccfleet_host::sink::{self, BatchReceiver};
use ccfleet_host::{PluginSpec, Runtime, RuntimeOptions};
use criterion::measurement::{Measurement, ValueFormatter};
use criterion::{BenchmarkGroup, Criterion, Throughput, criterion_group, criterion_main};
use serde_json::{Value, json};

/// The measurement window of each event set: `duration` in the plugin's configuration. Any
/// duration above zero is allowed; 1 µs keeps the library's calls and the window's sleep
/// (which the kernel's timer slack makes some 50 µs) while leaving the round's cost to
/// the work around it.
const WINDOW: Duration = Duration::from_micros(1);
/// [`WINDOW`] as the configuration writes it.
const WINDOW_TEXT: &str = "1us";

/// The process's CPU time: every thread's, as `CLOCK_PROCESS_CPUTIME_ID` counts it.
struct ProcessCpu;

fn process_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid clock id and a writable timespec.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_PROCESS_CPUTIME_ID)");
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

impl Measurement for ProcessCpu {
    type Intermediate = u64;
    type Value = u64;

    fn start(&self) -> u64 {
        process_cpu_ns()
    }
    fn end(&self, start: u64) -> u64 {
        process_cpu_ns().saturating_sub(start)
    }
    fn add(&self, a: &u64, b: &u64) -> u64 {
        a + b
    }
    fn zero(&self) -> u64 {
        0
    }
    fn to_f64(&self, value: &u64) -> f64 {
        *value as f64
    }
    fn formatter(&self) -> &dyn ValueFormatter {
        &CpuFormatter
    }
}

/// CPU nanoseconds, shown as durations of CPU time.
struct CpuFormatter;

impl ValueFormatter for CpuFormatter {
    fn scale_values(&self, typical_ns: f64, values: &mut [f64]) -> &'static str {
        let (factor, unit) = if typical_ns < 1e3 {
            (1.0, "ns CPU")
        } else if typical_ns < 1e6 {
            (1e-3, "µs CPU")
        } else if typical_ns < 1e9 {
            (1e-6, "ms CPU")
        } else {
            (1e-9, "s CPU")
        };
        for v in values {
            *v *= factor;
        }
        unit
    }

    fn scale_throughputs(
        &self,
        _typical_ns: f64,
        throughput: &Throughput,
        values: &mut [f64],
    ) -> &'static str {
        let (count, unit) = match *throughput {
            Throughput::Elements(n) | Throughput::ElementsAndBytes { elements: n, .. } => {
                (n as f64, "elem/CPU s")
            }
            Throughput::Bytes(n) | Throughput::BytesDecimal(n) => (n as f64, "B/CPU s"),
            Throughput::Bits(n) => (n as f64, "b/CPU s"),
        };
        for v in values {
            *v = count * 1e9 / *v;
        }
        unit
    }

    fn scale_for_machines(&self, _values: &mut [f64]) -> &'static str {
        "ns"
    }
}

/// The stand-in library, built once per bench run.
fn standin() -> PathBuf {
    let manifest =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/likwid-standin/Cargo.toml");
    let target = Path::new(env!("CARGO_TARGET_TMPDIR")).join("likwid-standin");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let status = Command::new(cargo)
        .args(["build", "--quiet", "--release", "--manifest-path"])
        .arg(&manifest)
        .arg("--target-dir")
        .arg(&target)
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .env_remove("CARGO_BUILD_TARGET")
        .status()
        .expect("running cargo build for the stand-in LIKWID");
    assert!(status.success(), "building the stand-in LIKWID failed");
    let lib = target.join("release/liblikwid_standin.so");
    assert!(lib.is_file(), "{} was not built", lib.display());
    lib
}

/// A fresh copy of the stand-in under LIKWID's versioned name in a directory of its own:
/// each copy is loaded once and gets a LIKWID thread and state of its own.
fn standin_copy(lib: &Path, dir: &Path, case: &str) -> PathBuf {
    let dir = dir.join(case);
    std::fs::create_dir_all(&dir).unwrap();
    let copy = dir.join("liblikwid.so.5.2");
    std::fs::copy(lib, &copy).unwrap();
    copy
}

/// The `likwid` section of NHR@FAU's `fritz` configuration, with the bench's window and a
/// lock file in `dir` (absent, as on a node where no job measures).
fn fritz_config(dir: &Path, one_set: bool, keep_counting: bool) -> Value {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/ccmc-fau/fritz/collectors.json");
    let all: Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    let mut config = all["likwid"].clone();
    config["duration"] = json!(WINDOW_TEXT);
    config["lockfile_path"] = json!(dir.join("likwid.lock"));
    config["hostname"] = json!("f0101");
    if one_set {
        config["eventsets"].as_array_mut().unwrap().truncate(1);
        config.as_object_mut().unwrap().remove("globalmetrics");
    }
    if keep_counting {
        config["keep_counting"] = json!(true);
    }
    config
}

fn metric_specs(list: &Value) -> Vec<MetricSpec> {
    list.as_array()
        .map(|metrics| {
            metrics
                .iter()
                .map(|m| MetricSpec {
                    name: m["name"].as_str().unwrap().to_owned(),
                    calc: m["calc"].as_str().unwrap().to_owned(),
                    scope: m["type"].as_str().unwrap().to_owned(),
                })
                .collect()
        })
        .unwrap_or_default()
}

/// What the plugin sends the host in its `measure` call, from its configuration.
#[derive(Clone)]
struct Setup {
    sets: Vec<EventSetSpec>,
    globals: Vec<MetricSpec>,
    settings: Settings,
    /// The metrics the plugin sends (`publish`).
    published: Vec<String>,
}

impl Setup {
    fn of(config: &Value) -> Setup {
        let sets = config["eventsets"]
            .as_array()
            .unwrap()
            .iter()
            .map(|set| EventSetSpec {
                events: set["events"]
                    .as_object()
                    .unwrap()
                    .iter()
                    .map(|(counter, event)| (counter.clone(), event.as_str().unwrap().to_owned()))
                    .collect(),
                metrics: metric_specs(&set["metrics"]),
            })
            .collect();
        assert_eq!(config["access_mode"], "accessdaemon");
        let mut published = Vec::new();
        let sets_and_globals = config["eventsets"]
            .as_array()
            .unwrap()
            .iter()
            .map(|set| &set["metrics"])
            .chain([&config["globalmetrics"]]);
        for metrics in sets_and_globals {
            for m in metrics.as_array().into_iter().flatten() {
                if m["publish"].as_bool().unwrap_or(false) {
                    published.push(m["name"].as_str().unwrap().to_owned());
                }
            }
        }
        Setup {
            published,
            sets,
            globals: metric_specs(&config["globalmetrics"]),
            settings: Settings {
                access_mode: AccessMode::AccessDaemon,
                lockfile: Some(PathBuf::from(config["lockfile_path"].as_str().unwrap())),
                force: config["force_overwrite"].as_bool().unwrap_or(false),
                invalid_to_zero: config["invalid_to_zero"].as_bool().unwrap_or(false),
                duration: WINDOW,
                keep_counting: config["keep_counting"].as_bool().unwrap_or(false),
            },
        }
    }

    fn plan(&self) -> Plan {
        Plan::new(&self.sets, &self.globals).expect("fritz's setup is valid")
    }
}

/// The stand-in's node, as LIKWID's topology gives it to the host.
fn threads() -> Vec<Thread> {
    (0..recorded::SOCKETS * recorded::CORES_PER_SOCKET)
        .map(|cpu| Thread {
            cpu,
            socket: recorded::socket_of(cpu),
        })
        .collect()
}

/// 1 / the base clock, as the host takes it: the CPU's cpufreq files, else the library's
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

/// The counter values the stand-in reports for each event set of `plan`.
fn recorded_results(plan: &Plan, threads: &[Thread]) -> Vec<Option<SetResult>> {
    plan.sets
        .iter()
        .map(|set| {
            let events: Vec<(&str, &str)> = set
                .event_string
                .split(',')
                .map(|pair| pair.split_once(':').expect("EVENT:COUNTER"))
                .collect();
            let values = threads
                .iter()
                .map(|t| {
                    events
                        .iter()
                        .map(|(event, counter)| recorded::value(event, counter, t.cpu).unwrap())
                        .collect()
                })
                .collect();
            Some(SetResult {
                values,
                time: recorded::TIME,
            })
        })
        .collect()
}

/// The formulas alone: the plan checked and evaluated on recorded counters.
fn formulas(
    setup: &Setup,
    threads: &[Thread],
    results: &[Option<SetResult>],
    inverse_clock: f64,
) -> Vec<MetricValue> {
    setup.plan().evaluate(
        threads,
        results,
        inverse_clock,
        setup.settings.duration.as_secs_f64(),
        setup.settings.invalid_to_zero,
    )
}

/// The host's side of one `measure` call.
async fn host_round(library: &Path, setup: &Setup) -> Vec<MetricValue> {
    likwid::measure(library, setup.plan(), setup.settings.clone())
        .await
        .expect("the stand-in measures")
        .values
}

/// Empties the sink, as the agent's sink task would; returns the number of points.
fn drain(rx: &mut BatchReceiver) -> usize {
    let mut points = 0;
    while let Ok(batch) = rx.try_recv() {
        points += batch.points;
    }
    points
}

/// One configuration's plugin instance and host-side library.
struct Case {
    instance: Instance,
    rx: BatchReceiver,
    setup: Setup,
    /// The library copy the plugin's grant loads.
    plugin_library: PathBuf,
    /// The copy the native host calls load: its LIKWID thread is not the plugin's, so the
    /// kept counters of one do not meet the other's.
    host_library: PathBuf,
}

struct Fixture {
    tokio: tokio::runtime::Runtime,
    _runtime: Runtime,
    _dir: tempfile::TempDir,
    cases: Vec<(&'static str, Case)>,
    now: i64,
}

impl Fixture {
    fn new() -> Fixture {
        let tokio = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let runtime = Runtime::new(RuntimeOptions {
            cache_dir: None,
            ..RuntimeOptions::default()
        })
        .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let lib = standin();
        let mut cases = Vec::new();
        for (name, one_set, keep) in [
            ("fritz", false, false),
            ("one-set", true, false),
            ("one-set-keep-counting", true, true),
        ] {
            let config = fritz_config(dir.path(), one_set, keep);
            let plugin_library = standin_copy(&lib, dir.path(), &format!("{name}-plugin"));
            let host_library = standin_copy(&lib, dir.path(), &format!("{name}-host"));
            let mut spec = PluginSpec::new(guests::component("likwid"));
            spec.config = config.clone();
            spec.capabilities.likwid = true;
            spec.capabilities.likwid_library = Some(plugin_library.clone());
            spec.validate().expect("a valid specification");
            let loaded = runtime.load_blocking(&spec).unwrap();
            let (sink, rx) = sink::channel(1024);
            let instance = tokio
                .block_on(loaded.instantiate(&runtime, &spec, sink))
                .unwrap();
            cases.push((
                name,
                Case {
                    instance,
                    rx,
                    setup: Setup::of(&config),
                    plugin_library,
                    host_library,
                },
            ));
        }
        let mut fixture = Fixture {
            tokio,
            _runtime: runtime,
            _dir: dir,
            cases,
            now: 1_700_000_000_000_000_000,
        };
        fixture.check();
        fixture
    }

    /// Two rounds of each, so the kept counters run: the plugin emits a point per value of
    /// the host's round, and the host's round is what the formulas alone give.
    fn check(&mut self) {
        let threads = threads();
        for (name, case) in &mut self.cases {
            let results = recorded_results(&case.setup.plan(), &threads);
            let expected = formulas(&case.setup, &threads, &results, inverse_clock());
            let published = expected
                .iter()
                .filter(|v| case.setup.published.contains(&v.name))
                .count();
            assert!(published > 0, "{name}: published values");
            for _round in 0..2 {
                self.now += 1_000_000_000;
                let outcome = self.tokio.block_on(case.instance.collect(self.now));
                assert_eq!(outcome, Ok(Ok(())), "{name}: collect");
                assert_eq!(drain(&mut case.rx), published, "{name}: points");
                let host = self
                    .tokio
                    .block_on(host_round(&case.host_library, &case.setup));
                assert_eq!(host, expected, "{name}: the host's round");
            }
            assert_ne!(case.plugin_library, case.host_library);
        }
    }
}

fn bench_cases<M: Measurement>(group: &mut BenchmarkGroup<'_, M>, fixture: &mut Fixture) {
    let threads = threads();
    let Fixture {
        tokio, cases, now, ..
    } = fixture;
    for (name, case) in cases.iter_mut() {
        group.bench_function(format!("{name}/component"), |b| {
            b.iter(|| {
                *now += 1_000_000_000;
                let outcome = tokio.block_on(case.instance.collect(*now));
                (outcome, drain(&mut case.rx))
            })
        });
        let (library, setup) = (&case.host_library, &case.setup);
        group.bench_function(format!("{name}/host"), |b| {
            b.iter(|| tokio.block_on(host_round(library, setup)))
        });
        if *name == "fritz" {
            let results = recorded_results(&setup.plan(), &threads);
            let inverse = inverse_clock();
            group.bench_function(format!("{name}/formulas"), |b| {
                b.iter(|| formulas(setup, &threads, &results, inverse))
            });
            let sets = setup.sets.len();
            group.bench_function(format!("{name}/window"), |b| {
                b.iter(|| {
                    for _ in 0..sets {
                        std::thread::sleep(WINDOW);
                    }
                })
            });
        }
    }
}

fn configure<M: Measurement>(group: &mut BenchmarkGroup<'_, M>) {
    group.sample_size(30);
    group.warm_up_time(Duration::from_millis(500));
    group.measurement_time(Duration::from_secs(3));
}

fn bench_wall(c: &mut Criterion) {
    let mut fixture = Fixture::new();
    let mut group = c.benchmark_group("likwid-wall");
    configure(&mut group);
    bench_cases(&mut group, &mut fixture);
    group.finish();
}

fn bench_cpu(c: &mut Criterion<ProcessCpu>) {
    let mut fixture = Fixture::new();
    let mut group = c.benchmark_group("likwid-cpu");
    configure(&mut group);
    bench_cases(&mut group, &mut fixture);
    group.finish();
}

criterion_group!(wall, bench_wall);
criterion_group! {
    name = cpu;
    config = Criterion::default().with_measurement(ProcessCpu);
    targets = bench_cpu
}
criterion_main!(wall, cpu);
