//! The command collector plugins (`ipmistat`, `customcmd`, `topprocs`, `lustrestat`, `gpfs`,
//! `smartmon`, `beegfs_meta`, `beegfs_storage`) through the plugin host, running granted
//! commands.
//!
//! The tools are played by `fixtures/commands/replay.sh`, which prints an output written by
//! hand in the tool's documented format (`fixtures/commands/*.txt`, `.csv`, `.lp`, `.json`; the first
//! `mmpmon` records are the example of IBM's documentation) from a file this test
//! rewrites between rounds, or fails as a tool that cannot reach its device when a `.fail`
//! file sits beside it. Each test calls `collect` on the real component with chosen
//! timestamps, decodes the line protocol it emitted and compares every point (name, tags
//! including `unit`, value) with what this file computes from the same recorded output by its
//! own parsing. Failing, garbled and cut output must fail that round with a clear message
//! (not a trap), and the next round must recover.

#[path = "support/guests.rs"]
mod guests;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use ccfleet::lineproto::{Decoder, FieldValue as LpValue};
use ccfleet_host::plugin::Instance;
use ccfleet_host::plugin::commands::RunGrant;
use ccfleet_host::sink::{self, BatchReceiver};
use ccfleet_host::{PluginSpec, Runtime, RuntimeOptions};
use serde_json::json;

const T1: i64 = 1_700_000_000_000_000_000;
const T2: i64 = T1 + 5_000_000_000;
const T3: i64 = T2 + 10_000_000_000;
const T4: i64 = T3 + 10_000_000_000;

const HOST: &str = "cmd-node";

#[derive(Debug, Clone, PartialEq)]
enum V {
    F(f64),
    I(i64),
    U(u64),
    S(String),
}

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
    all.insert("hostname".to_owned(), HOST.to_owned());
    Got {
        name: name.to_owned(),
        tags: all,
        value,
    }
}

fn recorded(name: &str) -> String {
    std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/commands")
            .join(name),
    )
    .unwrap()
}

fn set_mode(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// One command collector plugin; each grant replays the file `<dir>/<grant>.out`.
struct Run {
    _runtime: Runtime,
    dir: tempfile::TempDir,
    instance: Instance,
    rx: BatchReceiver,
}

impl Run {
    /// Starts `component` with `config` (plus `hostname`), granting `grants` (each replaying
    /// its output file, which `outputs` fills first) and `read_files` under the test's root.
    async fn start(
        component: &str,
        config: serde_json::Value,
        grants: &[&str],
        outputs: &[(&str, &str)],
        read_files: &[&str],
    ) -> Result<Run, String> {
        Run::launch(component, config, grants, outputs, read_files, false).await
    }

    /// [`Run::start`], with `capabilities.mount-info` when `mount_info` says so (the mount
    /// table is then the root's `proc/self/mounts`, see [`Run::file`]).
    async fn launch(
        component: &str,
        mut config: serde_json::Value,
        grants: &[&str],
        outputs: &[(&str, &str)],
        read_files: &[&str],
        mount_info: bool,
    ) -> Result<Run, String> {
        let dir = tempfile::tempdir().unwrap();
        set_mode(dir.path(), 0o755);
        let replay = dir.path().join("replay.sh");
        std::fs::write(&replay, recorded("replay.sh")).unwrap();
        set_mode(&replay, 0o755);
        config["hostname"] = json!(HOST);
        let runtime = Runtime::new(RuntimeOptions {
            cache_dir: None,
            ..RuntimeOptions::default()
        })
        .unwrap();
        let mut spec = PluginSpec::new(guests::component(component));
        spec.config = config;
        for grant in grants {
            let out = dir.path().join(format!("{grant}.out"));
            spec.capabilities.run.insert(
                (*grant).to_owned(),
                RunGrant {
                    args: vec![out.to_str().unwrap().to_owned()],
                    ..RunGrant::new(replay.clone())
                },
            );
        }
        spec.capabilities.read_files = read_files.iter().map(|f| (*f).to_owned()).collect();
        spec.capabilities.files_root = Some(dir.path().to_path_buf());
        spec.capabilities.mount_info = mount_info;
        let (sink, rx) = sink::channel(16);
        let run_dir = dir.path().to_path_buf();
        for (grant, text) in outputs {
            std::fs::write(run_dir.join(format!("{grant}.out")), text).unwrap();
        }
        let loaded = runtime.load(&spec).await.expect("loads");
        let instance = loaded
            .instantiate(&runtime, &spec, sink)
            .await
            .map_err(|e| e.to_string())?;
        Ok(Run {
            _runtime: runtime,
            dir,
            instance,
            rx,
        })
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// What the grant prints from now on.
    fn output(&self, grant: &str, text: &str) {
        std::fs::write(self.path(&format!("{grant}.out")), text).unwrap();
    }

    /// Makes the grant fail (status 1, `stderr` on standard error), or work again.
    fn failing(&self, grant: &str, stderr: Option<&str>) {
        let fail = self.path(&format!("{grant}.out.fail"));
        match stderr {
            Some(text) => std::fs::write(fail, text).unwrap(),
            None => std::fs::remove_file(fail).unwrap(),
        }
    }

    /// Makes the grant print its output and exit with `status`, or with 0 again.
    fn status(&self, grant: &str, status: Option<i32>) {
        let path = self.path(&format!("{grant}.out.status"));
        match status {
            Some(code) => std::fs::write(path, code.to_string()).unwrap(),
            None => std::fs::remove_file(path).unwrap(),
        }
    }

    /// Writes a file the plugin reads through the file access (under the root).
    fn file(&self, path: &str, text: &str) {
        let path = self.dir.path().join(path.trim_start_matches('/'));
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }

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
                    LpValue::String(v) => V::S(v.unescape().into_owned()),
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

    /// Calls `collect`, which must fail with the plugin's error (not trap): its message.
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
        let same = match (&g.value, &e.value) {
            (V::F(a), V::F(b)) => (a - b).abs() <= 1e-9 * b.abs().max(1.0),
            (a, b) => a == b,
        };
        assert!(
            same,
            "{} {:?}: got {:?}, expected {:?}",
            g.name, g.tags, g.value, e.value
        );
    }
}

fn assert_contains(message: &str, needles: &[&str]) {
    for needle in needles {
        assert!(message.contains(needle), "{needle:?} not in {message:?}");
    }
}

/// Half of `text`, cut inside a line.
fn cut(text: &str) -> String {
    let mut at = text.len() / 2;
    while text.as_bytes()[at] == b'\n' || text.as_bytes()[at - 1] == b'\n' {
        at += 1;
    }
    text[..at].to_owned()
}

// ---------------------------------------------------------------------------------------
// ipmistat

/// Points of `ipmitool sensor` output, by this test's reading of its table.
fn ipmitool_points(text: &str, only: &[&str]) -> Vec<Got> {
    let mut out = Vec::new();
    for line in text.lines() {
        let cols: Vec<&str> = line.split('|').map(str::trim).collect();
        let (sensor, reading, unit) = (cols[0], cols[1], cols[2]);
        if reading == "na" || unit == "discrete" {
            continue;
        }
        let name = sensor.to_lowercase().replace(' ', "_");
        if !only.is_empty() && !only.contains(&name.as_str()) {
            continue;
        }
        let unit = match unit {
            "degrees C" => "degC",
            "degrees F" => "degF",
            u => u,
        };
        out.push(point(
            &name,
            &[("type", "node"), ("unit", unit)],
            V::F(reading.parse().unwrap()),
        ));
    }
    out
}

/// Points of `ipmi-sensors --comma-separated-output`.
fn ipmi_sensors_points(text: &str) -> Vec<Got> {
    let mut out = Vec::new();
    for line in text.lines().skip(1) {
        let cols: Vec<&str> = line.split(',').collect();
        if cols[3] == "N/A" {
            continue;
        }
        out.push(point(
            &cols[1].to_lowercase().replace(' ', "_"),
            &[("type", "node"), ("unit", cols[4])],
            V::F(cols[3].parse().unwrap()),
        ));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ipmistat_prefers_ipmi_sensors_and_recovers_after_failed_garbled_and_cut_output() {
    let csv = recorded("ipmi-sensors.csv");
    let mut run = Run::start(
        "ipmistat",
        json!({}),
        &["ipmi-sensors", "ipmitool-sensor"],
        &[
            ("ipmi-sensors", csv.as_str()),
            ("ipmitool-sensor", &recorded("ipmitool-sensor.txt")),
        ],
        &[],
    )
    .await
    .unwrap();
    let expected = ipmi_sensors_points(&csv);
    assert_eq!(expected.len(), 6, "the recording's sensors with readings");
    assert_points(run.collect(T1).await, expected.clone());

    // The tool fails: the round names the grant, the status and the tool's message.
    run.failing(
        "ipmi-sensors",
        Some("ipmi_ctx_open_inband: driver timeout\n"),
    );
    let message = run.collect_fails(T2).await;
    assert_contains(
        &message,
        &[
            "ipmistat",
            "command ipmi-sensors exited with status 1",
            "driver timeout",
        ],
    );
    run.failing("ipmi-sensors", None);
    assert_points(run.collect(T3).await, expected.clone());

    // Garbage instead of the table, then the table cut inside a line.
    run.output("ipmi-sensors", "Segmentation fault (core dumped)\n");
    let message = run.collect_fails(T3 + 1).await;
    assert_contains(
        &message,
        &["not an ipmi-sensors line", "Segmentation fault"],
    );
    run.output("ipmi-sensors", &cut(&csv));
    let message = run.collect_fails(T3 + 2).await;
    assert_contains(&message, &["command ipmi-sensors"]);
    run.output("ipmi-sensors", &csv);
    assert_points(run.collect(T4).await, expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ipmistat_falls_back_to_ipmitool_and_keeps_only_included_sensors() {
    let table = recorded("ipmitool-sensor.txt");
    let only = ["cpu_temp", "inlet_temp", "fan1", "pw_consumption", "vbat"];
    let mut run = Run::start(
        "ipmistat",
        json!({"include_metrics": ["CPU_Temp", "inlet_temp", "fan1", "pw_consumption", "vbat"]}),
        &["ipmitool-sensor"],
        &[("ipmitool-sensor", &table)],
        &[],
    )
    .await
    .unwrap();
    let expected = ipmitool_points(&table, &only);
    assert_eq!(expected.len(), only.len());
    assert_points(run.collect(T1).await, expected.clone());
    // A reading that is not a number fails the round, quoting it.
    run.output(
        "ipmitool-sensor",
        &table.replace("| 36.000     |", "| hot        |"),
    );
    let message = run.collect_fails(T2).await;
    assert_contains(
        &message,
        &["command ipmitool-sensor", "\"hot\" is not a number"],
    );
    run.output("ipmitool-sensor", &table);
    assert_points(run.collect(T3).await, expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ipmistat_without_a_granted_tool_fails_each_round_clearly() {
    let mut run = Run::start("ipmistat", json!({}), &[], &[], &[])
        .await
        .unwrap();
    let message = run.collect_fails(T1).await;
    assert_contains(
        &message,
        &[
            "no IPMI tool worked",
            "command ipmi-sensors",
            "command ipmitool-sensor",
            "not granted",
        ],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn command_settings_that_name_executables_are_refused_at_init() {
    for (component, config, needle) in [
        (
            "ipmistat",
            json!({"ipmitool_path": "/usr/bin/ipmitool"}),
            "`ipmitool_path` is not supported",
        ),
        (
            "ipmistat",
            json!({"use_sudo": true}),
            "`use_sudo` is not supported",
        ),
        (
            "lustrestat",
            json!({"lctl_command": "/usr/sbin/lctl", "send_abs_values": true}),
            "names a grant",
        ),
        ("lustrestat", json!({}), "no metrics to collect"),
        (
            "gpfs",
            json!({"mmpmon_path": "/usr/lpp/mmfs/bin/mmpmon"}),
            "not supported",
        ),
        ("gpfs", json!({}), "no metrics to collect"),
        (
            "customcmd",
            json!({"commands": ["/usr/local/bin/getmetrics.pl"]}),
            "not command lines",
        ),
        ("customcmd", json!({}), "nothing to collect"),
        (
            "topprocs",
            json!({"num_procs": 11}),
            "`num_procs` must be 1 to 10",
        ),
    ] {
        let err = match Run::start(component, config, &[], &[], &[]).await {
            Ok(_) => panic!("{component}: init must fail ({needle})"),
            Err(e) => e,
        };
        assert_contains(&err, &[needle]);
    }
}

// ---------------------------------------------------------------------------------------
// topprocs

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topprocs_sends_the_top_commands_as_strings() {
    let ps = recorded("ps-pcpu.txt");
    let mut run = Run::start(
        "topprocs",
        json!({"num_procs": 5}),
        &["ps-top"],
        &[("ps-top", &ps)],
        &[],
    )
    .await
    .unwrap();
    let expected: Vec<Got> = ps
        .lines()
        .skip(1)
        .take(5)
        .enumerate()
        .map(|(i, comm)| {
            point(
                &format!("topproc{}", i + 1),
                &[("type", "node")],
                V::S(comm.to_owned()),
            )
        })
        .collect();
    assert_points(run.collect(T1).await, expected.clone());
    // Fewer processes than asked for: fewer points.
    run.output("ps-top", "COMMAND\ninit\n");
    assert_points(
        run.collect(T2).await,
        vec![point("topproc1", &[("type", "node")], V::S("init".into()))],
    );
    run.output("ps-top", "error: unknown sort specifier\n");
    let message = run.collect_fails(T3).await;
    assert_contains(&message, &["command ps-top", "COMMAND header"]);
    run.output("ps-top", &ps);
    assert_points(run.collect(T4).await, expected);
}

/// `ps` itself, when the machine has it at a standard path: the points must be there with
/// process names (what they are depends on the moment).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topprocs_over_the_real_ps() {
    let Some(ps) = ["/usr/bin/ps", "/bin/ps"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
    else {
        println!("skipped: no ps at /usr/bin/ps or /bin/ps");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let runtime = Runtime::new(RuntimeOptions {
        cache_dir: None,
        ..RuntimeOptions::default()
    })
    .unwrap();
    let mut spec = PluginSpec::new(guests::component("topprocs"));
    spec.config = json!({"hostname": HOST, "num_procs": 2});
    spec.capabilities.run.insert(
        "ps-top".to_owned(),
        RunGrant {
            args: vec!["-Ao".into(), "comm".into(), "--sort=-pcpu".into()],
            ..RunGrant::new(ps)
        },
    );
    spec.capabilities.files_root = Some(dir.path().to_path_buf());
    let loaded = runtime.load(&spec).await.expect("loads");
    let (sink, rx) = sink::channel(16);
    let instance = loaded
        .instantiate(&runtime, &spec, sink)
        .await
        .expect("instantiates");
    let mut run = Run {
        _runtime: runtime,
        dir,
        instance,
        rx,
    };
    let got = run.collect(T1).await;
    // This test's own process and ps itself exist, so there are at least two.
    assert_eq!(got.len(), 2, "{got:?}");
    for (i, p) in got.iter().enumerate() {
        assert_eq!(p.name, format!("topproc{}", i + 1));
        assert!(matches!(&p.value, V::S(s) if !s.trim().is_empty()), "{p:?}");
    }
}

// ---------------------------------------------------------------------------------------
// lustrestat

const LUSTRE_COUNTERS: [(&str, &str, bool, &str); 10] = [
    ("read_requests", "read_bytes", false, "requests"),
    ("write_requests", "write_bytes", false, "requests"),
    ("read_bytes", "read_bytes", true, "bytes"),
    ("write_bytes", "write_bytes", true, "bytes"),
    ("open", "open", false, ""),
    ("close", "close", false, ""),
    ("setattr", "setattr", false, ""),
    ("getattr", "getattr", false, ""),
    ("statfs", "statfs", false, ""),
    ("inode_permission", "inode_permission", false, ""),
];

/// `device -> lustre counter name -> value` of `lctl get_param llite.*.stats` output.
fn lustre_table(text: &str) -> BTreeMap<String, BTreeMap<&'static str, i64>> {
    let mut table = BTreeMap::new();
    let mut device = String::new();
    let mut rows: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut flush = |device: &str, rows: &mut BTreeMap<String, Vec<String>>| {
        if device.is_empty() {
            return;
        }
        let mut values = BTreeMap::new();
        for (name, stat, sum, _) in LUSTRE_COUNTERS {
            let value = rows
                .get(stat)
                .map(|f| f[if sum { 5 } else { 0 }].parse().unwrap())
                .unwrap_or(0);
            values.insert(name, value);
        }
        table.insert(device.to_owned(), values);
        rows.clear();
    };
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("llite.") {
            flush(&device, &mut rows);
            device = rest.trim_end_matches(".stats=").to_owned();
        } else {
            let mut f = line.split_whitespace();
            let name = f.next().unwrap().to_owned();
            rows.insert(name, f.map(str::to_owned).collect());
        }
    }
    flush(&device, &mut rows);
    table
}

fn with_unit<'a>(tags: &[(&'a str, &'a str)], unit: &'a str) -> Vec<(&'a str, &'a str)> {
    let mut tags = tags.to_vec();
    if !unit.is_empty() {
        tags.push(("unit", unit));
    }
    tags
}

/// The points of a lustrestat round, given the previous round's table.
fn lustre_points(
    new: &BTreeMap<String, BTreeMap<&str, i64>>,
    old: Option<&BTreeMap<String, BTreeMap<&str, i64>>>,
    seconds: f64,
) -> Vec<Got> {
    let mut out = Vec::new();
    for (device, values) in new {
        let tags = [("type", "node"), ("device", device.as_str())];
        let before = old.and_then(|o| o.get(device));
        for (name, _, _, unit) in LUSTRE_COUNTERS {
            let tags = with_unit(&tags, unit);
            out.push(point(&format!("lustre_{name}"), &tags, V::I(values[name])));
            if let Some(before) = before
                && values[name] >= before[name]
            {
                let delta = values[name] - before[name];
                out.push(point(&format!("lustre_{name}_diff"), &tags, V::I(delta)));
                let rate = match name {
                    "read_requests" => Some(("lustre_read_requests_rate", "requests/sec")),
                    "write_requests" => Some(("lustre_write_requests_rate", "requests/sec")),
                    "read_bytes" => Some(("lustre_read_bw", "bytes/sec")),
                    "write_bytes" => Some(("lustre_write_bw", "bytes/sec")),
                    _ => None,
                };
                if let Some((rate, unit)) = rate {
                    let tags = with_unit(&[("type", "node"), ("device", device.as_str())], unit);
                    out.push(point(rate, &tags, V::F(delta as f64 / seconds)));
                }
            }
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lustrestat_sends_counters_increases_and_rates_per_device() {
    let rounds: Vec<String> = (1..=3)
        .map(|n| recorded(&format!("lctl-llite-stats-{n}.txt")))
        .collect();
    let tables: Vec<_> = rounds.iter().map(|r| lustre_table(r)).collect();
    let mut run = Run::start(
        "lustrestat",
        json!({"send_abs_values": true, "send_diff_values": true, "send_derived_values": true}),
        &["lctl-llite-stats"],
        &[("lctl-llite-stats", &rounds[0])],
        &[],
    )
    .await
    .unwrap();
    // The first round: counters only (a baseline for the rest).
    assert_points(run.collect(T1).await, lustre_points(&tables[0], None, 0.0));
    run.output("lctl-llite-stats", &rounds[1]);
    let second = lustre_points(&tables[1], Some(&tables[0]), 5.0);
    assert!(second.iter().any(|p| p.name == "lustre_read_bw"));
    assert_points(run.collect(T2).await, second);

    // Output cut inside a line, then garbage: the round fails, the baseline stays round 2.
    run.output("lctl-llite-stats", &cut(&rounds[2]));
    let message = run.collect_fails(T2 + 1).await;
    assert_contains(&message, &["lustrestat", "command lctl-llite-stats"]);
    run.output(
        "lctl-llite-stats",
        "error: get_param: param_path 'llite/*/stats': No such file or directory\n",
    );
    let message = run.collect_fails(T2 + 2).await;
    assert_contains(&message, &["a statistic before any llite", "No such file"]);

    // Round 3, 10 s after round 2: scratch's statistics were cleared (counters went back:
    // no increase or rate for them), home is gone, work appeared (a baseline).
    run.output("lctl-llite-stats", &rounds[2]);
    let third = lustre_points(&tables[2], Some(&tables[1]), 10.0);
    assert!(
        third.iter().any(|p| p.name == "lustre_write_bw")
            && !third.iter().any(|p| p.name == "lustre_read_bw"),
        "the recording has one counter going on and one going back"
    );
    assert_points(run.collect(T3).await, third);
}

// ---------------------------------------------------------------------------------------
// gpfs

const GPFS: [(&str, &str, &str, bool); 8] = [
    ("_oc_", "gpfs_num_opens", "gpfs_opens_rate", false),
    ("_cc_", "gpfs_num_closes", "gpfs_closes_rate", false),
    ("_rdc_", "gpfs_num_reads", "gpfs_reads_rate", false),
    ("_wc_", "gpfs_num_writes", "gpfs_writes_rate", false),
    ("_dir_", "gpfs_num_readdirs", "gpfs_readdirs_rate", false),
    (
        "_iu_",
        "gpfs_num_inode_updates",
        "gpfs_inode_updates_rate",
        false,
    ),
    ("_br_", "gpfs_bytes_read", "gpfs_bw_read", true),
    ("_bw_", "gpfs_bytes_written", "gpfs_bw_write", true),
];

/// `filesystem -> (time, key -> value)` of the records with `_rc_ 0`.
fn gpfs_table(text: &str) -> BTreeMap<String, (f64, BTreeMap<String, i64>)> {
    let mut table = BTreeMap::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        let kv: BTreeMap<&str, &str> = f[1..].chunks(2).map(|c| (c[0], c[1])).collect();
        if kv["_rc_"] != "0" {
            continue;
        }
        let time = kv["_t_"].parse::<f64>().unwrap() + kv["_tu_"].parse::<f64>().unwrap() / 1e6;
        let mut values: BTreeMap<String, i64> = GPFS
            .iter()
            .map(|(k, ..)| ((*k).to_owned(), kv[k].parse().unwrap()))
            .collect();
        let sum = |v: &BTreeMap<String, i64>, keys: &[&str]| keys.iter().map(|k| v[*k]).sum();
        let totals = [
            ("bytesTotal", sum(&values, &["_br_", "_bw_"])),
            ("iops", sum(&values, &["_rdc_", "_wc_"])),
            ("metaops", sum(&values, &["_oc_", "_cc_", "_dir_", "_iu_"])),
        ];
        for (k, v) in totals {
            values.insert(k.to_owned(), v);
        }
        table.insert(kv["_fs_"].to_owned(), (time, values));
    }
    table
}

/// The gpfs points with every kind enabled, totals included, `excluded` left out.
fn gpfs_points(
    new: &BTreeMap<String, (f64, BTreeMap<String, i64>)>,
    old: &BTreeMap<String, (f64, BTreeMap<String, i64>)>,
    excluded: &str,
) -> Vec<Got> {
    let all: Vec<(&str, &str, &str, bool)> = GPFS
        .iter()
        .copied()
        .chain([
            ("bytesTotal", "gpfs_bytes_total", "gpfs_bw_total", true),
            ("iops", "gpfs_iops", "gpfs_iops_rate", false),
            ("metaops", "gpfs_metaops", "gpfs_metaops_rate", false),
        ])
        .collect();
    let mut out = Vec::new();
    for (fs, (time, values)) in new {
        if fs == excluded {
            continue;
        }
        let tags = [("type", "node"), ("filesystem", fs.as_str())];
        for (k, name, rate, bytes) in &all {
            let unit = if *bytes { "bytes" } else { "requests" };
            out.push(point(name, &with_unit(&tags, unit), V::I(values[*k])));
            if let Some((old_time, old_values)) = old.get(fs)
                && values[*k] >= old_values[*k]
            {
                let delta = values[*k] - old_values[*k];
                out.push(point(
                    &format!("{name}_diff"),
                    &with_unit(&tags, unit),
                    V::I(delta),
                ));
                let unit = if *bytes { "bytes/sec" } else { "requests/sec" };
                out.push(point(
                    rate,
                    &with_unit(&tags, unit),
                    V::F(delta as f64 / (time - old_time)),
                ));
            }
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gpfs_sends_counters_totals_and_rates_over_mmpmons_own_timestamps() {
    let rounds: Vec<String> = (1..=4)
        .map(|n| recorded(&format!("mmpmon-fs_io_s-{n}.txt")))
        .collect();
    let tables: Vec<_> = rounds.iter().map(|r| gpfs_table(r)).collect();
    let mut run = Run::start(
        "gpfs",
        json!({
            "send_abs_values": true, "send_diff_values": true, "send_derived_values": true,
            "send_total_values": true, "exclude_filesystem": ["scratch"]
        }),
        &["mmpmon-fs-io"],
        &[("mmpmon-fs-io", &rounds[0])],
        &[],
    )
    .await
    .unwrap();
    let none = BTreeMap::new();
    assert_points(
        run.collect(T1).await,
        gpfs_points(&tables[0], &none, "scratch"),
    );
    run.output("mmpmon-fs-io", &rounds[1]);
    assert_points(
        run.collect(T2).await,
        gpfs_points(&tables[1], &tables[0], "scratch"),
    );

    // mmpmon cannot reach the daemon, then its output is cut: the round fails.
    run.failing("mmpmon-fs-io", Some("mmpmon: GPFS daemon is not running\n"));
    let message = run.collect_fails(T2 + 1).await;
    assert_contains(&message, &["gpfs", "status 1", "daemon is not running"]);
    run.failing("mmpmon-fs-io", None);
    run.output("mmpmon-fs-io", &cut(&rounds[2]));
    let message = run.collect_fails(T2 + 2).await;
    assert_contains(&message, &["command mmpmon-fs-io"]);

    // Round 3: gpfs2's record failed (skipped, its baseline kept); gpfs1's counters went
    // back (a restart: no increases or rates for them).
    run.output("mmpmon-fs-io", &rounds[2]);
    assert!(!tables[2].contains_key("gpfs2"));
    assert_points(
        run.collect(T3).await,
        gpfs_points(&tables[2], &tables[1], "scratch"),
    );
    // Round 4: gpfs2 is back and counts from its round 2 values, over 20 s of mmpmon time.
    run.output("mmpmon-fs-io", &rounds[3]);
    let fourth = gpfs_points(&tables[3], &tables[1], "scratch");
    assert!(fourth.iter().any(|p| p.name == "gpfs_bw_read"));
    assert_points(run.collect(T4).await, fourth);
}

// ---------------------------------------------------------------------------------------
// customcmd

/// Points of line protocol with a numeric or string `value` field, by this test's reading
/// of the few lines the recordings hold (no escapes but `\ ` in tag values).
fn customcmd_points(text: &str, excluded: &str) -> Vec<Got> {
    let mut out = Vec::new();
    for line in text.lines() {
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        let line = line.replace("\\ ", "\u{1}");
        let mut parts = line.split(' ');
        let series = parts.next().unwrap();
        let fields = parts.next().unwrap();
        let Some(raw) = fields.split(',').find_map(|f| f.strip_prefix("value=")) else {
            continue;
        };
        let value = if let Some(s) = raw.strip_prefix('"') {
            V::S(s.trim_end_matches('"').to_owned())
        } else if let Some(i) = raw.strip_suffix('i') {
            V::I(i.parse().unwrap())
        } else if let Some(u) = raw.strip_suffix('u') {
            V::U(u.parse().unwrap())
        } else {
            V::F(raw.parse().unwrap())
        };
        let mut items = series.split(',');
        let name = items.next().unwrap();
        if name == excluded {
            continue;
        }
        let tags: Vec<(String, String)> = items
            .map(|t| t.split_once('=').unwrap())
            .filter(|(k, _)| *k != "hostname")
            .map(|(k, v)| (k.to_owned(), v.replace('\u{1}', " ")))
            .collect();
        let tags: Vec<(&str, &str)> = tags.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        out.push(point(name, &tags, value));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn customcmd_forwards_granted_commands_and_files_of_line_protocol() {
    let app = recorded("customcmd-app.lp");
    let file = recorded("customcmd-file.lp");
    let mut run = Run::start(
        "customcmd",
        json!({
            "commands": ["gateway"],
            "files": ["/var/run/licenses.metrics"],
            "exclude_metrics": ["license_tokens_used"]
        }),
        &["gateway"],
        &[("gateway", &app)],
        &["/var/run/licenses.metrics"],
    )
    .await
    .unwrap();
    run.file("/var/run/licenses.metrics", &file);
    let mut expected = customcmd_points(&app, "");
    expected.extend(customcmd_points(&file, "license_tokens_used"));
    assert_eq!(
        expected.len(),
        4,
        "three points of the command, one of the file"
    );
    assert_points(run.collect(T1).await, expected.clone());

    // A line that is not line protocol fails the round, naming the source and the line.
    run.output("gateway", &format!("{app}gateway_broken,type=node\n"));
    let message = run.collect_fails(T2).await;
    assert_contains(
        &message,
        &["customcmd", "command gateway", "line 6: no fields"],
    );
    run.output("gateway", &app);
    run.failing("gateway", Some("gateway unreachable\n"));
    let message = run.collect_fails(T2 + 1).await;
    assert_contains(
        &message,
        &[
            "command gateway exited with status 1",
            "gateway unreachable",
        ],
    );
    run.failing("gateway", None);
    assert_points(run.collect(T3).await, expected);
}

// ---------------------------------------------------------------------------------------
// smartmon

/// The points of one `smartctl --json=c --all` report, by this test's reading of its JSON:
/// the NVMe health log, or for other devices the fields smartctl gives every device.
fn smartmon_points(device: &str, report: &str, excluded: &[&str]) -> Vec<Got> {
    let report: serde_json::Value = serde_json::from_str(report).unwrap();
    let tags = [("type", "node"), ("stype", "disk"), ("stype-id", device)];
    let mut values: Vec<(&str, i64, &str)> = Vec::new();
    if let Some(log) = report.get("nvme_smart_health_information_log") {
        let int = |key: &str| log[key].as_i64().unwrap();
        values.extend([
            ("smartmon_temp", int("temperature"), "degC"),
            ("smartmon_percent_used", int("percentage_used"), "percent"),
            ("smartmon_avail_spare", int("available_spare"), "percent"),
            ("smartmon_data_units_read", int("data_units_read"), ""),
            ("smartmon_data_units_write", int("data_units_written"), ""),
            ("smartmon_host_reads", int("host_reads"), ""),
            ("smartmon_host_writes", int("host_writes"), ""),
            ("smartmon_power_cycles", int("power_cycles"), ""),
            ("smartmon_power_on", int("power_on_hours") * 3600, "sec"),
            ("smartmon_unsafe_shutdowns", int("unsafe_shutdowns"), ""),
            ("smartmon_media_errors", int("media_errors"), ""),
            ("smartmon_errlog_entries", int("num_err_log_entries"), ""),
            ("smartmon_warn_temp_time", int("warning_temp_time"), ""),
            ("smartmon_crit_comp_time", int("critical_comp_time"), ""),
        ]);
    } else {
        values.extend([
            (
                "smartmon_temp",
                report["temperature"]["current"].as_i64().unwrap(),
                "degC",
            ),
            (
                "smartmon_power_cycles",
                report["power_cycle_count"].as_i64().unwrap(),
                "",
            ),
            (
                "smartmon_power_on",
                report["power_on_time"]["hours"].as_i64().unwrap() * 3600,
                "sec",
            ),
        ]);
    }
    values
        .into_iter()
        .filter(|(name, ..)| !excluded.contains(name))
        .map(|(name, value, unit)| point(name, &with_unit(&tags, unit), V::I(value)))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smartmon_follows_the_scan_and_fails_rounds_on_bad_reports() {
    let nvme0 = [
        recorded("smartctl-nvme0-1.json"),
        recorded("smartctl-nvme0-2.json"),
    ];
    let sda = recorded("smartctl-sda.json");
    let nvme1 = recorded("smartctl-nvme1.json");
    let mut run = Run::start(
        "smartmon",
        json!({"excludeMetrics": ["smartmon_crit_comp_time"]}),
        &[
            "smartctl-scan",
            "smartctl-nvme0",
            "smartctl-nvme1",
            "smartctl-sda",
        ],
        &[
            ("smartctl-scan", &recorded("smartctl-scan-1.json")),
            ("smartctl-nvme0", &nvme0[0]),
            ("smartctl-nvme1", &nvme1),
            ("smartctl-sda", &sda),
        ],
        &[],
    )
    .await
    .unwrap();
    let excluded = ["smartmon_crit_comp_time"];
    let mut expected = smartmon_points("/dev/nvme0", &nvme0[0], &excluded);
    expected.extend(smartmon_points("/dev/sda", &sda, &excluded));
    assert_eq!(
        expected.len(),
        13 + 3,
        "the NVMe log and the SATA disk's fields"
    );
    assert_points(run.collect(T1).await, expected);

    // Round 2: nvme0 has an error log entry, which smartctl says with status bit 6: its
    // report is still read.
    run.output("smartctl-nvme0", &nvme0[1]);
    run.status("smartctl-nvme0", Some(64));
    let mut expected = smartmon_points("/dev/nvme0", &nvme0[1], &excluded);
    expected.extend(smartmon_points("/dev/sda", &sda, &excluded));
    assert!(expected.contains(&point(
        "smartmon_errlog_entries",
        &[
            ("type", "node"),
            ("stype", "disk"),
            ("stype-id", "/dev/nvme0")
        ],
        V::I(3)
    )));
    assert_points(run.collect(T2).await, expected.clone());
    run.status("smartctl-nvme0", None);

    // A report cut short, then something that is not JSON, then a scan that fails: each
    // fails the round naming the device or the grant.
    run.output("smartctl-nvme0", &cut(&nvme0[1]));
    let message = run.collect_fails(T2 + 1).await;
    assert_contains(
        &message,
        &[
            "smartmon",
            "device \"/dev/nvme0\"",
            "command smartctl-nvme0",
            "not JSON",
        ],
    );
    run.output("smartctl-nvme0", "Segmentation fault\n");
    let message = run.collect_fails(T2 + 2).await;
    assert_contains(&message, &["command smartctl-nvme0", "Segmentation fault"]);
    run.output("smartctl-nvme0", &nvme0[1]);
    run.failing("smartctl-scan", Some("smartctl: permission denied\n"));
    let message = run.collect_fails(T2 + 3).await;
    assert_contains(
        &message,
        &[
            "command smartctl-scan exited with status 1",
            "permission denied",
        ],
    );
    run.failing("smartctl-scan", None);

    // Round 3: the SATA disk is gone, nvme1 appeared.
    run.output("smartctl-scan", &recorded("smartctl-scan-2.json"));
    let mut expected = smartmon_points("/dev/nvme0", &nvme0[1], &excluded);
    expected.extend(smartmon_points("/dev/nvme1", &nvme1, &excluded));
    assert_points(run.collect(T3).await, expected.clone());

    // nvme1 cannot be opened (status 2): smartctl's own message is quoted. A disk the
    // scan finds without a grant names the grant to add.
    run.output("smartctl-nvme1", &recorded("smartctl-nvme1-gone.json"));
    run.status("smartctl-nvme1", Some(2));
    let message = run.collect_fails(T3 + 1).await;
    assert_contains(
        &message,
        &["device \"/dev/nvme1\"", "status 2", "No such device"],
    );
    run.status("smartctl-nvme1", None);
    run.output("smartctl-nvme1", &nvme1);
    run.output("smartctl-scan", &recorded("smartctl-scan-3.json"));
    let message = run.collect_fails(T3 + 2).await;
    assert_contains(
        &message,
        &[
            "device \"/dev/nvme2\"",
            "smartctl-nvme2",
            "not granted",
            "exclude_devices",
        ],
    );
    run.output("smartctl-scan", &recorded("smartctl-scan-2.json"));
    assert_points(run.collect(T4).await, expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smartmon_queries_configured_devices_by_their_grants_without_a_scan() {
    let nvme0 = recorded("smartctl-nvme0-1.json");
    let mut run = Run::start(
        "smartmon",
        json!({
            "devices": [{"name": "/dev/nvme0", "type": "nvme", "command": "boot-disk"},
                        {"name": "/dev/sda", "type": "sat"}],
            "exclude_devices": ["/dev/sda"],
            "exclude_metrics": ["smartmon_temp"]
        }),
        &["boot-disk"],
        &[("boot-disk", &nvme0)],
        &[],
    )
    .await
    .unwrap();
    let expected = smartmon_points("/dev/nvme0", &nvme0, &["smartmon_temp"]);
    assert_eq!(expected.len(), 13);
    assert_points(run.collect(T1).await, expected);
    // The grant reports another device than the one configured: refused.
    run.output("boot-disk", &recorded("smartctl-nvme1.json"));
    let message = run.collect_fails(T2).await;
    assert_contains(&message, &["command boot-disk", "is of \"/dev/nvme1\""]);

    // cc-metric-collector's sudo and a path where a grant name belongs are refused at start.
    for config in [
        json!({"use_sudo": true}),
        json!({"scan_command": "/usr/sbin/smartctl --scan"}),
        json!({"excludeMetrics": ["smartmon_temperature"]}),
    ] {
        let err = Run::start("smartmon", config.clone(), &[], &[], &[])
            .await
            .err()
            .unwrap_or_else(|| panic!("{config} must be refused"));
        assert_contains(&err, &["smartmon"]);
    }
}

// ---------------------------------------------------------------------------------------
// beegfs_meta, beegfs_storage

/// The operations BeeGFS's metadata servers count, as `beegfs-ctl` names them.
const BEEGFS_META_OPS: [&str; 39] = [
    "sum",
    "ack",
    "close",
    "entInf",
    "fndOwn",
    "mkdir",
    "create",
    "rddir",
    "refrEnt",
    "mdsInf",
    "rmdir",
    "rmLnk",
    "mvDirIns",
    "mvFiIns",
    "open",
    "ren",
    "sChDrct",
    "sAttr",
    "sDirPat",
    "stat",
    "statfs",
    "trunc",
    "symlnk",
    "unlnk",
    "lookLI",
    "statLI",
    "revalLI",
    "openLI",
    "createLI",
    "hardlnk",
    "flckAp",
    "flckEn",
    "flckRg",
    "dirparent",
    "listXA",
    "getXA",
    "rmXA",
    "setXA",
    "mirror",
];

/// The storage servers' operations in the form the recordings print them.
const BEEGFS_STORAGE_OPS: [&str; 18] = [
    "sum", "ack", "sChDrct", "getFSize", "sAttr", "statfs", "trunc", "close", "fsync", "ops-rd",
    "MiB-rd/s", "ops-wr", "MiB-wr/s", "gendbg", "hrtbeat", "remNode", "storInf", "unlnk",
];

/// The points of a `beegfs-ctl --clientstats` recording's `Sum:` line for `filesystem`:
/// known operations under their name, excluded and unknown ones summed as `other`.
fn beegfs_points(
    text: &str,
    prefix: &str,
    known: &[&str],
    excluded: &[&str],
    filesystem: &str,
) -> Vec<Got> {
    let sum = text
        .lines()
        .find_map(|l| l.strip_prefix("Sum:"))
        .expect("a Sum: line");
    let tokens: Vec<&str> = sum.split_whitespace().collect();
    let tags = [("type", "node"), ("filesystem", filesystem)];
    let mut out = Vec::new();
    let mut other = 0.0;
    for pair in tokens.chunks(2) {
        let value: f64 = pair[0].parse().unwrap();
        let op = pair[1].trim_start_matches('[').trim_end_matches(']');
        if known.contains(&op) && !excluded.contains(&op) {
            out.push(point(&format!("{prefix}{op}"), &tags, V::F(value)));
        } else {
            other += value;
        }
    }
    out.push(point(&format!("{prefix}other"), &tags, V::F(other)));
    out
}

const BEEOND_MOUNTS: &str = "sysfs /sys sysfs rw,nosuid,nodev,noexec,relatime 0 0\n\
    /dev/sda2 / ext4 rw,relatime 0 0\n\
    nfs01:/home /home nfs4 rw,relatime,vers=4.2 0 0\n\
    beegfs_ondemand /mnt/beeond beegfs rw,relatime,cfgFile=/etc/beegfs/beeond-client.conf 0 0\n\
    beegfs_ondemand /mnt/ignore_me beegfs rw,relatime,cfgFile=/etc/beegfs/beeond2.conf 0 0\n\
    beegfs_nodev /mnt/beegfs beegfs rw,relatime,cfgFile=/etc/beegfs/beegfs-client.conf 0 0\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn beegfs_meta_sends_the_sum_line_per_beeond_mount_and_follows_the_mount_table() {
    let rounds = [
        recorded("beegfs-ctl-meta-1.txt"),
        recorded("beegfs-ctl-meta-2.txt"),
    ];
    let mut run = Run::launch(
        "beegfs_meta",
        json!({"exclude_filesystem": ["/mnt/ignore_me"], "exclude_metrics": ["ack", "entInf"]}),
        &["beegfs-meta-mnt-beeond", "beegfs-meta-scratch-job"],
        &[
            ("beegfs-meta-mnt-beeond", &rounds[0]),
            ("beegfs-meta-scratch-job", &rounds[1]),
        ],
        &[],
        true,
    )
    .await
    .unwrap();
    run.file("/proc/self/mounts", BEEOND_MOUNTS);
    let excluded = ["ack", "entInf"];
    let points = |text: &str, fs: &str| {
        beegfs_points(text, "beegfs_cmeta_", &BEEGFS_META_OPS, &excluded, fs)
    };
    let first = points(&rounds[0], "/mnt/beeond");
    assert_eq!(
        first.len(),
        39 - 2 + 1,
        "every known operation but two, and other"
    );
    assert_points(run.collect(T1).await, first);
    // Round 2: new counters, including one this version does not know (summed as other).
    run.output("beegfs-meta-mnt-beeond", &rounds[1]);
    assert!(rounds[1].contains(" [39]"));
    assert_points(run.collect(T2).await, points(&rounds[1], "/mnt/beeond"));

    // beegfs-ctl fails, its output is cut, then garbled: the round fails naming the grant.
    run.failing(
        "beegfs-meta-mnt-beeond",
        Some("Unable to find BeeGFS mount: /mnt/beeond\n"),
    );
    let message = run.collect_fails(T2 + 1).await;
    assert_contains(
        &message,
        &[
            "beegfs_meta",
            "command beegfs-meta-mnt-beeond exited with status 1",
            "Unable to find",
            "/mnt/beeond",
        ],
    );
    run.failing("beegfs-meta-mnt-beeond", None);
    run.output("beegfs-meta-mnt-beeond", &cut(&rounds[1]));
    let message = run.collect_fails(T2 + 2).await;
    assert_contains(&message, &["command beegfs-meta-mnt-beeond", "cut short"]);
    run.output(
        "beegfs-meta-mnt-beeond",
        "Sum:   12 [sum]  3 [ack\n10.20.0.11  12 [sum]\n",
    );
    let message = run.collect_fails(T2 + 3).await;
    assert_contains(
        &message,
        &["not a line of beegfs-ctl --clientstats", "[ack"],
    );

    // A second BeeOND file system is mounted (its grant named after its mount point), then
    // one without a grant: the round names the grant to add.
    run.output("beegfs-meta-mnt-beeond", &rounds[0]);
    let two = format!("{BEEOND_MOUNTS}beegfs_ondemand /scratch/job beegfs rw,relatime 0 0\n");
    run.file("/proc/self/mounts", &two);
    let mut expected = points(&rounds[0], "/mnt/beeond");
    expected.extend(points(&rounds[1], "/scratch/job"));
    assert_points(run.collect(T3).await, expected);
    run.file(
        "/proc/self/mounts",
        &format!("{two}beegfs_ondemand /mnt/new beegfs rw 0 0\n"),
    );
    let message = run.collect_fails(T3 + 1).await;
    assert_contains(
        &message,
        &["beegfs-meta-mnt-new", "not granted", "exclude_filesystem"],
    );
    // It is unmounted again, and so is /scratch/job.
    run.file("/proc/self/mounts", BEEOND_MOUNTS);
    assert_points(run.collect(T4).await, points(&rounds[0], "/mnt/beeond"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn beegfs_storage_uses_the_named_grant_and_needs_the_mount_table() {
    let rounds = [
        recorded("beegfs-ctl-storage-1.txt"),
        recorded("beegfs-ctl-storage-2.txt"),
    ];
    let config = json!({
        "exclude_filesystem": ["/mnt/ignore_me"],
        "mount_commands": {"/mnt/beeond": "beeond-storage"},
        "exclude_metrics": ["hrtbeat", "beegfs_cstorage_gendbg"]
    });
    let mut run = Run::launch(
        "beegfs_storage",
        config.clone(),
        &["beeond-storage"],
        &[("beeond-storage", &rounds[0])],
        &[],
        true,
    )
    .await
    .unwrap();
    run.file("/proc/self/mounts", BEEOND_MOUNTS);
    // `hrtbeat` is summed as other; the full name `beegfs_cstorage_gendbg` is dropped.
    let points = |text: &str| {
        let mut points = beegfs_points(
            text,
            "beegfs_cstorage_",
            &BEEGFS_STORAGE_OPS,
            &["hrtbeat"],
            "/mnt/beeond",
        );
        points.retain(|p| p.name != "beegfs_cstorage_gendbg");
        points
    };
    let first = points(&rounds[0]);
    assert!(first.iter().any(|p| p.name == "beegfs_cstorage_MiB-rd/s"));
    assert_points(run.collect(T1).await, first);
    run.output("beeond-storage", &rounds[1]);
    assert_points(run.collect(T2).await, points(&rounds[1]));

    // Without capabilities.mount-info the mount table is refused, and the round says what
    // to grant.
    let mut run = Run::launch(
        "beegfs_storage",
        config,
        &["beeond-storage"],
        &[("beeond-storage", &rounds[0])],
        &[],
        false,
    )
    .await
    .unwrap();
    run.file("/proc/self/mounts", BEEOND_MOUNTS);
    let message = run.collect_fails(T1).await;
    assert_contains(&message, &["beegfs_storage", "capabilities.mount-info"]);

    // cc-metric-collector's executable path is refused at start, saying what to do.
    let err = Run::start(
        "beegfs_storage",
        json!({"beegfs_path": "/usr/bin/beegfs-ctl"}),
        &[],
        &[],
        &[],
    )
    .await
    .err()
    .expect("beegfs_path is refused");
    assert_contains(&err, &["beegfs_path", "capabilities.run"]);
}

// ---------------------------------------------------------------------------------------
// The real tools

/// The vendor tools themselves, where installed: their plugin runs one round through the
/// host without trapping; the round either succeeds with `type=node` points or fails with
/// the grant named (no device, no daemon).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vendor_tools_where_installed() {
    let tools = [
        (
            "ipmistat",
            "ipmi-sensors",
            "/usr/sbin/ipmi-sensors",
            vec!["--comma-separated-output"],
            json!({"ipmitool_command": ""}),
        ),
        (
            "ipmistat",
            "ipmitool-sensor",
            "/usr/bin/ipmitool",
            vec!["sensor"],
            json!({"ipmisensors_command": ""}),
        ),
        (
            "lustrestat",
            "lctl-llite-stats",
            "/usr/sbin/lctl",
            vec!["get_param", "llite.*.stats"],
            json!({"send_abs_values": true}),
        ),
        (
            "gpfs",
            "mmpmon-fs-io",
            "/usr/lpp/mmfs/bin/mmpmon",
            vec!["-p", "-s"],
            json!({"send_abs_values": true}),
        ),
        (
            "smartmon",
            "smartctl-scan",
            "/usr/sbin/smartctl",
            vec!["--scan", "--json=c"],
            json!({}),
        ),
    ];
    // beegfs-ctl needs a BeeOND file system mounted to say anything; where it is
    // installed, the plugins run over the node's own mount table with a grant for BeeOND's
    // usual mount point, and a round either succeeds or names what it lacks.
    for (component, nodetype) in [("beegfs_meta", "meta"), ("beegfs_storage", "storage")] {
        let path = "/usr/bin/beegfs-ctl";
        if !Path::new(path).is_file() {
            println!("skipped the real beegfs-ctl for {component}: {path} is not installed");
            continue;
        }
        let runtime = Runtime::new(RuntimeOptions {
            cache_dir: None,
            ..RuntimeOptions::default()
        })
        .unwrap();
        let mut spec = PluginSpec::new(guests::component(component));
        spec.config = json!({"hostname": HOST});
        spec.capabilities.mount_info = true;
        spec.capabilities.run.insert(
            format!("beegfs-{nodetype}-mnt-beeond"),
            RunGrant {
                args: vec![
                    "--clientstats".to_owned(),
                    format!("--nodetype={nodetype}"),
                    "--mount=/mnt/beeond".to_owned(),
                    "--allstats".to_owned(),
                ],
                ..RunGrant::new(path)
            },
        );
        let loaded = runtime.load(&spec).await.expect("loads");
        let (sink, _rx) = sink::channel(16);
        let mut instance = loaded
            .instantiate(&runtime, &spec, sink)
            .await
            .expect("instantiates");
        match instance.collect(T1).await {
            Ok(Ok(())) => {}
            Ok(Err(message)) => assert_contains(&message, &[component]),
            other => panic!("{component} over the real beegfs-ctl trapped: {other:?}"),
        }
    }
    for (component, grant, path, args, mut config) in tools {
        if !Path::new(path).is_file() {
            println!("skipped the real {grant}: {path} is not installed");
            continue;
        }
        let dir = tempfile::tempdir().unwrap();
        let runtime = Runtime::new(RuntimeOptions {
            cache_dir: None,
            ..RuntimeOptions::default()
        })
        .unwrap();
        let mut spec = PluginSpec::new(guests::component(component));
        config["hostname"] = json!(HOST);
        spec.config = config;
        spec.capabilities.run.insert(
            grant.to_owned(),
            RunGrant {
                args: args.iter().map(|a| (*a).to_owned()).collect(),
                ..RunGrant::new(path)
            },
        );
        spec.capabilities.files_root = Some(dir.path().to_path_buf());
        let loaded = runtime.load(&spec).await.expect("loads");
        let (sink, rx) = sink::channel(16);
        let instance = loaded
            .instantiate(&runtime, &spec, sink)
            .await
            .expect("instantiates");
        let mut run = Run {
            _runtime: runtime,
            dir,
            instance,
            rx,
        };
        match run.instance.collect(T1).await {
            Ok(Ok(())) => {
                run.instance.collect(T2).await.ok();
                while let Ok(batch) = run.rx.try_recv() {
                    for line in Decoder::new(&batch.lines) {
                        let line = line.expect("valid line protocol");
                        assert!(
                            line.tags()
                                .any(|(k, v)| k.raw() == "type" && v.raw() == "node")
                        );
                    }
                }
            }
            Ok(Err(message)) => assert_contains(&message, &[grant]),
            other => panic!("{component} over the real {grant} trapped: {other:?}"),
        }
    }
}
