//! The agent's `router` key end to end: the agent's own `self` figures pass a rule set on
//! their way to a real HTTP sink (a local server implementing cc-metric-store's
//! `/api/write`), and the store holds exactly the routed points, the interval's aggregate
//! among them; reading the configuration refuses a bad rule, naming it.

#[path = "support/store.rs"]
mod store;

use std::path::Path;
use std::time::Duration;

use ccfleet::server::{RunningServer, ServerConfig};
use ccfleet_host::agent::{Agent, AgentConfig};
use serde_json::{Value as Json, json};
use store::Store;

const WAIT: Duration = Duration::from_secs(60);
const INTERVAL_NS: i64 = 200_000_000;

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

fn config(server_url: &str, dir: &Path, store_url: &str, router: Json) -> Json {
    json!({
        "service-type": "ccmc",
        "fleet": {"url": server_url, "cluster": "fritz", "hostname": "node01",
                  "config-poll-interval": "1h"},
        "plugin-cache-dir": dir.join("compiled"),
        "sinks": {"store": {"type": "http", "url": store_url, "batch-size": 20,
                            "flush-delay": "20ms"}},
        "self": {"interval": "50ms", "read_goroutines": true, "read_rusage": true},
        "metrics-addr": "127.0.0.1:0",
        "router": router
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agents_points_are_tagged_dropped_renamed_stamped_and_aggregated() {
    let dir = tempfile::tempdir().unwrap();
    let server = fleet_server(dir.path()).await;
    let store = Store::start(None).await;
    let router = json!({
        "interval": "200ms",
        "interval_timestamp": true,
        "num_cache_intervals": 1,
        "interval_aggregates": [{
            "name": "rusage_cpu_time",
            "if": "name in ['rusage_user_time', 'rusage_system_time']",
            "function": "sum(values)",
            "tags": {"type": "node", "unit": "<copy>"}
        }],
        // Renaming runs after the tag stages: conditions name the collector's name.
        "rename_metrics": {"num_goroutines": "agent_tasks"},
        "drop_metrics_if": ["name startsWith 'rusage_' && name endsWith '_ctx_switch'"],
        "normalize_units": true,
        "process_messages": {
            "add_tags_if": [{"if": "name == 'num_goroutines' && value > 0", "key": "level", "value": "busy"}],
            "delete_tags_if": [{"if": "true", "key": "cluster"}]
        }
    });
    let config = config(&server.base_url(), dir.path(), &store.url(), router);
    let config = AgentConfig::from_json(&config.to_string(), dir.path()).unwrap();
    let agent = Agent::new(config)
        .unwrap()
        .start()
        .await
        .expect("agent starts");
    let has = |name: &str| store.points().iter().any(|p| p.measurement == name);
    tokio::time::timeout(WAIT, async {
        while !(has("rusage_cpu_time") && has("agent_tasks") && has("rusage_user_time")) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the store receives routed points and the aggregate");
    let addr = agent.metrics_addr().expect("a metrics listener");
    let metrics = reqwest::get(format!("http://{addr}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    agent.shutdown().await.expect("clean shutdown");
    let counted = |result: &str| -> u64 {
        let series = format!("ccfleet_agent_router_points_total{{result=\"{result}\"}} ");
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(series.as_str()))
            .unwrap_or_else(|| panic!("{series} in {metrics}"))
            .parse()
            .unwrap()
    };
    // Each round of the self collector has two context-switch points to drop.
    assert!(counted("in") > counted("dropped"), "{metrics}");
    assert!(counted("dropped") >= 2, "{metrics}");
    assert!(counted("aggregated") >= 1, "{metrics}");
    assert_eq!(counted("failed"), 0, "{metrics}");

    let points = store.points();
    for p in &points {
        let mut tags = p.tags.clone();
        tags.sort();
        let tag = |k: &str| {
            tags.iter()
                .find(|(key, _)| key == k)
                .map(|(_, v)| v.as_str())
        };
        assert_eq!(tag("hostname"), Some("node01"), "{p:?}");
        assert_eq!(tag("type"), Some("node"), "{p:?}");
        assert_eq!(tag("cluster"), None, "{p:?}");
        let time = p.time.expect("a time stamp");
        assert_eq!(time % INTERVAL_NS, 0, "interval start: {p:?}");
        match p.measurement.as_str() {
            "agent_tasks" => {
                assert_eq!(tag("level"), Some("busy"), "{p:?}");
                assert!(p.value >= 1.0, "{p:?}");
            }
            "rusage_user_time" | "rusage_system_time" | "rusage_cpu_time" => {
                assert_eq!(tag("unit"), Some("s"), "normalized from seconds: {p:?}");
                assert!(p.value >= 0.0, "{p:?}");
            }
            "rusage_signals" | "rusage_major_pgfaults" | "rusage_minor_pgfaults" => {}
            other => panic!("{other} should not reach the store: {p:?}"),
        }
    }
    // The aggregate of an interval is the sum of that interval's two times.
    let at = |name: &str, time: i64| {
        points
            .iter()
            .filter(|p| p.measurement == name && p.time == Some(time))
            .map(|p| p.value)
            .collect::<Vec<f64>>()
    };
    let mut checked = 0;
    for agg in points.iter().filter(|p| p.measurement == "rusage_cpu_time") {
        let time = agg.time.unwrap();
        let sum: f64 = at("rusage_user_time", time)
            .into_iter()
            .chain(at("rusage_system_time", time))
            .sum();
        assert!((agg.value - sum).abs() < 1e-6, "{agg:?}: {sum}");
        checked += 1;
    }
    assert!(checked > 0);
}

fn config_error(router: Json) -> String {
    let router_text = router.to_string();
    let dir = tempfile::tempdir().unwrap();
    let config = config(
        "http://127.0.0.1:1",
        dir.path(),
        "http://127.0.0.1:2/api/write",
        router,
    );
    match AgentConfig::from_json(&config.to_string(), dir.path()) {
        Ok(_) => panic!("{router_text} was accepted"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn a_bad_rule_is_refused_when_the_configuration_is_read_naming_key_and_problem() {
    for (router, key, problem) in [
        (
            json!({"process_messages": {"drop_messages_if": ["name == 'a'", "value ** 2 > 1"]}}),
            "router.process_messages.drop_messages_if[1]",
            "\"**\"",
        ),
        (
            json!({"process_messages": {"drop_messages": 5}}),
            "router.process_messages.drop_messages",
            "sequence",
        ),
        (
            json!({"add_tag": [{"key": "a", "value": "b", "if": "true"}]}),
            "router",
            "add_tag",
        ),
        (
            json!({"interval_aggregates": [{"name": "x", "if": "true", "function": "avg(values)"}]}),
            "router.interval_aggregates",
            "num_cache_intervals",
        ),
        (
            json!({"num_cache_intervals": 1, "interval_aggregates": [{"name": "x", "if": "true", "function": "avg(values) ?? 0"}]}),
            "router.interval_aggregates[0].function",
            "\"??\"",
        ),
        (
            json!({"process_messages": {"stage_order": ["rename", "shuffle"]}}),
            "router.process_messages.stage_order[1]",
            "shuffle",
        ),
        (
            json!({"change_unit_prefix": {"mem_used": "X"}}),
            "router.change_unit_prefix[\"mem_used\"]",
            "not a unit prefix",
        ),
        (
            json!({"interval": "fast"}),
            "router.interval",
            "not a duration",
        ),
    ] {
        let err = config_error(router.clone());
        assert!(
            err.contains(key) && err.contains(problem),
            "{router}: {err}"
        );
    }
}
