//! The agent's `self` collector: with a `"self"` section the agent sends its own figures
//! (cc-metric-collector's `self` names) into its sinks beside the plugins' points. Real
//! peers: the project's fleet server, a local server implementing cc-metric-store's write
//! API, and the `loadavg` plugin built from source.

#[path = "support/guests.rs"]
mod guests;
#[path = "support/store.rs"]
mod store;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use ccfleet::server::{RunningServer, ServerConfig};
use ccfleet_host::agent::{Agent, AgentConfig};
use serde_json::json;
use store::{Store, StoredPoint};

const WAIT: Duration = Duration::from_secs(60);

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

const NAMES: [&str; 17] = [
    "mem_rss",
    "mem_rss_peak",
    "mem_anon",
    "mem_file",
    "num_goroutines",
    "num_cgo_calls",
    "rusage_user_time",
    "rusage_system_time",
    "rusage_vol_ctx_switch",
    "rusage_invol_ctx_switch",
    "rusage_signals",
    "rusage_major_pgfaults",
    "rusage_minor_pgfaults",
    "points_emitted",
    "points_dropped",
    "points_sent",
    "sink_queue",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn self_sends_the_agents_own_figures_beside_the_plugins_points() {
    let dir = tempfile::tempdir().unwrap();
    let server = fleet_server(dir.path()).await;
    let store = Store::start(None).await;
    let fixtures = dir.path().join("fixtures");
    std::fs::create_dir_all(fixtures.join("proc")).unwrap();
    std::fs::write(fixtures.join("proc/loadavg"), "0.25 0.50 1.75 2/311 4242\n").unwrap();
    let config = json!({
        "service-type": "ccmc",
        "fleet": {"url": server.base_url(), "cluster": "fritz", "hostname": "node01",
                  "config-poll-interval": "1h"},
        "plugin-cache-dir": dir.path().join("compiled"),
        "sinks": {"store": {"type": "http", "url": store.url(), "batch-size": 20,
                            "flush-delay": "20ms"}},
        "self": {"interval": "50ms", "read_mem_stats": true, "read_goroutines": true,
                 "read_cgo_calls": true, "read_rusage": true, "read_agent_stats": true},
        "plugins": [{
            "path": guests::component("loadavg"),
            "config": {"cluster": "fritz", "hostname": "node01"},
            "collect-interval": "20ms",
            "capabilities": {"read-files": ["/proc/loadavg"], "files-root": fixtures}
        }]
    });
    let config = AgentConfig::from_json(&config.to_string(), dir.path()).unwrap();
    let agent = Agent::new(config)
        .unwrap()
        .start()
        .await
        .expect("agent starts");
    let stats = agent.plugins()[0].stats();

    // Three rounds of figures in which the plugin has been called and has emitted.
    let rounds = |points: &[StoredPoint]| {
        points
            .iter()
            .filter(|p| p.measurement == "points_emitted" && p.value > 0.0)
            .count()
    };
    tokio::time::timeout(WAIT, async {
        while rounds(&store.points()) < 3 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("three rounds of self figures reach the store");
    agent.shutdown().await.expect("clean shutdown");
    let after = stats.snapshot();

    let points = store.points();
    let mut by_time: BTreeMap<i64, BTreeMap<String, f64>> = BTreeMap::new();
    for p in points
        .iter()
        .filter(|p| NAMES.contains(&p.measurement.as_str()))
    {
        let mut tags: BTreeMap<&str, &str> = p
            .tags
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let unit = tags.remove("unit");
        let expected_unit = match p.measurement.as_str() {
            name if name.starts_with("mem_") => Some("Bytes"),
            "rusage_user_time" | "rusage_system_time" => Some("seconds"),
            _ => None,
        };
        assert_eq!(unit, expected_unit, "{}", p.measurement);
        assert_eq!(
            tags,
            BTreeMap::from([
                ("cluster", "fritz"),
                ("hostname", "node01"),
                ("type", "node")
            ]),
            "{}",
            p.measurement
        );
        let round = by_time.entry(p.time.expect("a timestamp")).or_default();
        assert!(
            round.insert(p.measurement.clone(), p.value).is_none(),
            "{} twice in one round",
            p.measurement
        );
    }
    assert!(by_time.len() >= 3);
    let all: BTreeSet<&str> = NAMES.into_iter().collect();
    let mut previous: Option<&BTreeMap<String, f64>> = None;
    for (time, round) in &by_time {
        let names: BTreeSet<&str> = round.keys().map(String::as_str).collect();
        assert_eq!(names, all, "every figure at {time}");
        // Figures of this very process, read at once: the parts within the whole. (The
        // kernel folds the resident size into its high-water mark only now and then, so a
        // peak read later by the test need not bound these.)
        assert!(round["mem_rss"] > 0.0 && round["mem_rss"] <= round["mem_rss_peak"]);
        assert!(round["mem_anon"] + round["mem_file"] <= round["mem_rss"] + 4096.0 * 64.0);
        assert!(round["num_goroutines"] >= 1.0);
        // Counters of the plugin: never beyond what it counts after shutdown.
        assert!(
            round["num_cgo_calls"] <= after.calls.iter().map(|c| c.count()).sum::<u64>() as f64
        );
        assert!(round["points_emitted"] <= after.points_emitted as f64);
        assert_eq!(round["points_emitted"] % 5.0, 0.0, "whole loadavg rounds");
        assert_eq!(round["points_dropped"], 0.0);
        assert!(round["points_sent"] <= round["points_emitted"] + 17.0 * by_time.len() as f64);
        if let Some(before) = previous {
            for counter in [
                "num_cgo_calls",
                "points_emitted",
                "points_sent",
                "rusage_user_time",
                "rusage_minor_pgfaults",
            ] {
                assert!(
                    round[counter] >= before[counter],
                    "{counter} went back at {time}"
                );
            }
        }
        previous = Some(round);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_self_key_is_refused_with_its_name() {
    let config = json!({
        "fleet": {"url": "http://127.0.0.1:1"},
        "self": {"read_memstats": true}
    });
    let Err(error) = AgentConfig::from_json(&config.to_string(), Path::new("/")) else {
        panic!("refused")
    };
    assert!(error.to_string().contains("read_memstats"), "{error}");
}
