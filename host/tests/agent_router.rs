//! The agent's `router` key end to end: a plugin's points pass a rule set on their way to a
//! real HTTP sink (a local server implementing cc-metric-store's `/api/write`), and the
//! store holds exactly the routed points; `--check-config`'s parse refuses a bad rule,
//! naming it.

#[path = "support/guests.rs"]
mod guests;
#[path = "support/store.rs"]
mod store;

use std::path::Path;
use std::time::Duration;

use ccfleet::server::{RunningServer, ServerConfig};
use ccfleet_host::agent::{Agent, AgentConfig};
use serde_json::{Value as Json, json};
use store::Store;

const WAIT: Duration = Duration::from_secs(60);
const LOADAVG: &str = "0.25 0.50 1.75 2/311 4242\n";

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
    let fixtures = dir.join("fixtures");
    std::fs::create_dir_all(fixtures.join("proc")).unwrap();
    std::fs::write(fixtures.join("proc").join("loadavg"), LOADAVG).unwrap();
    json!({
        "service-type": "ccmc",
        "fleet": {"url": server_url, "cluster": "fritz", "hostname": "node01",
                  "config-poll-interval": "1h"},
        "plugin-cache-dir": dir.join("compiled"),
        "sinks": {"store": {"type": "http", "url": store_url, "batch-size": 3,
                            "flush-delay": "50ms"}},
        "router": router,
        "plugins": [{
            "path": guests::component("loadavg"),
            "config": {"cluster": "fritz", "hostname": "node01",
                       "exclude_metrics": ["proc_run", "proc_total"]},
            "collect-interval": "20ms",
            "capabilities": {"read-files": ["/proc/loadavg"], "files-root": fixtures}
        }]
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugins_points_are_renamed_tagged_and_dropped_on_their_way_to_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let server = fleet_server(dir.path()).await;
    let store = Store::start(None).await;
    let router = json!({
        // Renaming runs after the tag stages: conditions name the plugin's name.
        "rename_metrics": {"load_one": "cpu_load"},
        "drop_metrics_if": ["name == 'load_fifteen'"],
        "process_messages": {
            "add_tags_if": [{"if": "name == 'load_one' && value < 1", "key": "level", "value": "low"}],
            "delete_tags_if": [{"if": "true", "key": "cluster"}]
        }
    });
    let config = config(&server.base_url(), dir.path(), &store.url(), router);
    let config = AgentConfig::from_json(&config.to_string(), dir.path()).unwrap();
    let agent = Agent::new(config).unwrap().start().await.expect("agent starts");
    tokio::time::timeout(WAIT, async {
        while store.points().len() < 20 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the store receives routed points");
    agent.shutdown().await.expect("clean shutdown");

    let points = store.points();
    let mut by_name = std::collections::BTreeMap::<String, usize>::new();
    for p in &points {
        *by_name.entry(p.measurement.clone()).or_default() += 1;
        let mut tags = p.tags.clone();
        tags.sort();
        let (want_tags, want_value): (Vec<(&str, &str)>, f64) = match p.measurement.as_str() {
            "cpu_load" => (
                vec![("hostname", "node01"), ("level", "low"), ("type", "node")],
                0.25,
            ),
            "load_five" => (vec![("hostname", "node01"), ("type", "node")], 0.5),
            other => panic!("{other} should not reach the store"),
        };
        let want_tags: Vec<(String, String)> = want_tags
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        assert_eq!(tags, want_tags, "{}", p.measurement);
        assert_eq!(p.value, want_value, "{}", p.measurement);
    }
    // Whole rounds: each round's two surviving points arrive together.
    assert_eq!(by_name.get("cpu_load"), by_name.get("load_five"));
}

#[test]
fn a_bad_rule_is_refused_when_the_configuration_is_read() {
    let dir = tempfile::tempdir().unwrap();
    let router = json!({"process_messages": {"drop_messages_if": ["name == 'a'", "value ** 2 > 1"]}});
    let config = config("http://127.0.0.1:1", dir.path(), "http://127.0.0.1:2/api/write", router);
    let err = AgentConfig::from_json(&config.to_string(), dir.path())
        .err()
        .expect("refused")
        .to_string();
    assert!(
        err.contains("router.process_messages.drop_messages_if[1]") && err.contains("\"**\""),
        "{err}"
    );
}
