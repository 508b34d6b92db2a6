//! What ClusterCockpit's job view needs from each NHR@FAU cluster: the agent converted from the
//! cluster's published cc-metric-collector configuration (`fixtures/ccmc-fau/<site>/`, by
//! `ccfleet agent import-ccmc`), running with that configuration's router over a recorded node
//! (the `collectors` and `hpc` file trees, the stand-in LIKWID and NVML libraries), sends every
//! metric the cluster's ClusterCockpit metric configuration (`<site>/cluster.json`, from
//! cc-examples' job archive) names, tagged with the metric's scope as `type` and with the
//! unit ClusterCockpit expects.
//!
//! The converted configuration is run as written except for what is specific to the node it
//! runs on: the fleet server's address and the host name, each plugin's `files-root` (the
//! recorded tree instead of `/`), the LIKWID and NVML library paths (the stand-ins), the
//! collect interval (500 ms instead of 60 s, so the test takes seconds) with LIKWID's
//! measurement time within it (100 ms instead of 10 s), and the sinks: the
//! site's cc-metric-store (`http`) sink keeps its settings (`meta_as_tags` among them) but
//! points at a local store the test reads; its InfluxDB sinks are left out, since
//! ClusterCockpit's job view reads the metric store only.

#[path = "support/guests.rs"]
mod guests;
#[path = "support/store.rs"]
mod store;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use ccfleet::server::{RunningServer, ServerConfig};
use ccfleet_host::agent::{Agent, AgentConfig};
use serde_json::{Value, json};
use store::Store;

const BIN: &str = env!("CARGO_BIN_EXE_ccfleet");
/// How long one node type may take to reach its rounds (only reached when it hangs).
const WAIT: Duration = Duration::from_secs(120);
/// Collect rounds of every plugin before the store's points are read.
const ROUNDS: u64 = 2;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

/// One node type: the site's configuration directory, its collectors file where the site
/// keeps one per node type, the directory of its `cluster.json`, the subcluster its nodes
/// belong to and a host name of it.
struct NodeType {
    site: &'static str,
    collectors: Option<&'static str>,
    cluster_json: &'static str,
    subcluster: &'static str,
    host: &'static str,
}

const NODE_TYPES: &[NodeType] = &[
    NodeType {
        site: "alex",
        collectors: None,
        cluster_json: "alex",
        subcluster: "a100",
        host: "a0601",
    },
    NodeType {
        site: "fritz",
        collectors: None,
        cluster_json: "fritz",
        subcluster: "main",
        host: "f0101",
    },
    NodeType {
        site: "fritz.spr",
        collectors: None,
        cluster_json: "fritz",
        subcluster: "spr1tb",
        host: "f2157",
    },
    NodeType {
        site: "meggie-ng",
        collectors: None,
        cluster_json: "meggie-ng",
        subcluster: "main",
        host: "m0101",
    },
    NodeType {
        site: "tinyfat",
        collectors: Some("collectors.bdw.json"),
        cluster_json: "tinyfat",
        subcluster: "broadwell_512gb",
        host: "tf040",
    },
    NodeType {
        site: "tinyfat",
        collectors: Some("collectors.rome.json"),
        cluster_json: "tinyfat",
        subcluster: "rome_512gb",
        host: "tf060",
    },
    NodeType {
        site: "tinygpu",
        collectors: Some("collectors.rome.a100.json"),
        cluster_json: "tinygpu",
        subcluster: "a100",
        host: "tg090",
    },
    NodeType {
        site: "tinygpu",
        collectors: Some("collectors.skx.2080.json"),
        cluster_json: "tinygpu",
        subcluster: "rtx2080",
        host: "tg060",
    },
    NodeType {
        site: "tinygpu",
        collectors: Some("collectors.skx.3080.json"),
        cluster_json: "tinygpu",
        subcluster: "rtx3080",
        host: "tg080",
    },
    NodeType {
        site: "tinygpu",
        collectors: Some("collectors.skx.v100.json"),
        cluster_json: "tinygpu",
        subcluster: "v100",
        host: "tg071",
    },
    NodeType {
        site: "woody-ng",
        collectors: Some("collectors.icx.json"),
        cluster_json: "woody-ng",
        subcluster: "icelake",
        host: "w2201",
    },
    NodeType {
        site: "woody-ng",
        collectors: Some("collectors.skl.json"),
        cluster_json: "woody-ng",
        subcluster: "skylake",
        host: "w1201",
    },
];

/// What is checked of a metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Aspect {
    /// That it arrives at all.
    Sent,
    /// Its `type` tag.
    Scope,
    /// Its `unit` tag.
    Unit,
}

/// Where a site's published configuration and its `cluster.json` disagree, so the agent,
/// sending what the configuration says (as cc-metric-collector would), cannot match the
/// metric configuration: (site, or site/collectors file, or `*`; metric; aspect; why).
/// Everything else is checked.
const EXCLUDED: &[(&str, &str, Aspect, &str)] = &[
    (
        "fritz.spr",
        "cpu_power",
        Aspect::Sent,
        "fritz.spr's configuration has no likwid section (its cluster.json removes only \
         flops_*, mem_bw and clock from the spr subclusters)",
    ),
    ("fritz.spr", "mem_power", Aspect::Sent, "as cpu_power"),
    ("fritz.spr", "ipc", Aspect::Sent, "as cpu_power"),
    (
        "fritz.spr",
        "vectorization_ratio",
        Aspect::Sent,
        "as cpu_power",
    ),
    (
        "tinyfat/collectors.rome.json",
        "flops_sp",
        Aspect::Sent,
        "the AMD Zen 2 likwid configurations count all flops in one event \
         (RETIRED_SSE_AVX_FLOPS_ALL) and compute flops_any only; Zen 2 has no DRAM energy \
         counter for mem_power",
    ),
    (
        "tinyfat/collectors.rome.json",
        "flops_dp",
        Aspect::Sent,
        "as flops_sp",
    ),
    (
        "tinyfat/collectors.rome.json",
        "mem_power",
        Aspect::Sent,
        "as flops_sp",
    ),
    (
        "tinyfat/collectors.rome.json",
        "vectorization_ratio",
        Aspect::Sent,
        "as flops_sp",
    ),
    (
        "tinygpu/collectors.rome.a100.json",
        "flops_sp",
        Aspect::Sent,
        "as on tinyfat's rome",
    ),
    (
        "tinygpu/collectors.rome.a100.json",
        "flops_dp",
        Aspect::Sent,
        "as flops_sp",
    ),
    (
        "tinygpu/collectors.rome.a100.json",
        "mem_power",
        Aspect::Sent,
        "as flops_sp",
    ),
    (
        "tinygpu/collectors.rome.a100.json",
        "vectorization_ratio",
        Aspect::Sent,
        "as flops_sp",
    ),
    (
        "tinygpu",
        "nv_temp",
        Aspect::Unit,
        "cluster-tinygpu.json gives nv_temp the unit GB (alex's gives °C); the agent sends degC",
    ),
    (
        "*",
        "acc_mem_used",
        Aspect::Unit,
        "nvidia sends nv_fb_mem_used in MByte (as cc-metric-collector's); the routers rename \
         it acc_mem_used but have no change_unit_prefix for it, and cluster.json says GB",
    ),
    (
        "*",
        "ipc",
        Aspect::Unit,
        "no FAU likwid configuration gives ipc a unit; cluster.json says IPC",
    ),
    (
        "*",
        "nfs4_read",
        Aspect::Unit,
        "nfs4stat counts operations per interval and sends no unit, as \
         cc-metric-collector's; cluster.json's MB/s is a byte rate no FAU configuration \
         sends under this name",
    ),
    ("*", "nfs4_write", Aspect::Unit, "as nfs4_read"),
    ("*", "nfs4_total", Aspect::Unit, "as nfs4_read"),
    (
        "tinyfat",
        "mem_used",
        Aspect::Unit,
        "tinyfat's router has no change_unit_prefix (the other sites' turns mem_used into \
         GB), so mem_used stays in kB as /proc/meminfo gives it",
    ),
    (
        "meggie-ng",
        "cpu_load",
        Aspect::Unit,
        "loadavg sends no unit (as cc-metric-collector's); cluster-meggie.json says load",
    ),
    (
        "meggie-ng",
        "flops_any",
        Aspect::Scope,
        "cluster-meggie.json describes the older meggie setup at node scope; meggie-ng's \
         likwid configuration computes per hwthread (mem_bw per socket), which \
         cc-metric-store sums up to the node",
    ),
    ("meggie-ng", "flops_sp", Aspect::Scope, "as flops_any"),
    ("meggie-ng", "flops_dp", Aspect::Scope, "as flops_any"),
    ("meggie-ng", "mem_bw", Aspect::Scope, "as flops_any"),
    ("meggie-ng", "clock", Aspect::Scope, "as flops_any"),
    ("meggie-ng", "ipc", Aspect::Scope, "as flops_any"),
    (
        "woody-ng",
        "ipc",
        Aspect::Scope,
        "cluster-woody.json names ipc at node scope; woody-ng's likwid configurations \
         compute it per hwthread, which cc-metric-store aggregates up to the node",
    ),
];

fn excluded(node: &NodeType, metric: &str, aspect: Aspect) -> bool {
    EXCLUDED.iter().any(|(site, m, a, _)| {
        let variant = format!(
            "{}/{}",
            node.site,
            node.collectors.unwrap_or("collectors.json")
        );
        (*site == "*" || *site == node.site || *site == variant) && *m == metric && *a == aspect
    })
}

/// Builds a stand-in library of `fixtures/<crate_dir>` once per test binary.
fn standin(crate_dir: &str, file: &str) -> PathBuf {
    let manifest = fixtures().join(crate_dir).join("Cargo.toml");
    let target = Path::new(env!("CARGO_TARGET_TMPDIR")).join(crate_dir);
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
        .unwrap_or_else(|e| panic!("running cargo build for {crate_dir}: {e}"));
    assert!(status.success(), "building {crate_dir} failed");
    let lib = target.join("debug").join(file);
    assert!(lib.is_file(), "{} was not built", lib.display());
    lib
}

fn likwid_standin() -> &'static Path {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(|| standin("likwid-standin", "liblikwid_standin.so"))
}

fn nvml_standin() -> &'static Path {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(|| standin("nvml-standin", "libnvidia_ml_standin.so"))
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

/// The recorded node as of `round` (1 or 2).
fn record_round(root: &Path, round: u8) {
    copy_tree(&fixtures().join(format!("collectors/round{round}")), root);
    copy_tree(&fixtures().join(format!("hpc/round{round}")), root);
}

/// `ccfleet agent import-ccmc` of a node type's configuration.
fn convert(node: &NodeType, dir: &Path) -> Value {
    let output = dir.join("converted.json");
    let mut command = Command::new(BIN);
    command
        .args(["agent", "import-ccmc"])
        .arg(fixtures().join("ccmc-fau").join(node.site))
        .arg("-o")
        .arg(&output)
        .args(["--fleet-url", "http://backend.example:8080", "--plugin-dir"])
        .arg(guests::components());
    if let Some(file) = node.collectors {
        command
            .arg("--collectors")
            .arg(fixtures().join("ccmc-fau").join(node.site).join(file));
    }
    let result = command.output().expect("running ccfleet");
    assert!(
        result.status.success(),
        "{} {:?}: {}{}",
        node.site,
        node.collectors,
        String::from_utf8_lossy(&result.stdout),
        String::from_utf8_lossy(&result.stderr)
    );
    serde_json::from_str(&std::fs::read_to_string(&output).unwrap()).unwrap()
}

/// The converted configuration with the node-specific settings of this test (see the top of
/// this file).
fn for_recorded_node(
    mut config: Value,
    node: &NodeType,
    server: &str,
    store: &str,
    root: &Path,
    dir: &Path,
    cache: &Path,
) -> Value {
    config["fleet"]["url"] = json!(server);
    config["fleet"]["hostname"] = json!(node.host);
    config["fleet"]["config-poll-interval"] = json!("1h");
    config["plugin-cache-dir"] = json!(cache);
    config["metrics-addr"] = json!("127.0.0.1:0");
    for plugin in config["plugins"].as_array_mut().unwrap() {
        plugin["collect-interval"] = json!("500ms");
        if plugin["name"] == "likwid" {
            // LIKWID measures for `duration` within each round; 10 s of it would make the
            // 500 ms rounds overrun (the stand-in's counters do not depend on it).
            plugin["config"]["duration"] = json!("100ms");
        }
        let caps = plugin["capabilities"].as_object_mut().unwrap();
        caps.insert("files-root".into(), json!(root));
        // A library is loaded once per file, so each run gets its own copy.
        if caps.contains_key("likwid-library") || caps.get("likwid") == Some(&json!(true)) {
            let lib = dir.join("liblikwid.so.5");
            std::fs::copy(likwid_standin(), &lib).unwrap();
            caps.insert("likwid-library".into(), json!(lib));
        }
        if caps.get("nvml") == Some(&json!(true)) {
            let lib = dir.join("libnvidia-ml.so.1");
            std::fs::copy(nvml_standin(), &lib).unwrap();
            caps.insert("nvml-library".into(), json!(lib));
        }
    }
    let sinks = config["sinks"].as_object().unwrap().clone();
    let mut kept = serde_json::Map::new();
    for (name, mut sink) in sinks {
        if sink["type"] != "http" {
            continue;
        }
        // The site's store keeps its query (`?cluster=...`) and moves to the local one.
        let query = sink["url"]
            .as_str()
            .and_then(|u| u.split_once('?'))
            .map(|(_, q)| format!("?{q}"))
            .unwrap_or_default();
        sink["url"] = json!(format!("{store}{query}"));
        sink["flush-delay"] = json!("50ms");
        if let Some(sink) = sink.as_object_mut() {
            sink.remove("jwt-file");
        }
        kept.insert(name, sink);
    }
    assert!(!kept.is_empty(), "{}: a cc-metric-store sink", node.site);
    config["sinks"] = Value::Object(kept);
    config
}

async fn fleet_server(dir: &Path) -> RunningServer {
    let tree = dir.join("tree");
    std::fs::create_dir_all(tree.join("ccmc")).unwrap();
    std::fs::write(tree.join("ccmc").join("defaults.json"), "{}").unwrap();
    let config = json!({
        "addr": "127.0.0.1:0",
        "disable-authentication": true,
        "fleet": {"config-dir": tree, "config-reload-interval": "1h"}
    });
    ccfleet::server::start(ServerConfig::from_json(&config.to_string()).unwrap())
        .await
        .expect("fleet server")
}

/// Each plugin's collect calls so far, from the agent's `/metrics`.
async fn collect_calls(addr: std::net::SocketAddr) -> BTreeMap<String, u64> {
    let text = reqwest::get(format!("http://{addr}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let mut calls = BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("ccfleet_agent_plugin_calls_total{plugin=\"") else {
            continue;
        };
        let Some((plugin, rest)) = rest.split_once('"') else {
            continue;
        };
        if !rest.contains("call=\"collect\"") {
            continue;
        }
        let n: u64 = rest
            .rsplit(' ')
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        *calls.entry(plugin.to_owned()).or_insert(0) += n;
    }
    calls
}

/// The measure of a unit's name, spelled as cc-units (cc-backend's unit library) spells
/// it after normalising: `B` for bytes, `F` for flops, `%`, `degC`, `Hz`, `W`, `packets`;
/// `None` for a name it does not know.
fn measure(name: &str) -> Option<&'static str> {
    let lower = name.to_ascii_lowercase();
    Some(match lower.as_str() {
        "b" | "byte" | "bytes" => "B",
        "f" | "flop" | "flops" => "F",
        "%" | "percent" => "%",
        "degc" | "°c" | "c" | "celsius" => "degC",
        "hz" => "Hz",
        "w" | "watt" | "watts" => "W",
        "packets" | "packet" | "pkts" => "packets",
        "requests" => "requests",
        "ipc" => "IPC",
        "load" => "load",
        _ => return None,
    })
}

/// A unit as cc-units normalises it: an optional prefix (`K`, `M`, `G`, ...), a measure in
/// its canonical spelling and an optional `/s` (written `/s`, `/sec` or `/second`), so
/// `GBytes/s` and `GB/s`, `bytes/sec` and `B/s`, `°C` and `degC` compare equal. A unit it
/// cannot read is compared as written.
fn normalised_unit(unit: &str) -> String {
    let (left, per) = match unit.split_once('/') {
        Some((left, "s" | "sec" | "second")) => (left, "/s"),
        Some(_) => return unit.to_owned(),
        None => (unit, ""),
    };
    if left.is_empty() {
        return unit.to_owned();
    }
    if let Some(m) = measure(left) {
        return format!("{m}{per}");
    }
    let mut chars = left.chars();
    let prefix = match chars.next() {
        Some('k' | 'K') => "K",
        Some('M') => "M",
        Some('G') => "G",
        Some('T') => "T",
        Some('P') => "P",
        _ => return unit.to_owned(),
    };
    match measure(chars.as_str()) {
        Some(m) => format!("{prefix}{m}{per}"),
        None => unit.to_owned(),
    }
}

#[test]
fn units_compare_as_cc_units_normalises_them() {
    for (a, b) in [
        ("GBytes/s", "GB/s"),
        ("bytes/sec", "B/s"),
        ("packets/sec", "packets/s"),
        ("GFlops/s", "GF/s"),
        ("Flops/s", "F/s"),
        ("°C", "degC"),
        ("MHz", "MHz"),
        ("Watt", "W"),
        ("kB", "KB"),
    ] {
        assert_eq!(normalised_unit(a), normalised_unit(b), "{a} {b}");
    }
    for (a, b) in [("kB", "GB"), ("MB/s", ""), ("GB", "GB/s"), ("W", "Hz")] {
        assert_ne!(normalised_unit(a), normalised_unit(b), "{a} {b}");
    }
}

/// What ClusterCockpit's metric configuration of `node` names and the store lacks, one line
/// per metric.
fn problems(node: &NodeType, points: &[store::StoredPoint]) -> Vec<String> {
    let text = std::fs::read_to_string(
        fixtures()
            .join("ccmc-fau")
            .join(node.cluster_json)
            .join("cluster.json"),
    )
    .unwrap();
    let cluster: Value = serde_json::from_str(&text).unwrap();
    let mut out = Vec::new();
    for metric in cluster["metricConfig"].as_array().unwrap() {
        let name = metric["name"].as_str().unwrap();
        let removed = metric["subClusters"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|s| s["name"] == node.subcluster && s["remove"] == true);
        if removed || excluded(node, name, Aspect::Sent) {
            continue;
        }
        let scope = metric["scope"].as_str().unwrap();
        let prefix = metric["unit"]["prefix"].as_str().unwrap_or("");
        let base = metric["unit"]["base"].as_str().unwrap_or("");
        let want_unit = normalised_unit(&format!("{prefix}{base}"));
        let named: Vec<&store::StoredPoint> =
            points.iter().filter(|p| p.measurement == name).collect();
        if named.is_empty() {
            out.push(format!("{name}: missing"));
            continue;
        }
        let tag = |p: &store::StoredPoint, key: &str| {
            p.tags
                .iter()
                .find(|(k, _)| k == key)
                .map(|(_, v)| v.clone())
        };
        let types: BTreeSet<String> = named
            .iter()
            .map(|p| tag(p, "type").unwrap_or_else(|| "(none)".into()))
            .collect();
        if !types.contains(scope) && !excluded(node, name, Aspect::Scope) {
            out.push(format!("{name}: type {types:?}, want {scope}"));
        }
        let units: BTreeSet<String> = named
            .iter()
            .map(|p| tag(p, "unit").unwrap_or_default())
            .collect();
        // An empty unit in cluster.json states none: cc-backend then shows the metric
        // without one, whatever the collector calls it (`Percent` for cpu_user).
        let matching = base.is_empty() || units.iter().any(|u| normalised_unit(u) == want_unit);
        if !matching && !excluded(node, name, Aspect::Unit) {
            out.push(format!("{name}: unit {units:?}, want {want_unit:?}"));
        }
    }
    out
}

/// Runs one node type and returns what is missing or wrong.
async fn run(node: &NodeType, cache: &Path) -> Vec<String> {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    std::fs::create_dir_all(&root).unwrap();
    record_round(&root, 1);
    let converted = convert(node, dir.path());
    let server = fleet_server(dir.path()).await;
    let store = Store::start(None).await;
    let config = for_recorded_node(
        converted,
        node,
        &server.base_url(),
        &store.url(),
        &root,
        dir.path(),
        cache,
    );
    let config = AgentConfig::from_json(&config.to_string(), dir.path())
        .unwrap_or_else(|e| panic!("{} {:?}: {e}", node.site, node.collectors));
    let agent = Agent::new(config)
        .unwrap()
        .start()
        .await
        .expect("agent starts");
    let addr = agent.metrics_addr().expect("a metrics listener");
    let plugins = agent_plugins(dir.path());
    let started = Instant::now();
    eprintln!("{} {:?}: started", node.site, node.collectors);
    let mut second_round = false;
    loop {
        let calls = collect_calls(addr).await;
        let least = plugins
            .iter()
            .map(|p| calls.get(p).copied().unwrap_or(0))
            .min()
            .unwrap_or(0);
        if least >= 1 && !second_round {
            // The counters move on, so rates and differences are of a real interval.
            record_round(&root, 2);
            second_round = true;
        }
        // One round more than needed, so the last needed round's batch is flushed.
        if least > ROUNDS {
            break;
        }
        assert!(
            started.elapsed() < WAIT,
            "{} {:?}: plugins did not reach {ROUNDS} rounds: {calls:?}",
            node.site,
            node.collectors
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    agent.shutdown().await.expect("clean shutdown");
    problems(node, &store.points())
}

/// The plugin names of the converted configuration.
fn agent_plugins(dir: &Path) -> Vec<String> {
    let config: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("converted.json")).unwrap())
            .unwrap();
    config["plugins"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_fau_node_type_sends_what_its_job_view_needs() {
    let cache = tempfile::tempdir().unwrap();
    let mut report = Vec::new();
    for node in NODE_TYPES {
        let problems = run(node, cache.path()).await;
        if !problems.is_empty() {
            report.push(format!(
                "{} {} ({}):\n  {}",
                node.site,
                node.collectors.unwrap_or("collectors.json"),
                node.subcluster,
                problems.join("\n  ")
            ));
        }
    }
    assert!(report.is_empty(), "{}", report.join("\n"));
}
