//! Collector cost: one `collect` call of each collector plugin through the plugin host
//! (component, `cc:fleet/files`, emit into a sink channel) against the same collector code
//! run natively on the same fixture, once reading with `std::fs` and once through the host's
//! own file checks (`FileGrants`, what the component's reads go through).
//!
//! Both sides do the whole job: the native runs, like the component's call, end with the
//! round's points encoded as line protocol (tags sorted, the call's time stamp), and before
//! measuring, the bench checks that the native code and the component produce the very same
//! bytes for the same round.
//!
//! Both sides allocate with mimalloc, as the `ccfleet` binary does.
//!
//! The group `emit-check` compares, on 90 lines of what `cpustat` emits for a round,
//! the host's check of an `emit-lines` batch with decoding the same lines reading every
//! token (what the codec bench measures), per point.
//!
//! Run with `cargo bench -p ccfleet-host --bench collectors`; the plugins are built from
//! guest/ first, as in the tests. The fixtures are those of `tests/collectors.rs`; for the
//! collectors that report deltas, the round's file is swapped between calls (outside the
//! measurement) so every call sees counters that moved.

#[path = "../tests/support/guests.rs"]
mod guests;

/// The allocator of the `ccfleet` binary, so both sides allocate as the agent does.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::path::{Path, PathBuf};
use std::time::Duration;

use ccfleet::lineproto::{BatchLimits, Decoder, Encoder, FieldRef, FieldValue, check_batch};
use ccfleet_collectors::{
    Collector, Common, Files, FsStats, Runner, Sample, Value, cpufreq, cpustat, diskstat, iostat,
    loadavg, memstat, netstat, numastats, tempstat,
};
use ccfleet_host::plugin::Instance;
use ccfleet_host::plugin::files::FileGrants;
use ccfleet_host::sink::{self, BatchReceiver};
use ccfleet_host::{PluginSpec, Runtime, RuntimeOptions};
use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use serde_json::json;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/collectors")
}

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

/// Natively, straight from a directory.
struct DirFiles(PathBuf);

impl DirFiles {
    fn path(&self, path: &str) -> PathBuf {
        self.0.join(path.trim_start_matches('/'))
    }
}

fn statvfs_of(path: &Path) -> Result<FsStats, String> {
    let c = std::ffi::CString::new(path.to_str().ok_or("not UTF-8")?).map_err(|e| e.to_string())?;
    let mut s = std::mem::MaybeUninit::<libc::statvfs>::zeroed();
    // SAFETY: a valid C string and writable memory of the type statvfs fills.
    if unsafe { libc::statvfs(c.as_ptr(), s.as_mut_ptr()) } != 0 {
        return Err(std::io::Error::last_os_error().to_string());
    }
    // SAFETY: statvfs succeeded.
    let s = unsafe { s.assume_init() };
    Ok(FsStats {
        block_size: if s.f_frsize != 0 {
            s.f_frsize
        } else {
            s.f_bsize
        },
        blocks: s.f_blocks,
        blocks_free: s.f_bfree,
        blocks_available: s.f_bavail,
    })
}

impl Files for DirFiles {
    fn read(&mut self, path: &str) -> Result<String, String> {
        std::fs::read_to_string(self.path(path)).map_err(|e| e.to_string())
    }
    fn list_dir(&mut self, path: &str) -> Result<Vec<String>, String> {
        let mut names: Vec<String> = std::fs::read_dir(self.path(path))
            .map_err(|e| e.to_string())?
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        Ok(names)
    }
    fn statvfs(&mut self, path: &str) -> Result<FsStats, String> {
        statvfs_of(&self.path(path))
    }
}

/// Natively, through the checks the host applies to a plugin's reads.
struct GrantedFiles(FileGrants);

impl GrantedFiles {
    /// A round, as a plugin call is one: the secrets are looked up again at its first read.
    fn round(&mut self) -> &mut Self {
        self.0.begin_call();
        self
    }
}

impl Files for GrantedFiles {
    fn read(&mut self, path: &str) -> Result<String, String> {
        String::from_utf8(self.0.read(path)?).map_err(|e| e.to_string())
    }
    fn list_dir(&mut self, path: &str) -> Result<Vec<String>, String> {
        self.0.list(path)
    }
    fn statvfs(&mut self, path: &str) -> Result<FsStats, String> {
        let s = self.0.statvfs(path)?;
        Ok(FsStats {
            block_size: s.block_size,
            blocks: s.blocks,
            blocks_free: s.blocks_free,
            blocks_available: s.blocks_available,
        })
    }
}

/// One collector's bench set-up.
struct Case {
    name: &'static str,
    config: serde_json::Value,
    grants: &'static [&'static str],
    /// The file swapped between rounds, for collectors reporting deltas.
    swapped: Option<&'static str>,
    native: fn() -> Box<dyn Collector>,
}

fn cases() -> Vec<Case> {
    vec![
        Case {
            name: "cpustat",
            config: json!({}),
            grants: &["/proc/stat"],
            swapped: Some("proc/stat"),
            native: || Box::new(cpustat::Cpustat::new()),
        },
        Case {
            name: "memstat",
            config: json!({"numa_stats": true}),
            grants: &["/proc/meminfo", "/sys/devices/system/node/node*/meminfo"],
            swapped: None,
            native: || {
                Box::new(memstat::Memstat::new(memstat::Config {
                    numa_stats: true,
                    ..Default::default()
                }))
            },
        },
        Case {
            name: "loadavg",
            config: json!({}),
            grants: &["/proc/loadavg"],
            swapped: None,
            native: || Box::new(loadavg::Loadavg),
        },
        Case {
            name: "netstat",
            config: json!({}),
            grants: &["/proc/net/dev"],
            swapped: Some("proc/net/dev"),
            native: || Box::new(netstat::Netstat::new(Default::default())),
        },
        Case {
            name: "iostat",
            config: json!({}),
            grants: &["/proc/diskstats"],
            swapped: Some("proc/diskstats"),
            native: || Box::new(iostat::Iostat::new(Default::default())),
        },
        Case {
            name: "diskstat",
            config: json!({}),
            grants: &["/"],
            swapped: None,
            native: || Box::new(diskstat::Diskstat::new(Default::default())),
        },
        Case {
            name: "numastats",
            config: json!({}),
            grants: &["/sys/devices/system/node/node*/numastat"],
            swapped: Some("sys/devices/system/node/node0/numastat"),
            native: || Box::new(numastats::Numastats::new(Default::default())),
        },
        Case {
            name: "cpufreq",
            config: json!({}),
            grants: &[
                "/sys/devices/system/cpu/cpu*/cpufreq/scaling_cur_freq",
                "/sys/devices/system/cpu/cpu*/topology/physical_package_id",
            ],
            swapped: None,
            native: || Box::new(cpufreq::Cpufreq),
        },
        Case {
            name: "tempstat",
            config: json!({}),
            grants: &["/sys/class/hwmon/**"],
            swapped: None,
            native: || Box::new(tempstat::Tempstat::new(Default::default())),
        },
    ]
}

/// Dispatch through a box, as the plugin's code is reached through its export.
struct Boxed(Box<dyn Collector>);

impl Collector for Boxed {
    fn name(&self) -> &'static str {
        self.0.name()
    }
    fn collect(
        &mut self,
        files: &mut dyn Files,
        now_ns: i64,
        out: &mut Vec<ccfleet_collectors::Sample>,
    ) -> Result<(), String> {
        self.0.collect(files, now_ns, out)
    }
}

/// Alternates a file between the two recorded rounds.
///
/// Both versions are copied once beside the fixture root, and each swap renames a fresh hard
/// link of one over the file: no data is written or freed between calls. (Copying the file
/// over itself on a disk file system had the write-back and discard of the previous copy
/// interrupt the measured calls that followed: tens of µs of noise in the collectors whose
/// file is swapped. The real `/proc` and `/sys` are in memory.)
struct Swapper {
    root: PathBuf,
    file: Option<&'static str>,
    round: u8,
    stash: tempfile::TempDir,
}

impl Swapper {
    fn new(root: &Path, file: Option<&'static str>) -> Swapper {
        let stash = tempfile::tempdir().unwrap();
        if let Some(file) = file {
            for round in [1, 2] {
                let from = fixtures().join(format!("round{round}")).join(file);
                std::fs::copy(from, stash.path().join(format!("round{round}"))).unwrap();
            }
        }
        Swapper {
            root: root.to_path_buf(),
            file,
            round: 1,
            stash,
        }
    }

    fn next(&mut self) {
        if let Some(file) = self.file {
            self.round = 3 - self.round;
            let version = self.stash.path().join(format!("round{}", self.round));
            let link = self.stash.path().join("next");
            let _ = std::fs::remove_file(&link);
            std::fs::hard_link(version, &link).unwrap();
            std::fs::rename(&link, self.root.join(file)).unwrap();
        }
    }
}

/// Empties the sink, as the agent's sink task would; returns the number of points.
fn drain(rx: &mut BatchReceiver) -> usize {
    let mut points = 0;
    while let Ok(batch) = rx.try_recv() {
        points += batch.points;
    }
    points
}

/// Empties the sink, returning the lines.
fn drain_lines(rx: &mut BatchReceiver) -> Vec<u8> {
    let mut lines = Vec::new();
    while let Ok(batch) = rx.try_recv() {
        lines.extend_from_slice(&batch.lines);
    }
    lines
}

/// A native collector and what the host does with a plugin's points: one round's samples,
/// encoded as line protocol the way the host encodes an emitted batch.
struct Native<C> {
    runner: Runner<C>,
    encoder: Encoder,
    order: Vec<usize>,
}

impl<C: Collector> Native<C> {
    fn new(common: Common, collector: C) -> Self {
        Native {
            runner: Runner::new(common, collector),
            encoder: Encoder::new(),
            order: Vec::new(),
        }
    }

    fn collect(&mut self, files: &mut dyn Files, now_ns: i64) -> Vec<u8> {
        let samples = self.runner.collect(files, now_ns).unwrap();
        self.encoder.clear();
        for sample in &samples {
            self.encode(sample, now_ns);
        }
        self.encoder.take()
    }

    fn encode(&mut self, sample: &Sample, now_ns: i64) {
        let enc = &mut self.encoder;
        enc.start_line(&sample.name).unwrap();
        let tags = &sample.tags;
        self.order.clear();
        self.order.extend(0..tags.len());
        self.order.sort_by(|&a, &b| tags[a].0.cmp(&tags[b].0));
        for &i in &self.order {
            enc.add_tag(&tags[i].0, &tags[i].1).unwrap();
        }
        let value = match &sample.value {
            Value::Float(v) => FieldRef::Float(*v),
            Value::Int(v) => FieldRef::Int(*v),
            Value::Uint(v) => FieldRef::Uint(*v),
            Value::Str(v) => FieldRef::Str(v),
        };
        enc.add_field("value", value).unwrap();
        enc.end_line(Some(now_ns)).unwrap();
    }
}

fn bench_collectors(c: &mut Criterion) {
    let tokio = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let runtime = Runtime::new(RuntimeOptions {
        cache_dir: None,
        ..RuntimeOptions::default()
    })
    .unwrap();
    let mut group = c.benchmark_group("collect");
    let mut cpustat_lines = Vec::new();
    group.sample_size(30);
    group.warm_up_time(Duration::from_millis(500));
    group.measurement_time(Duration::from_secs(3));
    for case in cases() {
        let root = tempfile::tempdir().unwrap();
        copy_tree(&fixtures().join("round1"), root.path());
        let common = Common {
            hostname: Some("bench".to_owned()),
            ..Common::default()
        };

        let mut spec = PluginSpec::new(guests::component(case.name));
        let mut config = case.config.clone();
        config["hostname"] = json!("bench");
        spec.config = config;
        spec.capabilities.read_files = case.grants.iter().map(|g| (*g).to_owned()).collect();
        spec.capabilities.files_root = Some(root.path().to_path_buf());
        let loaded = runtime.load_blocking(&spec).unwrap();
        let (sink, mut rx) = sink::channel(1024);
        let mut instance: Instance = tokio
            .block_on(loaded.instantiate(&runtime, &spec, sink))
            .unwrap();
        let mut swap = Swapper::new(root.path(), case.swapped);
        let mut native = Native::new(common.clone(), Boxed((case.native)()));
        let mut files = DirFiles(root.path().to_path_buf());
        let mut checked = Native::new(common, Boxed((case.native)()));
        let patterns: Vec<String> = case.grants.iter().map(|g| (*g).to_owned()).collect();
        let mut granted =
            GrantedFiles(FileGrants::new(&patterns, Some(root.path()), 4 << 20).unwrap());

        let mut now = 1_700_000_000_000_000_000i64;
        // Two rounds first, the fixture's first and then its second, so rates exist; in the
        // second, all three must send the same lines, and something.
        for round in 0..2 {
            if round == 1 {
                swap.next();
            }
            now += 10_000_000_000;
            assert_eq!(tokio.block_on(instance.collect(now)), Ok(Ok(())));
            let component = drain_lines(&mut rx);
            let direct = native.collect(&mut files, now);
            let through_grants = checked.collect(granted.round(), now);
            if round == 1 {
                assert!(!component.is_empty(), "{} emits", case.name);
                assert_eq!(
                    String::from_utf8_lossy(&direct),
                    String::from_utf8_lossy(&component),
                    "{}: the native code and the component send different lines",
                    case.name
                );
                assert_eq!(direct, through_grants);
                if case.name == "cpustat" {
                    cpustat_lines = component.clone();
                }
            }
        }
        group.bench_function(format!("{}/component", case.name), |b| {
            b.iter_batched(
                || swap.next(),
                |()| {
                    now += 10_000_000_000;
                    let outcome = tokio.block_on(instance.collect(now));
                    (outcome, drain(&mut rx))
                },
                BatchSize::PerIteration,
            )
        });
        group.bench_function(format!("{}/native", case.name), |b| {
            b.iter_batched(
                || swap.next(),
                |()| {
                    now += 10_000_000_000;
                    native.collect(&mut files, now)
                },
                BatchSize::PerIteration,
            )
        });
        group.bench_function(format!("{}/native-checked-files", case.name), |b| {
            b.iter_batched(
                || swap.next(),
                |()| {
                    now += 10_000_000_000;
                    checked.collect(granted.round(), now)
                },
                BatchSize::PerIteration,
            )
        });
    }
    group.finish();
    bench_emit_check(c, &cpustat_lines);
}

/// Reads every token of every line, as the codec bench's decode does.
fn decode_reading_every_token(text: &[u8]) -> usize {
    let mut scratch = String::new();
    let mut sum = 0;
    for line in Decoder::new(text) {
        let line = line.expect("valid input");
        sum += line.measurement().unescape_with(&mut scratch).len();
        for (k, v) in line.tags() {
            sum += k.unescape_with(&mut scratch).len() + v.unescape_with(&mut scratch).len();
        }
        for (k, v) in line.fields() {
            sum += k.unescape_with(&mut scratch).len();
            sum += match v {
                FieldValue::String(s) => s.unescape_with(&mut scratch).len(),
                FieldValue::Float(f) => f as usize,
                FieldValue::Int(i) => i as usize,
                FieldValue::Uint(u) => u as usize,
                FieldValue::Bool(b) => b as usize,
            };
        }
        sum += line.time().unwrap_or_default() as usize;
    }
    sum
}

/// Points in the batch the emit check is measured on, about `cpustat`'s round on a node of
/// seven hwthreads.
const EMIT_POINTS: usize = 90;

/// `round` is `cpustat`'s round on the fixture (two hwthreads and the node: 34 points); its
/// lines are repeated up to [`EMIT_POINTS`].
fn bench_emit_check(c: &mut Criterion, round: &[u8]) {
    let round_lines: Vec<&[u8]> = round.split_inclusive(|&b| b == b'\n').collect();
    assert_eq!(round_lines.len(), 34, "cpustat's round on the fixture");
    let lines: Vec<u8> = round_lines
        .iter()
        .cycle()
        .take(EMIT_POINTS)
        .flat_map(|line| line.iter().copied())
        .collect();
    let lines = &lines[..];
    let points = Decoder::new(lines).count();
    assert_eq!(points, EMIT_POINTS);
    let mut group = c.benchmark_group("emit-check");
    group.throughput(criterion::Throughput::Elements(points as u64));
    let limits = BatchLimits::default();
    group.bench_function("cpustat/check", |b| {
        b.iter(|| {
            let mut out = Vec::new();
            let checked = check_batch(lines, &limits, &mut || 0, &mut out);
            (checked, out)
        })
    });
    group.bench_function("cpustat/decode-every-token", |b| {
        b.iter(|| decode_reading_every_token(lines))
    });
    group.finish();
}

criterion_group!(benches, bench_collectors);
criterion_main!(benches);
